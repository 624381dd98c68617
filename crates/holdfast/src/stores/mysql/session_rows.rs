//! Lease rows bound to a client's session row: how every statement of this
//! store reads and removes them (model `mysql_session` in holdfast-models,
//! "Model 11", under InnoDB's `READ COMMITTED`).
//!
//! A session-bound lease row names a row of `<namespace>_sessions` in its
//! `session` column and keeps `live_until` far ahead ([`FAR_SQL`]): it is
//! held while that session row is unexpired on the server clock
//! ([`until_sql`]), and a client of an earlier version, which reads
//! `live_until` alone, sees it held and never takes it. Every other row
//! (this version's grants, released rows, shares' gates, writers) has a
//! real expiry and is read by it, whatever its `session` column says.
//!
//! Every mutex grant of this version is such a row, under the client's
//! session for the lease's TTL (see [`choose`]), and renewal extends one
//! session row per client and TTL instead of one row per lease (see
//! `renew`). The version before (2026-11-30, "the readers") reads and
//! removes such rows but writes none; versions before it must be stopped
//! first (docs.md, Migration). The rules, each a counterexample in the
//! model when left out:
//!
//! - A row whose session lapsed is removed only after an `UPDATE` of that
//!   session row counts the removal and re-checks the lapse on its latest
//!   version, under its lock ([`count_lapsed`]): a renewal in flight commits
//!   first and the check then finds it renewed. The lapse seen by a
//!   consistent read alone would take a session a renewal had just
//!   extended (`ConsistentReadTakeover`), and so would a one-statement
//!   grant whose non-locking subquery saw it lapsed (`SubqueryTakeover`).
//! - Whoever removes another client's held row counts it in the row's
//!   session (`removed`): a takeover, a forced release, a release by token,
//!   the sweep. The holder's renewal reads the count and learns which of its
//!   leases are gone.
//! - A lapsed session is never extended again (every extension and renewal
//!   requires `expires_at > now()`): the client's next grant makes a new
//!   session under a new id. The client counts a session from the send of
//!   the statement that made or extended it (`LeanFromReceipt`), and
//!   extensions and renewals never lower it (`GREATEST`:
//!   `RenewWithoutGreatest`).
//! - A renewal reads the count on the session row it locked, in the same
//!   statement (`CountBeforeRenew`), and which rows are left in a statement
//!   after it.
//! - Lease row before session row, in every transaction: no deadlock
//!   between a removal and a renewal.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Transaction};

use crate::backend::session_book::{SessionBook, SessionChoice, SessionId};

/// The token of a released row, the released marker (its fence is the
/// key's): drawn by no client (a random 128-bit token is all ones with
/// probability 2^-128), and not the shares' gate (all zeros). A released
/// row is read by its own expiry, whatever its `session`.
pub(super) const RELEASED_SQL: &str = "X'FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF'";

/// The `live_until` of a lease row held under its session: far ahead, so
/// that a client older than session rows sees it held. Every other row
/// (released, a gate, a writer, a grant by the readers' version) has a
/// real expiry and is read by it, whatever its `session` column says: a
/// released row keeps its session, so that the next grant by the same
/// session changes no index entry.
pub(super) const FAR_SQL: &str = "TIMESTAMP '9999-12-31 00:00:00'";

/// The session lease row `row` (a table name or alias) is held under: none
/// unless its `live_until` is [`FAR_SQL`].
pub(super) fn held_session_sql(row: &str) -> String {
    format!("(CASE WHEN {row}.live_until = {FAR_SQL} THEN {row}.session END)")
}

/// Until when lease row `row` is held: its session row's expiry (the
/// distant past once that row is gone), or its own `live_until` when it
/// has no held session. `sessions` is the quoted session table.
pub(super) fn until_sql(row: &str, sessions: &str) -> String {
    format!(
        "(CASE WHEN {hs} IS NULL THEN {row}.live_until
               ELSE COALESCE((SELECT x.expires_at FROM {sessions} x WHERE x.id = {row}.session),
                             TIMESTAMP '1000-01-01 00:00:00')
          END)",
        hs = held_session_sql(row)
    )
}

/// The statements over the session table.
#[derive(Debug)]
pub(super) struct SessionSql {
    pub(super) schema: String,
    count_lapsed: String,
    count_any: String,
    left: String,
    extend: String,
    create: String,
    pub(super) renew: String,
    pub(super) rows_of: String,
    pub(super) sweep: String,
}

impl SessionSql {
    /// Statements over `<sessions>` and `<leases>`, validated names.
    pub(super) fn new(sessions: &str, leases: &str) -> Self {
        let x = format!("`{sessions}`");
        let ahead = "GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)";
        SessionSql {
            schema: format!(
                "CREATE TABLE IF NOT EXISTS {x} (
                    id         BINARY(16) NOT NULL PRIMARY KEY,
                    expires_at DATETIME(6) NOT NULL,
                    removed    BIGINT NOT NULL DEFAULT 0
                ) ENGINE=InnoDB"
            ),
            // Reads the latest version under the row's lock (waits for a
            // renewal in flight), unlike the statement's consistent reads.
            count_lapsed: format!(
                "UPDATE {x} SET removed = removed + 1 WHERE id = ? AND expires_at <= UTC_TIMESTAMP(6)"
            ),
            count_any: format!("UPDATE {x} SET removed = removed + 1 WHERE id = ?"),
            left: format!("SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) FROM {x} WHERE id = ?"),
            // An acquire's extension of its session (autocommit): never a
            // lapsed one, never lowered (a renewal that started earlier may
            // write after it).
            extend: format!("UPDATE {x} SET expires_at = {ahead} WHERE id = ? AND expires_at > UTC_TIMESTAMP(6)"),
            create: format!(
                "INSERT INTO {x} (id, expires_at, removed) VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, 0)"
            ),
            // The renewal of one session (autocommit): extended as the
            // acquire extends it, and its `removed` count read on the version
            // this statement locked (model 11's renewal transaction, its
            // UPDATE and SELECT, in one round trip): the count comes back as
            // the OK packet's insert id.
            renew: format!(
                "UPDATE {x} SET removed = LAST_INSERT_ID(removed), expires_at = {ahead}
                 WHERE id = ? AND expires_at > UTC_TIMESTAMP(6)"
            ),
            // After a renewal that found the count moved, in a statement of
            // its own (a snapshot after the renewal's commit): the rows of
            // the session still held under it.
            rows_of: format!("SELECT token FROM `{leases}` WHERE session = ? AND live_until = {FAR_SQL}"),
            // Sessions lapsed a minute ago (never extended again): their rows
            // are free whether or not the session row is there. The table
            // holds a row per client and TTL, so no index on the expiry.
            sweep: format!("DELETE FROM {x} WHERE expires_at < UTC_TIMESTAMP(6) - INTERVAL 60 SECOND LIMIT 32"),
        }
    }

    /// The quoted table name, for statements of other modules.
    pub(super) fn table(sessions: &str) -> String {
        format!("`{sessions}`")
    }
}

/// The session an acquire of `ttl` grants under, and until when this
/// client knows it unexpired: the current one as it is with two thirds of
/// the TTL left by the client's count (no statement), else extended
/// (`UPDATE`, autocommit), else (lapsed, or none yet) a new one
/// (`INSERT`). Each counted from its statement's send.
pub(super) async fn choose(
    conn: &mut Conn,
    q: &SessionSql,
    book: &std::sync::Mutex<SessionBook>,
    ttl: Duration,
) -> mysql_async::Result<(SessionId, Instant)> {
    let lock = || book.lock().unwrap_or_else(|p| p.into_inner());
    let sent = Instant::now();
    let (current, fresh) = match lock().choose(ttl, sent) {
        SessionChoice::Lean { id, until } => return Ok((id, until)),
        SessionChoice::Full { current, fresh } => (current, fresh),
    };
    let us = super::session::micros(ttl);
    if current != fresh {
        conn.exec_drop(q.extend.as_str(), (us, &current[..])).await?;
        if super::session::rows_matched(conn).is_some_and(|n| n == 1) {
            lock().known_until(current, sent + ttl);
            return Ok((current, sent + ttl));
        }
        // Lapsed (or swept): its leases are lost, and it is never used again.
        lock().lapsed(current);
    }
    let sent = Instant::now();
    conn.exec_drop(q.create.as_str(), (&fresh[..], us)).await?;
    let mut book = lock();
    book.used(ttl.as_millis() as i64, fresh, None);
    book.known_until(fresh, sent + ttl);
    Ok((fresh, sent + ttl))
}

/// What [`count_lapsed`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Lapse {
    /// The session lapsed (its removal is counted) or its row is gone: the
    /// lease row may be removed in this transaction.
    Free,
    /// The session is unexpired (a renewal committed since the caller's
    /// read): microseconds left.
    Held(i64),
}

/// Inside the transaction that holds lease row's lock: counts the removal
/// of a row of `session` if that session lapsed, on its latest version.
pub(super) async fn count_lapsed(
    tx: &mut Transaction<'_>,
    q: &SessionSql,
    session: &[u8],
) -> mysql_async::Result<Lapse> {
    tx.exec_drop(q.count_lapsed.as_str(), (session,)).await?;
    if tx.affected_rows() == 1 {
        return Ok(Lapse::Free);
    }
    let left: Option<Option<i64>> = tx.exec_first(q.left.as_str(), (session,)).await?;
    Ok(match left {
        Some(us) => Lapse::Held(us.unwrap_or(0)),
        None => Lapse::Free,
    })
}

/// Inside the transaction that holds the lease row's lock: counts the
/// removal of a held row of `session`, lapsed or not (a forced release, a
/// release by token).
pub(super) async fn count_removal(tx: &mut Transaction<'_>, q: &SessionSql, session: &[u8]) -> mysql_async::Result<()> {
    tx.exec_drop(q.count_any.as_str(), (session,)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_released_token_is_all_ones_and_not_the_gate() {
        let hex = |b: u8| format!("X'{}'", format!("{b:02X}").repeat(16));
        assert_eq!(RELEASED_SQL, hex(0xFF));
        assert_eq!(super::super::shares::NOT_GATE, format!("token <> {}", hex(0)));
    }
}
