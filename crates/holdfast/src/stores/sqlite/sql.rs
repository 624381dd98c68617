//! The SQLite statements, each run inside one short transaction.
//!
//! Expiry is in milliseconds of the host's wall clock, which every process on
//! the host shares. Fences come from one counter row for the whole file, so
//! they are strictly increasing per key (and globally) across releases,
//! expiries and restarts, and lease rows can be deleted on release without
//! losing the count.
//!
//! A key has one row per held lease and per waiting request's reservation
//! (see [`LeaseMode`]); [`admission::decide`] says what an acquire does with
//! them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::session::{self, SessionBook, live_until};
use crate::backend::LeaseMode;
use crate::backend::admission::{self, Decision, Row, Shrink};
use crate::vocabulary::key::OwnerToken;

/// Milliseconds since the Unix epoch on the host clock.
pub(super) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn ttl_ms(ttl: Duration) -> i64 {
    ttl.as_millis() as i64
}

/// The outcome of one acquire transaction.
pub(super) enum Acquired {
    /// Granted, held for `left_ms` from when the transaction read the
    /// clock (until the session's expiry: the TTL, or at least two thirds
    /// of it).
    Granted {
        fence: u64,
        left_ms: i64,
    },
    Busy {
        expires_in: Duration,
    },
    Conflict(String),
}

/// What an acquire reads of a key: its live rows, the soonest end among its
/// held leases, and its held rows whose session lapsed (token, session),
/// which a grant deletes (see [`session`](super::session)).
struct KeyRows {
    live: Vec<Row>,
    soonest: Option<i64>,
    lapsed: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Reads every row of `key` (see [`KeyRows`]).
fn rows(conn: &Connection, key: &str, now: i64) -> rusqlite::Result<KeyRows> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT token, mode, weight, limit_n, held, fence, session, ",
        live_until!(),
        " FROM holdfast_grants WHERE key = ?1"
    ))?;
    let mut out = KeyRows { live: Vec::new(), soonest: None, lapsed: Vec::new() };
    let mut q = stmt.query(params![key])?;
    while let Some(r) = q.next()? {
        let token: Vec<u8> = r.get(0)?;
        let held: bool = r.get(4)?;
        let until: i64 = r.get(7)?;
        if until <= now {
            if let (true, Some(session)) = (held, r.get::<_, Option<Vec<u8>>>(6)?) {
                out.lapsed.push((token, session));
            }
            continue;
        }
        if held {
            out.soonest = Some(out.soonest.map_or(until, |s| s.min(until)));
        }
        out.live.push(Row {
            token: token.try_into().unwrap_or([0; 16]),
            mode: admission::decode(r.get(1)?, r.get(2)?, r.get(3)?),
            held,
            order: r.get::<_, i64>(5)? as u64,
        });
    }
    Ok(out)
}

fn busy(soonest: Option<i64>, now: i64) -> Acquired {
    // Only reservations in the way: try again within a poll.
    Acquired::Busy { expires_in: Duration::from_millis(soonest.map_or(0, |e| (e - now).max(0)) as u64) }
}

/// Decides without the write lock; `Some(outcome)` if the attempt can stop
/// here: busy, with this request's reservation (if its mode keeps one) fresh
/// for more than half the TTL. `None` if a transaction must follow.
pub(super) fn peek(
    conn: &Connection,
    key: &str,
    token: OwnerToken,
    mode: LeaseMode,
    ttl: Duration,
) -> rusqlite::Result<Option<Acquired>> {
    let now = now_ms();
    let KeyRows { live, soonest, .. } = rows(conn, key, now)?;
    Ok(match admission::decide(token.to_bytes(), mode, &live) {
        Decision::Refuse { reserve: false, .. } => Some(busy(soonest, now)),
        Decision::Refuse { reserve: true, keep_order: Some(_) } => {
            // A reservation has no session: its own expiry.
            let until: Option<i64> = conn
                .prepare_cached("SELECT until_ms FROM holdfast_grants WHERE key = ?1 AND token = ?2")?
                .query_row(params![key, token.to_bytes()], |r| r.get(0))
                .optional()?;
            until.filter(|u| *u > now + ttl_ms(ttl) / 2).map(|_| busy(soonest, now))
        }
        _ => None,
    })
}

/// One `BEGIN IMMEDIATE` transaction: grant `key` to `token` in `mode` if the
/// admission rule allows it, with a fence of at least `floor`, living with
/// the client's session for `ttl`; if not and `reserve`, leave (or refresh)
/// the request's reservation.
#[allow(clippy::too_many_arguments)]
pub(super) fn acquire(
    conn: &mut Connection,
    book: &mut SessionBook,
    key: &str,
    token: OwnerToken,
    mode: LeaseMode,
    ttl: Duration,
    label: &str,
    reserve: bool,
    floor: i64,
) -> rusqlite::Result<Acquired> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let KeyRows { live, soonest, lapsed } = rows(&tx, key, now)?;
    let until = now + ttl_ms(ttl);
    let (code, weight, limit) = admission::encode(mode);
    let (outcome, bound) = match admission::decide(token.to_bytes(), mode, &live) {
        Decision::AlreadyHeld { fence } => {
            // A retry of an attempt that already succeeded (its reply was
            // lost): the same grant, living with the session, which is
            // live for at least two thirds of the TTL from now.
            let session = session::bind(&tx, book, ttl_ms(ttl), now)?;
            tx.prepare_cached("UPDATE holdfast_grants SET session = ?3, until_ms = ?4 WHERE key = ?1 AND token = ?2")?
                .execute(params![key, token.to_bytes(), session.id(), until])?;
            (Acquired::Granted { fence, left_ms: session.expires() - now }, Some(session))
        }
        Decision::Grant => {
            // Held rows whose session lapsed go, each counted in its
            // session: a clock stepped back could make it look live again.
            for (their_token, their_session) in &lapsed {
                tx.prepare_cached("DELETE FROM holdfast_grants WHERE key = ?1 AND token = ?2")?
                    .execute(params![key, their_token])?;
                session::count_removal(&tx, their_session)?;
            }
            let session = session::bind(&tx, book, ttl_ms(ttl), now)?;
            let fence = next_fence_from(&tx, floor)?;
            tx.prepare_cached(
                "INSERT OR REPLACE INTO holdfast_grants
                   (key, token, mode, weight, limit_n, held, fence, label, acquired_at_ms, until_ms, session)
                 VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7, ?8, ?9, ?10)",
            )?
            .execute(params![
                key,
                token.to_bytes(),
                code,
                weight,
                limit,
                fence,
                label,
                now,
                until,
                session.id()
            ])?;
            (Acquired::Granted { fence: fence as u64, left_ms: session.expires() - now }, Some(session))
        }
        Decision::Refuse { reserve: true, keep_order } if reserve => {
            let order = match keep_order {
                Some(order) => order as i64,
                None => next_fence(&tx)?,
            };
            tx.prepare_cached(
                "INSERT OR REPLACE INTO holdfast_grants
                   (key, token, mode, weight, limit_n, held, fence, label, acquired_at_ms, until_ms, session)
                 VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?7, ?8, ?9, NULL)",
            )?
            .execute(params![key, token.to_bytes(), code, weight, limit, order, label, now, until])?;
            (busy(soonest, now), None)
        }
        Decision::Refuse { .. } => return Ok(busy(soonest, now)),
        Decision::Conflict(reason) => return Ok(Acquired::Conflict(reason)),
    };
    tx.commit()?;
    if let Some(session) = bound {
        book.granted(ttl_ms(ttl), session, token);
    }
    Ok(outcome)
}

fn next_fence(tx: &Connection) -> rusqlite::Result<i64> {
    tx.prepare_cached("UPDATE holdfast_fence SET value = value + 1 WHERE id = 0 RETURNING value")?
        .query_row([], |r| r.get(0))
}

/// The next fence, at least `floor` (a request's fence floor; 0: none): the
/// counter becomes it, so later fences are above it.
fn next_fence_from(tx: &Connection, floor: i64) -> rusqlite::Result<i64> {
    if floor == 0 {
        return next_fence(tx);
    }
    tx.prepare_cached("UPDATE holdfast_fence SET value = max(value + 1, ?1) WHERE id = 0 RETURNING value")?
        .query_row([floor], |r| r.get(0))
}

/// Rows of holders that died this long ago are swept.
pub(super) const SWEEP_AFTER_MS: i64 = 60_000;

/// Rows one sweep deletes at most: a short statement, and at one sweep a
/// second per client (see [`release`]) far more than crashed holders leave.
const SWEEP_ROWS: i64 = 256;

/// Deletes the grant or reservation of `token`; true if it held a live
/// lease. With `sweep`, also deletes rows of holders that died long ago
/// (rows without a session by their own expiry, and one lapsed session's),
/// so the tables stay small (the caller sweeps about once a second: in
/// every release it cost a statement, a seventh of an uncontended cycle).
pub(super) fn release(
    conn: &mut Connection,
    book: &mut SessionBook,
    key: &str,
    token: OwnerToken,
    sweep: bool,
) -> rusqlite::Result<bool> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let gone: Option<(i64, bool, Option<Vec<u8>>)> = tx
        .prepare_cached("DELETE FROM holdfast_grants WHERE key = ?1 AND token = ?2 RETURNING until_ms, held, session")?
        .query_row(params![key, token.to_bytes()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    // A release by another client that knows the token (an admin tool, a
    // second connection) is a removal the holder's client must hear of.
    if let Some((_, true, Some(session))) = &gone
        && !book.owns(token, session)
    {
        session::count_removal(&tx, session)?;
    }
    let live = match &gone {
        // This client's own session: it knows the expiry.
        Some((_, true, Some(session))) if book.owns(token, session) => book.expiry_of(session).is_some_and(|e| e > now),
        Some((_, true, Some(session))) => tx
            .prepare_cached("SELECT expires_at_ms FROM holdfast_sessions WHERE id = ?1")?
            .query_row(params![session], |r| r.get::<_, i64>(0))
            .optional()?
            .is_some_and(|e| e > now),
        Some((until, held, None)) => *held && *until > now,
        _ => false,
    };
    if sweep {
        let cut = now - SWEEP_AFTER_MS;
        tx.prepare_cached(
            "DELETE FROM holdfast_grants WHERE (key, token) IN
               (SELECT key, token FROM holdfast_grants WHERE session IS NULL AND until_ms < ?1 LIMIT ?2)",
        )?
        .execute(params![cut, SWEEP_ROWS])?;
        session::sweep(&tx, cut, SWEEP_ROWS)?;
    }
    tx.commit()?;
    book.released(token);
    Ok(live)
}

/// Reads the key's unexpired leases: (mode, label, fence, ms left).
pub(super) fn status(conn: &Connection, key: &str) -> rusqlite::Result<Vec<(LeaseMode, String, u64, i64)>> {
    let now = now_ms();
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT * FROM (SELECT mode, weight, limit_n, label, fence, ",
        live_until!(),
        " AS live FROM holdfast_grants WHERE key = ?1 AND held = 1) WHERE live > ?2 ORDER BY fence"
    ))?;
    let mut out = Vec::new();
    let mut q = stmt.query(params![key, now])?;
    while let Some(r) = q.next()? {
        let mode = admission::decode(r.get(0)?, r.get(1)?, r.get(2)?);
        out.push((mode, r.get(3)?, r.get::<_, i64>(4)? as u64, r.get::<_, i64>(5)? - now));
    }
    Ok(out)
}

/// Records `limit` with the key's unexpired shared leases and reservations;
/// returns the weight held.
pub(super) fn resize(conn: &mut Connection, key: &str, limit: u32) -> rusqlite::Result<u64> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    tx.prepare_cached(concat!(
        "UPDATE holdfast_grants SET limit_n = ?2 WHERE key = ?1 AND mode = ?3 AND ",
        live_until!(),
        " > ?4"
    ))?
    .execute(params![key, i64::from(limit), admission::MODE_SHARED, now])?;
    let held: i64 = tx
        .prepare_cached(concat!(
            "SELECT COALESCE(SUM(weight), 0) FROM holdfast_grants WHERE key = ?1 AND mode = ?2 AND held = 1 AND ",
            live_until!(),
            " > ?3"
        ))?
        .query_row(params![key, admission::MODE_SHARED, now], |r| r.get(0))?;
    tx.commit()?;
    Ok(held as u64)
}

/// One `BEGIN IMMEDIATE` transaction: `token`'s unexpired held lease of
/// `key` takes the smaller mode `to` (see [`admission::shrunk`]); its
/// fence and expiry stay.
pub(super) fn shrink(conn: &mut Connection, key: &str, token: OwnerToken, to: LeaseMode) -> rusqlite::Result<Shrink> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let held: Option<(i64, i64, i64)> = tx
        .prepare_cached(concat!(
            "SELECT mode, weight, limit_n FROM holdfast_grants WHERE key = ?1 AND token = ?2 AND held = 1 AND ",
            live_until!(),
            " > ?3"
        ))?
        .query_row(params![key, token.to_bytes(), now_ms()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((code, weight, limit)) = held else { return Ok(Shrink::NotHeld) };
    let smaller = match admission::shrunk(admission::decode(code, weight, limit), to) {
        Ok(mode) => mode,
        Err(reason) => return Ok(Shrink::NotSmaller(reason)),
    };
    let (code, weight, limit) = admission::encode(smaller);
    tx.prepare_cached("UPDATE holdfast_grants SET mode = ?3, weight = ?4, limit_n = ?5 WHERE key = ?1 AND token = ?2")?
        .execute(params![key, token.to_bytes(), code, weight, limit])?;
    tx.commit()?;
    Ok(Shrink::Shrunk)
}

/// The highest fence floor [`raise_fence`] takes: 2^62, so that the file's
/// counter (a signed 64-bit INTEGER, shared by every key) keeps 2^62 fences
/// above any floor and can never overflow. Real floors are fences of other
/// stores (a Redis fence, microseconds since 1970, reaches 2^62 in the year
/// 148,000).
pub(super) const MAX_FENCE_FLOOR: u64 = 1 << 62;

/// One `BEGIN IMMEDIATE` transaction: if `token` holds an unexpired lease of
/// `key` (exclusive or shared, not a reservation), the file's fence counter
/// raised to `floor` if it is lower (never lowered), so every later grant of
/// any key gets a fence above `floor`; whether it held (a token that holds
/// nothing raises nothing). The caller checked `floor` against
/// [`MAX_FENCE_FLOOR`].
pub(super) fn raise_fence(conn: &mut Connection, key: &str, token: OwnerToken, floor: i64) -> rusqlite::Result<bool> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let held: bool = tx
        .prepare_cached(concat!(
            "SELECT EXISTS (SELECT 1 FROM holdfast_grants WHERE key = ?1 AND token = ?2 AND held = 1 AND ",
            live_until!(),
            " > ?3)"
        ))?
        .query_row(params![key, token.to_bytes(), now_ms()], |r| r.get(0))?;
    if held {
        // value = max(value, floor), without writing the page when it is a no-op.
        tx.prepare_cached("UPDATE holdfast_fence SET value = ?1 WHERE id = 0 AND value < ?1")?
            .execute(params![floor])?;
    }
    tx.commit()?;
    Ok(held)
}

/// The record kept with `key`, if one was written (the `u64` is stored in
/// the signed column bit for bit).
pub(super) fn read_record(conn: &Connection, key: &str) -> rusqlite::Result<Option<u64>> {
    let value: Option<i64> = conn
        .prepare_cached("SELECT value FROM holdfast_records WHERE key = ?1")?
        .query_row(params![key], |r| r.get(0))
        .optional()?;
    Ok(value.map(|v| v as u64))
}

/// One `BEGIN IMMEDIATE` transaction: if `token` holds an unexpired
/// exclusive lease of `key` (exclusive or writer, not a share or a
/// reservation), the record kept with `key` set to `value`; whether it held.
pub(super) fn write_record(conn: &mut Connection, key: &str, token: OwnerToken, value: u64) -> rusqlite::Result<bool> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let held: bool = tx
        .prepare_cached(concat!(
            "SELECT EXISTS (SELECT 1 FROM holdfast_grants
                             WHERE key = ?1 AND token = ?2 AND held = 1 AND mode <> ?3 AND ",
            live_until!(),
            " > ?4)"
        ))?
        .query_row(params![key, token.to_bytes(), admission::MODE_SHARED, now_ms()], |r| r.get(0))?;
    if held {
        tx.prepare_cached("INSERT INTO holdfast_records (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value")?
            .execute(params![key, value as i64])?;
    }
    tx.commit()?;
    Ok(held)
}

/// Replaces the label of `token`'s unexpired grant; true if there was one.
pub(super) fn relabel(conn: &mut Connection, key: &str, token: OwnerToken, label: &str) -> rusqlite::Result<bool> {
    let changed = conn
        .prepare_cached(concat!(
            "UPDATE holdfast_grants SET label = ?3 WHERE key = ?1 AND token = ?2 AND held = 1 AND ",
            live_until!(),
            " > ?4"
        ))?
        .execute(params![key, token.to_bytes(), label, now_ms()])?;
    Ok(changed == 1)
}

/// One held lease as [`list`] reads it: (key, mode, label, fence, ms left).
pub(super) type Listed = (String, LeaseMode, String, u64, i64);

/// The unexpired held leases of every key from `prefix` on, in key order,
/// stopping at the first key outside the prefix (the primary key's order,
/// so the read is O(leases under the prefix)).
pub(super) fn list(conn: &Connection, prefix: &str) -> rusqlite::Result<Vec<Listed>> {
    let now = now_ms();
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT * FROM (SELECT key, mode, weight, limit_n, label, fence, ",
        live_until!(),
        " AS live FROM holdfast_grants WHERE key >= ?1 AND held = 1) WHERE live > ?2 ORDER BY key, fence"
    ))?;
    let mut out = Vec::new();
    let mut q = stmt.query(params![prefix, now])?;
    while let Some(r) = q.next()? {
        let key: String = r.get(0)?;
        if !key.starts_with(prefix) {
            break;
        }
        let expires: i64 = r.get(6)?;
        let mode = admission::decode(r.get(1)?, r.get(2)?, r.get(3)?);
        out.push((key, mode, r.get(4)?, r.get::<_, i64>(5)? as u64, expires - now));
    }
    Ok(out)
}

/// One `BEGIN IMMEDIATE` transaction: deletes every held lease of `key`
/// whatever its token (reservations stay); the removed live leases' (mode,
/// fence). Each removal is counted in the lease's session, so its holder
/// hears of it at its next renewal. Fences come from the file's counter,
/// which a delete never lowers, so the next grant's fence is above every
/// removed one.
pub(super) fn force_release(conn: &mut Connection, key: &str) -> rusqlite::Result<Vec<(LeaseMode, u64)>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let mut removed = Vec::new();
    {
        let mut stmt = tx.prepare_cached(concat!(
            "SELECT token, mode, weight, limit_n, fence, session, ",
            live_until!(),
            " FROM holdfast_grants WHERE key = ?1 AND held = 1"
        ))?;
        let mut q = stmt.query(params![key])?;
        let mut rows = Vec::new();
        while let Some(r) = q.next()? {
            let mode = admission::decode(r.get(1)?, r.get(2)?, r.get(3)?);
            let (token, fence, session, until): (Vec<u8>, i64, Option<Vec<u8>>, i64) =
                (r.get(0)?, r.get(4)?, r.get(5)?, r.get(6)?);
            rows.push((token, mode, fence, session, until));
        }
        for (token, mode, fence, session, until) in rows {
            tx.prepare_cached("DELETE FROM holdfast_grants WHERE key = ?1 AND token = ?2")?
                .execute(params![key, token])?;
            if let Some(session) = session {
                session::count_removal(&tx, &session)?;
            }
            if until > now {
                removed.push((mode, fence as u64));
            }
        }
    }
    tx.commit()?;
    Ok(removed)
}
