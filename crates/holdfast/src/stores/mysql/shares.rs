//! Shared leases (writers, semaphore permits, readers) on MySQL/MariaDB.
//!
//! The mutex keeps its statements on the lease table. Shares and
//! reservations live in `<namespace>_shares`, one row per (key, token), and
//! the key's lease row is their **gate**: while shares are held it carries
//! the token [`GATE`] (drawn by no client) and an expiry no earlier than any
//! held share's, so the mutex's statements see the key as held without
//! reading the shares table.
//!
//! A shared grant, a share's release and a renewal lock the key's lease row
//! first (`gate`, `lock_row`, `lock_gate`: `SELECT .. FOR UPDATE`), then its
//! shares, so grants and gate changes of a key never interleave and never
//! deadlock; the mutex's grant of a key with a row locks that row alone, so
//! it waits for them. A key that has a row is fenced from it alone (the
//! row's fence + 1, as the mutex's grant over a row is): shares of
//! different keys never wait for one another (until 2026-12-01 every
//! shared grant and release locked the namespace's fence counter row, and
//! 64 tasks taking read locks of 64 keys got 673 a second where their
//! mutex cycles ran at 8,060). A key without a row draws from the counter,
//! under the counter's lock, which every insert of a lease row takes first
//! (the mutex's grant of a new key, the sweep); the row is then read again,
//! as one inserted since the first read would otherwise be written over as
//! this share's gate. Reads of rows are locking reads (`FOR UPDATE`), which
//! see the latest committed rows. The gate keeps the highest fence of its
//! shares, so the key's next grant, the row's fence + 1, is above them all
//! (model `mysql_fence`, with the rejected `GateNotRaised`). Renewal only
//! moves shares and gates up, in one transaction per slice.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, TxOpts, Value};

use super::session::micros;
use super::session_rows::{self, Lapse, SessionSql, held_session_sql, until_sql};
use super::share_procs::ShareProcs;
use crate::backend::LeaseMode;
use crate::backend::admission::{self, Decision, Row};
use crate::vocabulary::key::OwnerToken;

/// A row of the shares table as `rows` reads it: token, mode code, weight,
/// limit, held, fence, microseconds left.
type ShareRow = (Vec<u8>, u8, u64, u64, u8, u64, Option<i64>);

/// The token of a key's lease row while shares hold the key. Only this
/// module knows it: the others ask [`is_gate`], [`NOT_GATE`] and
/// [`ShareSql::lease_to_gate`].
const GATE: [u8; 16] = [0; 16];

/// Whether a lease row's token is the gate of shares rather than an
/// exclusive holder.
pub(super) fn is_gate(token: &[u8]) -> bool {
    token == GATE
}

/// A condition on the lease table's `token` column that leaves out the gate
/// of shares: an exclusive holder's row only ([`GATE`] written as a literal).
pub(super) const NOT_GATE: &str = "token <> X'00000000000000000000000000000000'";

/// [`GATE`] as an SQL literal, for the procedures (`share_procs`).
const GATE_LITERAL: &str = "X'00000000000000000000000000000000'";

/// The statements of shared leases.
#[derive(Debug)]
pub(super) struct ShareSql {
    pub(super) schema: String,
    lock_counter: String,
    fence_next: String,
    lock_row: String,
    gate: String,
    rows: String,
    upsert: String,
    gate_to_shares: String,
    grant_writer: String,
    extend_writer: String,
    extend_share: String,
    drop_own: String,
    drop_live_held: String,
    own: String,
    latest: String,
    shrink: String,
    pub(super) list: String,
    resize: String,
    pub(super) relabel_lease: String,
    pub(super) relabel_share: String,
    pub(super) owns: String,
    renew_share: String,
    gate_up: String,
    lock_gate: String,
    held_weight: String,
    lease_to_gate: String,
    sessions: SessionSql,
    /// The server-side grant of a share that finds room beside the key's
    /// other shares and release of a granted share, where they can be used.
    pub(super) procs: ShareProcs,
}

const NOW: &str = "UTC_TIMESTAMP(6)";

impl ShareSql {
    /// Statements over `<leases>`, `<fence>`, `<shares>` and `<sessions>`,
    /// all validated names, and the procedures of namespace `ns`.
    pub(super) fn new(ns: &str, leases: &str, fence: &str, shares: &str, sessions: &str) -> Self {
        let (l, f, s) = (format!("`{leases}`"), format!("`{fence}`"), format!("`{shares}`"));
        let left = format!("TIMESTAMPDIFF(MICROSECOND, {NOW}, live_until)");
        // Until when the lease row aliased `l` is held: its session's
        // expiry for a row of a session (see `session_rows`).
        let u = until_sql("l", &SessionSql::table(sessions));
        ShareSql {
            schema: format!(
                "CREATE TABLE IF NOT EXISTS {s} (
                    lock_key   VARBINARY(256) NOT NULL,
                    token      BINARY(16) NOT NULL,
                    mode       TINYINT UNSIGNED NOT NULL,
                    weight     BIGINT UNSIGNED NOT NULL,
                    limit_n    BIGINT UNSIGNED NOT NULL,
                    held       TINYINT UNSIGNED NOT NULL,
                    fence      BIGINT UNSIGNED NOT NULL,
                    label      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                    live_until DATETIME(6) NOT NULL,
                    PRIMARY KEY (lock_key, token)
                ) ENGINE=InnoDB"
            ),
            lock_counter: format!("SELECT value FROM {f} WHERE id = 0 FOR UPDATE"),
            // For a key without a row (the floor is then 0); a key with one
            // is fenced from it (model `mysql_fence`, `SharesFromCounter`:
            // rows keep their fence after release, above the counter).
            fence_next: format!("UPDATE {f} SET value = LAST_INSERT_ID(GREATEST(value + 1, ?)) WHERE id = 0"),
            // The key's row, live or not (its fence is the key's), and the
            // session it is held under, if any (a lapse seen here is
            // counted before the row is taken: `acquire`).
            gate: format!(
                "SELECT token, fence, TIMESTAMPDIFF(MICROSECOND, {NOW}, {u}), {u} > {NOW}, {hs} FROM {l} AS l
                 WHERE lock_key = ? FOR UPDATE",
                hs = held_session_sql("l")
            ),
            rows: format!(
                "SELECT token, mode, weight, limit_n, held, fence, {left} FROM {s}
                 WHERE lock_key = ? AND live_until > {NOW} FOR UPDATE"
            ),
            upsert: format!(
                "INSERT INTO {s} (lock_key, token, mode, weight, limit_n, held, fence, label, live_until)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, {NOW} + INTERVAL ? MICROSECOND)
                 ON DUPLICATE KEY UPDATE mode = VALUES(mode), weight = VALUES(weight), limit_n = VALUES(limit_n),
                     held = VALUES(held), fence = VALUES(fence), label = VALUES(label),
                     live_until = VALUES(live_until)"
            ),
            // live_until is assigned before token, so it sees the old token.
            // The gate keeps the highest fence of its shares (a share that
            // asks again writes its own, maybe older, fence; model
            // `mysql_fence`, `GateOverwrite`).
            gate_to_shares: format!(
                "INSERT INTO {l} (lock_key, token, fence, label, live_until)
                 VALUES (?, ?, ?, '', {NOW} + INTERVAL ? MICROSECOND)
                 ON DUPLICATE KEY UPDATE
                     live_until = IF(token = VALUES(token) AND live_until > {NOW},
                                     GREATEST(live_until, VALUES(live_until)), VALUES(live_until)),
                     token = VALUES(token), fence = GREATEST(fence, VALUES(fence)), label = '', session = NULL"
            ),
            grant_writer: format!(
                "INSERT INTO {l} (lock_key, token, fence, label, live_until)
                 VALUES (?, ?, ?, ?, {NOW} + INTERVAL ? MICROSECOND)
                 ON DUPLICATE KEY UPDATE token = VALUES(token), fence = VALUES(fence), label = VALUES(label),
                     live_until = VALUES(live_until), session = NULL"
            ),
            extend_writer: format!(
                "UPDATE {l} SET live_until = {NOW} + INTERVAL ? MICROSECOND WHERE lock_key = ? AND token = ?"
            ),
            extend_share: format!(
                "UPDATE {s} SET live_until = {NOW} + INTERVAL ? MICROSECOND
                 WHERE lock_key = ? AND token = ? AND held = 1"
            ),
            drop_own: format!("DELETE FROM {s} WHERE lock_key = ? AND token = ?"),
            drop_live_held: format!(
                "DELETE FROM {s} WHERE lock_key = ? AND token = ? AND held = 1 AND live_until > {NOW}"
            ),
            own: format!("SELECT held, live_until > {NOW} FROM {s} WHERE lock_key = ? AND token = ?"),
            latest: format!(
                "SELECT MAX({left}) FROM {s} WHERE lock_key = ? AND held = 1 AND live_until > {NOW} FOR UPDATE"
            ),
            shrink: format!(
                "UPDATE {l} SET live_until = IF(? IS NULL, '1970-01-01', {NOW} + INTERVAL ? MICROSECOND)
                 WHERE lock_key = ? AND token = ?"
            ),
            list: format!(
                "SELECT label, fence, {left}, weight, limit_n FROM {s}
                 WHERE lock_key = ? AND held = 1 AND live_until > {NOW} ORDER BY fence"
            ),
            resize: format!(
                "UPDATE {s} SET limit_n = ? WHERE lock_key = ? AND mode = {m} AND live_until > {NOW}",
                m = admission::MODE_SHARED
            ),
            relabel_lease: format!("UPDATE {l} AS l SET label = ? WHERE lock_key = ? AND token = ? AND {u} > {NOW}"),
            relabel_share: format!(
                "UPDATE {s} SET label = ? WHERE lock_key = ? AND token = ? AND held = 1 AND live_until > {NOW}"
            ),
            owns: format!(
                "SELECT EXISTS (SELECT 1 FROM {l} AS l WHERE lock_key = ? AND token = ? AND {u} > {NOW})
                     OR EXISTS (SELECT 1 FROM {s} WHERE lock_key = ? AND token = ? AND held = 1
                                AND live_until > {NOW})"
            ),
            renew_share: format!(
                "UPDATE {s} SET live_until = {NOW} + INTERVAL ? MICROSECOND
                 WHERE lock_key = ? AND token = ? AND held = 1 AND live_until > {NOW}"
            ),
            lock_gate: format!("SELECT 1 FROM {l} WHERE lock_key = ? AND token = ? FOR UPDATE"),
            lock_row: format!("SELECT 1 FROM {l} WHERE lock_key = ? FOR UPDATE"),
            gate_up: format!(
                "UPDATE {l} SET live_until = GREATEST(live_until, {NOW} + INTERVAL ? MICROSECOND)
                 WHERE lock_key = ? AND token = ?"
            ),
            // The gate keeps the lease's expiry, read before the session is
            // let go (assignments run in order).
            lease_to_gate: format!(
                "UPDATE {l} AS l SET live_until = {u}, session = NULL, token = ?, label = '' WHERE lock_key = ? AND token = ?"
            ),
            held_weight: format!(
                "SELECT CAST(COALESCE(SUM(weight), 0) AS SIGNED) FROM {s}
                 WHERE lock_key = ? AND held = 1 AND mode = {m} AND live_until > {NOW}",
                m = admission::MODE_SHARED
            ),
            sessions: SessionSql::new(sessions, leases),
            procs: ShareProcs::new(ns, leases, shares, GATE_LITERAL),
        }
    }
}

impl ShareSql {
    /// Makes `token`'s lease row of `key` the gate of its shares (the
    /// caller wrote the lease's held share, with the lease's own fence and
    /// expiry, in the same transaction): a shrink of a writer to a share.
    pub(super) async fn lease_to_gate(
        &self,
        tx: &mut mysql_async::Transaction<'_>,
        key: &[u8],
        token: &[u8; 16],
    ) -> mysql_async::Result<()> {
        tx.exec_drop(self.lease_to_gate.as_str(), (&GATE[..], key, &token[..])).await
    }
}

/// What a shared acquire decided.
pub(super) enum Shared {
    Granted(u64),
    Busy(Option<Duration>),
    Conflict(String),
}

/// A request, as the shared acquire needs it.
pub(super) struct Ask<'a> {
    pub(super) key: &'a str,
    pub(super) token: OwnerToken,
    pub(super) mode: LeaseMode,
    pub(super) ttl: Duration,
    pub(super) label: &'a str,
    pub(super) reserve: bool,
}

/// One transaction: read the key's row (the gate) and its shares with
/// locking reads (the counter's lock first only when the key has no row),
/// decide, write.
pub(super) async fn acquire(conn: &mut Conn, q: &ShareSql, ask: Ask<'_>) -> mysql_async::Result<Shared> {
    let Ask { key, token, mode, ttl, label, reserve } = ask;
    let (tok, k) = (token.to_bytes(), key.as_bytes());
    let label: String = label.chars().take(255).collect();
    if let (true, LeaseMode::Shared { weight, limit }) = (q.procs.usable(), mode) {
        let (ask, ttl_us) = ((weight.into(), limit.into()), micros(ttl));
        if let Some(Some(fence)) = q.procs.acquire_with_room(conn, (k, &tok), ask, &label, ttl_us).await? {
            return Ok(Shared::Granted(fence));
        }
    }
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    let mut rows = Vec::new();
    let mut soonest: Option<i64> = None;
    type Gate = (Vec<u8>, u64, Option<i64>, u8, Option<Vec<u8>>);
    let mut gate: Option<Gate> = tx.exec_first(q.gate.as_str(), (k,)).await?;
    if gate.is_none() {
        // No row, so nothing was locked: the counter's lock (every insert
        // of a lease row takes it first), then the row again, which one
        // inserted meanwhile would be (its holder's, never this share's gate).
        tx.exec_drop(q.lock_counter.as_str(), ()).await?;
        gate = tx.exec_first(q.gate.as_str(), (k,)).await?;
    }
    // A row of a session that lapsed is taken only once its removal is
    // counted on the session's latest version; one that a renewal extended
    // meanwhile is held. (A refusal rolls the count back.)
    if let Some((_, _, left, live @ 0, Some(session))) = gate.as_mut() {
        if let Lapse::Held(us) = session_rows::count_lapsed(&mut tx, &q.sessions, session).await? {
            (*left, *live) = (Some(us), 1);
        }
    }
    let gate = gate.map(|(t, fence, left, live, _)| (t, fence, left, live));
    // The key's row fence, the highest it had (the gate keeps its shares').
    let row_fence = gate.as_ref().map(|(_, fence, _, _)| *fence);
    let mut gate_holder = None;
    if let Some((t, fence, left, _)) = gate.filter(|(t, _, _, live)| *live == 1 && t[..] != GATE[..]) {
        let t: [u8; 16] = t.try_into().unwrap_or(GATE);
        gate_holder = Some(t);
        soonest = left;
        rows.push(Row { token: t, mode: LeaseMode::Exclusive, held: true, order: fence });
    }
    let shares: Vec<ShareRow> = tx.exec(q.rows.as_str(), (k,)).await?;
    for (t, m, w, l, held, fence, left) in shares {
        if held == 1 {
            soonest = match (soonest, left) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        rows.push(Row {
            token: t.try_into().unwrap_or(GATE),
            mode: admission::decode(m.into(), w as i64, l as i64),
            held: held == 1,
            order: fence,
        });
    }
    // A key with a row: its next fence or place, above the row's fence
    // (the highest the key was granted: the gate keeps its shares') and
    // every live place, as the counter's draws were.
    let next_in_row = row_fence.map(|f| rows.iter().map(|r| r.order).fold(f, u64::max).saturating_add(1));
    let (code, weight, limit) = admission::encode(mode);
    let ttl_us = micros(ttl);
    // The share row, held or a reservation, at `order` (its fence or place).
    let upsert = |held: bool, order: u64| {
        let row: Vec<Value> = vec![
            k.into(),
            tok[..].into(),
            code.into(),
            weight.into(),
            limit.into(),
            u8::from(held).into(),
            order.into(),
            label.as_str().into(),
            ttl_us.into(),
        ];
        Params::Positional(row)
    };
    let outcome = match admission::decide(tok, mode, &rows) {
        Decision::AlreadyHeld { fence } => {
            if gate_holder == Some(tok) {
                tx.exec_drop(q.extend_writer.as_str(), (ttl_us, k, &tok[..])).await?;
            } else {
                tx.exec_drop(q.extend_share.as_str(), (ttl_us, k, &tok[..])).await?;
                tx.exec_drop(q.gate_to_shares.as_str(), (k, &GATE[..], fence, ttl_us)).await?;
            }
            Shared::Granted(fence)
        }
        Decision::Grant => {
            let fence = match next_in_row {
                Some(fence) => fence,
                None => {
                    tx.exec_drop(q.fence_next.as_str(), (0,)).await?;
                    let Some(fence) = tx.last_insert_id() else {
                        tx.rollback().await?;
                        return Err(mysql_async::Error::Other("the server did not report the new fence value".into()));
                    };
                    fence
                }
            };
            if mode.is_exclusive() {
                tx.exec_drop(q.grant_writer.as_str(), (k, &tok[..], fence, &label, ttl_us)).await?;
                tx.exec_drop(q.drop_own.as_str(), (k, &tok[..])).await?;
            } else {
                tx.exec_drop(q.upsert.as_str(), upsert(true, fence)).await?;
                tx.exec_drop(q.gate_to_shares.as_str(), (k, &GATE[..], fence, ttl_us)).await?;
            }
            Shared::Granted(fence)
        }
        Decision::Refuse { reserve: true, keep_order } if reserve => {
            // A new place: after every place and fence of the key, so that
            // the key's waiters keep their order.
            let place = match (keep_order, next_in_row) {
                (Some(place), _) => place,
                (None, Some(place)) => place,
                (None, None) => {
                    tx.exec_drop(q.fence_next.as_str(), (0,)).await?;
                    tx.last_insert_id().unwrap_or(0)
                }
            };
            tx.exec_drop(q.upsert.as_str(), upsert(false, place)).await?;
            tx.commit().await?;
            return Ok(Shared::Busy(soonest.map(|us| Duration::from_micros(us.max(0) as u64))));
        }
        Decision::Refuse { .. } => {
            tx.rollback().await?;
            return Ok(Shared::Busy(soonest.map(|us| Duration::from_micros(us.max(0) as u64))));
        }
        Decision::Conflict(reason) => {
            tx.rollback().await?;
            return Ok(Shared::Conflict(reason));
        }
    };
    tx.commit().await?;
    Ok(outcome)
}

/// Deletes the share or reservation of `token`: `Some(live)` if there was
/// one (`live`: an unexpired held share), then moves the gate down if it
/// was held. With `granted` (this client was granted the share), the
/// delete of a held, unexpired share comes first and tells it, without the
/// read of its row (one statement fewer); anything else is read as without.
pub(super) async fn release(
    conn: &mut Conn,
    q: &ShareSql,
    key: &str,
    token: OwnerToken,
    mut granted: bool,
) -> mysql_async::Result<Option<bool>> {
    let (k, tok) = (key.as_bytes(), token.to_bytes());
    if granted && q.procs.usable() {
        match q.procs.release_granted(conn, k, &tok).await? {
            Some(true) => return Ok(Some(true)),
            // Not live and held: read the row, as for any other token.
            Some(false) => granted = false,
            None => {}
        }
    }
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    // The key's row first, as every grant of the key locks it first (no
    // deadlock): no grant or other shrink of the key runs until commit.
    let mut deleted = false;
    if granted {
        tx.exec_drop(q.lock_row.as_str(), (k,)).await?;
        tx.exec_drop(q.drop_live_held.as_str(), (k, &tok[..])).await?;
        deleted = tx.affected_rows() == 1;
    }
    let (held, live) = if deleted {
        (1, Some(1))
    } else {
        match tx.exec_first::<(u8, Option<i64>), _, _>(q.own.as_str(), (k, &tok[..])).await? {
            Some(own) => own,
            None => {
                tx.rollback().await?;
                return Ok(None);
            }
        }
    };
    if held == 1 && !granted {
        tx.exec_drop(q.lock_row.as_str(), (k,)).await?;
    }
    if !deleted {
        tx.exec_drop(q.drop_own.as_str(), (k, &tok[..])).await?;
    }
    if held == 1 {
        // The gate down to the latest remaining share, read with locks (a
        // renewal in flight waits for them, then moves the gate up again).
        let latest: Option<Option<i64>> = tx.exec_first(q.latest.as_str(), (k,)).await?;
        let latest = latest.flatten();
        tx.exec_drop(q.shrink.as_str(), (latest, latest, k, &GATE[..])).await?;
    }
    tx.commit().await?;
    Ok(Some(held == 1 && live == Some(1)))
}

/// Extends the listed shares still held, and their gates, in one
/// transaction; true for each extended.
pub(super) async fn renew(
    conn: &mut Conn,
    q: &ShareSql,
    leases: &[(&str, OwnerToken, Duration)],
) -> mysql_async::Result<Vec<bool>> {
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    let mut out = Vec::with_capacity(leases.len());
    for (key, token, ttl) in leases {
        let (k, tok, us) = (key.as_bytes(), token.to_bytes(), micros(*ttl));
        // The gate row first, as acquisitions lock it before the shares.
        tx.exec_drop(q.lock_gate.as_str(), (k, &GATE[..])).await?;
        tx.exec_drop(q.renew_share.as_str(), (us, k, &tok[..])).await?;
        let extended = tx.affected_rows() == 1;
        if extended {
            tx.exec_drop(q.gate_up.as_str(), (us, k, &GATE[..])).await?;
        }
        out.push(extended);
    }
    tx.commit().await?;
    Ok(out)
}

/// Records `limit` with the key's live shares; returns the weight held.
pub(super) async fn resize(conn: &mut Conn, q: &ShareSql, key: &str, limit: u32) -> mysql_async::Result<u64> {
    conn.exec_drop(q.resize.as_str(), (limit, key.as_bytes())).await?;
    let held: Option<i64> = conn.exec_first(q.held_weight.as_str(), (key.as_bytes(),)).await?;
    Ok(held.unwrap_or(0).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_condition_names_the_gate_token() {
        let hex: String = GATE.iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(NOT_GATE, format!("token <> X'{hex}'"));
        assert_eq!(GATE_LITERAL, format!("X'{hex}'"));
        assert!(is_gate(&GATE) && !is_gate(&[1; 16]));
    }
}
