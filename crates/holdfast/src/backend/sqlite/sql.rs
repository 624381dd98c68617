//! The SQLite statements, each run inside one short transaction.
//!
//! Expiry is in milliseconds of the host's wall clock, which every process on
//! the host shares. Fences come from one counter row for the whole file, so
//! they are strictly increasing per key (and globally) across releases,
//! expiries and restarts, and lease rows can be deleted on release without
//! losing the count.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

use crate::key::OwnerToken;

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS holdfast_fence (
    id    INTEGER PRIMARY KEY CHECK (id = 0),
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO holdfast_fence (id, value) VALUES (0, 0);
CREATE TABLE IF NOT EXISTS holdfast_leases (
    key            TEXT PRIMARY KEY,
    token          BLOB NOT NULL,
    fence          INTEGER NOT NULL,
    label          TEXT NOT NULL,
    acquired_at_ms INTEGER NOT NULL,
    expires_at_ms  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS holdfast_leases_expiry ON holdfast_leases (expires_at_ms);
";

/// Switches the file to WAL mode (a no-op if it is already), retrying until
/// `deadline` while other connections hold it; returns the journal mode the
/// file is in afterwards.
///
/// The switch cannot rely on the busy timeout: SQLite makes it as a read
/// transaction that then upgrades to a write (to set the WAL flag in the
/// header), and a connection that already holds a read lock gets
/// `SQLITE_BUSY` at once instead of waiting, since waiting there could
/// deadlock with another reader doing the same. That is exactly what
/// several clients opening a new file at the same moment do, so each backs
/// off (its read lock is gone once the pragma fails) and tries again.
pub(super) fn switch_to_wal(conn: &Connection, deadline: Instant) -> rusqlite::Result<String> {
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0)) {
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) && Instant::now() < deadline => {
                // Jittered, so that two clients that collided do not collide again.
                std::thread::sleep(Duration::from_micros(rand::random_range(200..3000)));
            }
            other => return other,
        }
    }
}

/// Milliseconds since the Unix epoch on the host clock.
pub(super) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn ttl_ms(ttl: Duration) -> i64 {
    ttl.as_millis() as i64
}

/// The outcome of one acquire transaction.
pub(super) enum Acquired {
    Granted { fence: u64 },
    Busy { expires_in: Duration },
}

/// Reads who holds `key` without taking the write lock; `Some(time left)` if busy.
pub(super) fn peek_busy(conn: &Connection, key: &str) -> rusqlite::Result<Option<Duration>> {
    let now = now_ms();
    let expires: Option<i64> = conn
        .prepare_cached("SELECT expires_at_ms FROM holdfast_leases WHERE key = ?1 AND expires_at_ms > ?2")?
        .query_row(params![key, now], |r| r.get(0))
        .optional()?;
    Ok(expires.map(|e| Duration::from_millis((e - now).max(0) as u64)))
}

/// One `BEGIN IMMEDIATE` transaction: grant `key` to `token` if it is free or expired.
pub(super) fn acquire(
    conn: &mut Connection,
    key: &str,
    token: OwnerToken,
    ttl: Duration,
    label: &str,
) -> rusqlite::Result<Acquired> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let current: Option<(Vec<u8>, i64, i64)> = tx
        .prepare_cached("SELECT token, expires_at_ms, fence FROM holdfast_leases WHERE key = ?1")?
        .query_row(params![key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    if let Some((holder, expires, fence)) = current {
        if expires > now {
            if holder == token.to_bytes() {
                // A retry of an attempt that already succeeded (its reply was
                // lost): the same grant, with the lease counted from now, as
                // the client counts it from the retry.
                tx.prepare_cached("UPDATE holdfast_leases SET expires_at_ms = ?2 WHERE key = ?1")?
                    .execute(params![key, now + ttl_ms(ttl)])?;
                tx.commit()?;
                return Ok(Acquired::Granted { fence: fence as u64 });
            }
            return Ok(Acquired::Busy { expires_in: Duration::from_millis((expires - now) as u64) });
        }
    }
    let fence: i64 = tx
        .prepare_cached("UPDATE holdfast_fence SET value = value + 1 WHERE id = 0 RETURNING value")?
        .query_row([], |r| r.get(0))?;
    tx.prepare_cached(
        "INSERT INTO holdfast_leases (key, token, fence, label, acquired_at_ms, expires_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (key) DO UPDATE SET token = ?2, fence = ?3, label = ?4, acquired_at_ms = ?5, expires_at_ms = ?6",
    )?
    .execute(params![key, token.to_bytes(), fence, label, now, now + ttl_ms(ttl)])?;
    tx.commit()?;
    Ok(Acquired::Granted { fence: fence as u64 })
}

/// Deletes the grant of `token`; true if it was held and unexpired. Also
/// sweeps a few rows of holders that died long ago, so the table stays small.
pub(super) fn release(conn: &mut Connection, key: &str, token: OwnerToken) -> rusqlite::Result<bool> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let expires: Option<i64> = tx
        .prepare_cached("DELETE FROM holdfast_leases WHERE key = ?1 AND token = ?2 RETURNING expires_at_ms")?
        .query_row(params![key, token.to_bytes()], |r| r.get(0))
        .optional()?;
    tx.prepare_cached(
        "DELETE FROM holdfast_leases WHERE key IN
           (SELECT key FROM holdfast_leases WHERE expires_at_ms < ?1 LIMIT 16)",
    )?
    .execute(params![now - 60_000])?;
    tx.commit()?;
    Ok(expires.is_some_and(|e| e > now))
}

/// Extends every listed lease still owned by its token, in one transaction.
pub(super) fn renew(conn: &mut Connection, leases: &[(String, OwnerToken, Duration)]) -> rusqlite::Result<Vec<bool>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let mut held = Vec::with_capacity(leases.len());
    {
        let mut stmt = tx.prepare_cached(
            "UPDATE holdfast_leases SET expires_at_ms = ?3
             WHERE key = ?1 AND token = ?2 AND expires_at_ms > ?4",
        )?;
        for (key, token, ttl) in leases {
            held.push(stmt.execute(params![key, token.to_bytes(), now + ttl_ms(*ttl), now])? == 1);
        }
    }
    tx.commit()?;
    Ok(held)
}

/// The unexpired holder of `key`: (label, fence, ms left).
pub(super) fn holder(conn: &Connection, key: &str) -> rusqlite::Result<Option<(String, u64, i64)>> {
    let now = now_ms();
    conn.prepare_cached(
        "SELECT label, fence, expires_at_ms FROM holdfast_leases WHERE key = ?1 AND expires_at_ms > ?2",
    )?
    .query_row(params![key, now], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64, r.get::<_, i64>(2)? - now)))
    .optional()
}
