//! The server-side steps of shared leases: one `CALL` each where the
//! shares' transactions (`shares::acquire`, `shares::release`) take six
//! round trips with the key's lease row locked across four of them.
//!
//! **The grant of a share that finds room beside the key's other shares
//! and nobody waiting** (`NAME_share_room2`) runs the shared acquire's
//! transaction for that case: the key's lease row locked first, then its
//! live shares and reservations read with a locking read, as the
//! transaction reads them. When the row is free (expired, released: not a
//! row held under a session, whose lapse only the transaction counts) or
//! is the gate of shares, and every live row of the key is another token's
//! held share under the same limit (no writer, no reservation, not this
//! token's own), the admission rule grants the share if its weight and
//! theirs are within the limit, with the fence the transaction gives (one
//! above the row's, which keeps the highest fence the key was granted, and
//! above every live share's), and the procedure writes what the transaction
//! writes (the share, and the row as the gate, its expiry moved up to the
//! new share's). In every other case it rolls back and answers nothing, and
//! the client runs the transaction: a key without a row (its first grant
//! draws from the namespace's counter), one held by a writer or waited for,
//! a share that does not fit or names another limit, or this token's own
//! live share or reservation.
//!
//! **The release of a granted share** (`NAME_share_release1`) is the
//! release transaction's granted path, the same statements
//! in the same order under the same locks: the key's lease row locked
//! first (as every grant of the key locks it first), the share deleted only
//! if it is held and unexpired, then the gate moved down to the latest
//! remaining held share's expiry (or to the past when none is left). It
//! answers 1 when it deleted the share and committed, and 0 when it found
//! no live held share and rolled back, after which the client runs the
//! transaction as for a share it was not known to hold (an expired share,
//! or one taken away), so the answer is the same whichever path ran.
//! Clients with and without the procedure can share a namespace: both
//! change the rows in one transaction under the same row locks.
//!
//! Creating them needs `CREATE ROUTINE` on the database, and calling them
//! `EXECUTE` (which their creator is given). A client whose user has
//! neither, or whose server refuses them in any other way, keeps the
//! transactions (`SQL SECURITY INVOKER`: a procedure never reaches a table
//! its caller could not). The names carry a version: a later change of a
//! body gets a new name, so clients of different versions never run each
//! other's.

use std::sync::atomic::{AtomicBool, Ordering};

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use crate::backend::admission::MODE_SHARED;

/// Server errors after which the procedures are not used again by this
/// client: `ER_PROCACCESS_DENIED_ERROR` (no `EXECUTE`) and
/// `ER_SP_DOES_NOT_EXIST` (dropped since).
const GONE: [u16; 2] = [1370, 1305];

/// The procedures of a namespace, and whether this client calls them.
#[derive(Debug)]
pub(super) struct ShareProcs {
    /// (name, `CREATE PROCEDURE` statement) of each.
    procedures: [(String, String); 2],
    room_call: String,
    release_call: String,
    usable: AtomicBool,
}

impl ShareProcs {
    /// The procedures over `<leases>` and `<shares>` of namespace `ns` (a
    /// checked name of at most 48 bytes: theirs stay within 64), with
    /// `gate`, the token of a lease row that gates shares, as an SQL literal.
    pub(super) fn new(ns: &str, leases: &str, shares: &str, gate: &str) -> Self {
        let (room, release) = (format!("{ns}_share_room2"), format!("{ns}_share_release1"));
        let now = "UTC_TIMESTAMP(6)";
        let head = "MODIFIES SQL DATA SQL SECURITY INVOKER
             COMMENT 'holdfast: shared leases (see the MySQL store docs)'
             BEGIN";
        // Never leave the caller's connection inside a transaction.
        let on_error = "DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;";
        // The held share's row (one statement, in both branches below), with
        // its fence `f + 1` (the lone branch) or `f`.
        let insert = |fence: &str| {
            format!(
                "INSERT INTO `{shares}` (lock_key, token, mode, weight, limit_n, held, fence, label, live_until)
                     VALUES (k, tok, {shared}, w, n, 1, {fence}, lbl, {now} + INTERVAL us MICROSECOND)
                     ON DUPLICATE KEY UPDATE mode = VALUES(mode), weight = VALUES(weight),
                         limit_n = VALUES(limit_n), held = 1, fence = VALUES(fence), label = VALUES(label),
                         live_until = VALUES(live_until)",
                shared = MODE_SHARED,
            )
        };
        // A lone key (no live share row) is decided from the count alone and
        // granted by the statements of the lone grant before it (a branch of
        // its own: the general one cost read locks of lone keys 4-6%); one
        // that other shares hold reads the same rows again, locked by then,
        // for what the rule asks of them.
        let create_room = format!(
            "CREATE PROCEDURE `{room}`(IN k VARBINARY(256), IN tok BINARY(16), IN w BIGINT UNSIGNED,
                 IN n BIGINT UNSIGNED, IN lbl VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, IN us BIGINT)
             {head}
                 DECLARE f BIGINT UNSIGNED DEFAULT NULL;
                 DECLARE free INT DEFAULT 0;
                 DECLARE gated INT DEFAULT 0;
                 DECLARE others INT DEFAULT 1;
                 DECLARE beside INT DEFAULT 0;
                 DECLARE taken BIGINT UNSIGNED DEFAULT 0;
                 DECLARE top BIGINT UNSIGNED DEFAULT 0;
                 {on_error}
                 START TRANSACTION;
                 SELECT fence, live_until <= {now}, token = {gate} INTO f, free, gated
                     FROM `{leases}` WHERE lock_key = k FOR UPDATE;
                 SELECT COUNT(*) INTO others FROM `{shares}` WHERE lock_key = k AND live_until > {now} FOR UPDATE;
                 IF others > 0 THEN
                     SELECT COALESCE(SUM(held = 1 AND mode = {shared} AND limit_n = n AND token <> tok), 0),
                             COALESCE(SUM(weight), 0), COALESCE(MAX(fence), 0)
                         INTO beside, taken, top
                         FROM `{shares}` WHERE lock_key = k AND live_until > {now} FOR UPDATE;
                 END IF;
                 IF f IS NOT NULL AND free = 1 AND others = 0 AND w <= n THEN
                     {insert_with_fence_after};
                     UPDATE `{leases}` SET live_until = {now} + INTERVAL us MICROSECOND, token = {gate},
                         fence = f + 1, label = '', session = NULL WHERE lock_key = k;
                     COMMIT;
                     SELECT f + 1;
                 ELSEIF f IS NOT NULL AND (free = 1 OR gated = 1) AND others = beside AND taken + w <= n THEN
                     SET f = GREATEST(f, top) + 1;
                     {insert_with_fence};
                     UPDATE `{leases}` SET
                         live_until = IF(token = {gate} AND live_until > {now},
                             GREATEST(live_until, {now} + INTERVAL us MICROSECOND), {now} + INTERVAL us MICROSECOND),
                         token = {gate}, fence = GREATEST(fence, f), label = '', session = NULL
                         WHERE lock_key = k;
                     COMMIT;
                     SELECT f;
                 ELSE
                     ROLLBACK;
                     SELECT CAST(NULL AS UNSIGNED);
                 END IF;
             END",
            shared = MODE_SHARED,
            insert_with_fence_after = insert("f + 1"),
            insert_with_fence = insert("f"),
        );
        let create_release = format!(
            "CREATE PROCEDURE `{release}`(IN k VARBINARY(256), IN tok BINARY(16))
             {head}
                 DECLARE locked INT DEFAULT 0;
                 DECLARE latest DATETIME(6) DEFAULT NULL;
                 {on_error}
                 START TRANSACTION;
                 SELECT COUNT(*) INTO locked FROM `{leases}` WHERE lock_key = k FOR UPDATE;
                 DELETE FROM `{shares}` WHERE lock_key = k AND token = tok AND held = 1 AND live_until > {now};
                 IF ROW_COUNT() = 1 THEN
                     SELECT MAX(live_until) INTO latest FROM `{shares}`
                         WHERE lock_key = k AND held = 1 AND live_until > {now} FOR UPDATE;
                     UPDATE `{leases}` SET live_until = COALESCE(latest, '1970-01-01')
                         WHERE lock_key = k AND token = {gate};
                     COMMIT;
                     SELECT 1;
                 ELSE
                     ROLLBACK;
                     SELECT 0;
                 END IF;
             END"
        );
        ShareProcs {
            room_call: format!("CALL `{room}`(?, ?, ?, ?, ?, ?)"),
            release_call: format!("CALL `{release}`(?, ?)"),
            procedures: [(room, create_room), (release, create_release)],
            usable: AtomicBool::new(false),
        }
    }

    /// Creates the procedures the namespace lacks, and marks them usable if
    /// both are there afterwards. A refusal is not an error: the client
    /// keeps the transactions.
    pub(super) async fn install(&self, conn: &mut Conn) -> mysql_async::Result<()> {
        let there = "SELECT 1 FROM information_schema.ROUTINES
                     WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = ? AND ROUTINE_TYPE = 'PROCEDURE'";
        let mut usable = true;
        for (name, create) in &self.procedures {
            if conn.exec_first::<u8, _, _>(there, (name.as_str(),)).await?.is_some() {
                continue;
            }
            match conn.query_drop(create.as_str()).await {
                Ok(()) => {}
                // ER_SP_ALREADY_EXISTS: another client created it meanwhile.
                Err(mysql_async::Error::Server(e)) if e.code == 1304 => {}
                Err(mysql_async::Error::Server(e)) => {
                    tracing::debug!(
                        procedure = name,
                        code = e.code,
                        "shared leases stay transactions: the server refused the procedure ({})",
                        e.message
                    );
                    usable = false;
                    break;
                }
                Err(other) => return Err(other),
            }
        }
        self.usable.store(usable, Ordering::Relaxed);
        Ok(())
    }

    /// Whether this client calls the procedures.
    pub(super) fn usable(&self) -> bool {
        self.usable.load(Ordering::Relaxed)
    }

    /// Grants `token` a held share of `key` (`mode`'s weight and limit) if
    /// it has a row, no writer holds it, nobody waits for it and the share
    /// fits beside the shares that hold it:
    /// `Some(Some(fence))`; `Some(None)` when the transaction must decide
    /// (nothing changed); `None` if the procedures cannot be called (no
    /// longer used by this client).
    ///
    /// # Cancel safety
    ///
    /// One statement whose transaction commits inside it: dropped, the
    /// server committed it or rolls it back with the connection.
    pub(super) async fn acquire_with_room(
        &self,
        conn: &mut Conn,
        (key, token): (&[u8], &[u8; 16]),
        (weight, limit): (u64, u64),
        label: &str,
        ttl_us: i64,
    ) -> mysql_async::Result<Option<Option<u64>>> {
        let params = (key, &token[..], weight, limit, label, ttl_us);
        let answer = conn.exec_first::<Option<u64>, _, _>(self.room_call.as_str(), params).await;
        self.answer(answer.map(Option::flatten))
    }

    /// Releases `token`'s granted share of `key` in one call: `Some(true)`
    /// if it was held and unexpired and is gone, with the gate moved down;
    /// `Some(false)` if there was no such share (nothing changed); `None`
    /// if the procedures cannot be called (no longer used by this client).
    ///
    /// # Cancel safety
    ///
    /// One statement whose transaction commits inside it: dropped, the
    /// server committed it or rolls it back with the connection.
    pub(super) async fn release_granted(
        &self,
        conn: &mut Conn,
        key: &[u8],
        token: &[u8; 16],
    ) -> mysql_async::Result<Option<bool>> {
        let answer = conn.exec_first::<u8, _, _>(self.release_call.as_str(), (key, &token[..])).await;
        self.answer(answer.map(|a| a == Some(1)))
    }

    /// A call's answer, or `None` (and the procedures no longer used) if
    /// they cannot be called.
    fn answer<T>(&self, answer: mysql_async::Result<T>) -> mysql_async::Result<Option<T>> {
        match answer {
            Ok(answer) => Ok(Some(answer)),
            Err(mysql_async::Error::Server(e)) if GONE.contains(&e.code) => {
                tracing::debug!(code = e.code, "shared leases back to transactions: {}", e.message);
                self.usable.store(false, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}
