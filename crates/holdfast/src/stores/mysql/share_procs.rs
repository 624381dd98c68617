//! The server-side steps of shared leases: one `CALL` each where the
//! shares' transactions (`shares::acquire`, `shares::release`) take six
//! round trips with the key's lease row locked across four of them.
//!
//! **The grant of a share to a key nobody else holds or waits for**
//! (`NAME_share_alone1`) runs the shared acquire's transaction for that one
//! case: the key's lease row locked first, then its live shares and
//! reservations read with a locking read, as the transaction reads them.
//! When the row is free (expired, released, or a gate whose shares are
//! gone: not a row held under a session, whose lapse only the transaction
//! counts) and no live share or reservation is left, the admission rule
//! grants any share whose weight is within its limit, with the fence the
//! transaction gives, the row's plus one (the row keeps the highest fence
//! the key was granted), and the procedure writes what the transaction
//! writes (the share, and the row as the gate). In every other case it
//! rolls back and answers nothing, and the client runs the transaction: a
//! key without a row (its first grant draws from the namespace's counter),
//! one held or waited for, or this token's own live share or reservation.
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
use std::time::Duration;

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use crate::backend::LeaseMode;
use crate::backend::UNLIMITED;
use crate::backend::admission::{self, MODE_SHARED, MODE_WRITER};
use crate::vocabulary::key::OwnerToken;

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

/// The acquire procedure's answers, in its first column: granted (the
/// second is the fence), refused (the soonest held lease's microseconds
/// left, if any), another limit holds the key (the second is it), or the
/// transaction's to decide.
const GRANTED: u8 = 0;
/// See [`GRANTED`].
const BUSY: u8 = 1;
/// See [`GRANTED`].
const CONFLICT: u8 = 2;
/// See [`GRANTED`].
const TRANSACTION: u8 = 3;

/// Server errors after which the procedures are not used again by this
/// client: `ER_PROCACCESS_DENIED_ERROR` (no `EXECUTE`) and
/// `ER_SP_DOES_NOT_EXIST` (dropped since).
const GONE: [u16; 2] = [1370, 1305];

/// The procedures of a namespace, and whether this client calls them.
#[derive(Debug)]
pub(super) struct ShareProcs {
    /// (name, `CREATE PROCEDURE` statement) of each.
    procedures: [(String, String); 2],
    acquire_call: String,
    release_call: String,
    usable: AtomicBool,
}

impl ShareProcs {
    /// The procedures over `<leases>` and `<shares>` of namespace `ns` (a
    /// checked name of at most 48 bytes: theirs stay within 64), with
    /// `gate`, the token of a lease row that gates shares, and `far`, the
    /// expiry of a row held under a session, as SQL literals.
    pub(super) fn new(ns: &str, leases: &str, shares: &str, (gate, far): (&str, &str)) -> Self {
        let (acquire, release) = (format!("{ns}_share_acquire1"), format!("{ns}_share_release1"));
        let now = "UTC_TIMESTAMP(6)";
        // What the acquire transaction writes: the row as the gate of its
        // shares, keeping the highest fence (`ShareSql::gate_to_shares`), and
        // the share or reservation (`ShareSql::upsert`), fenced or placed at `f`.
        let gate_to_shares = |fence: &str| {
            format!(
                "UPDATE `{leases}` SET
                     live_until = IF(token = {gate} AND live_until > {now},
                                     GREATEST(live_until, {now} + INTERVAL us MICROSECOND),
                                     {now} + INTERVAL us MICROSECOND),
                     token = {gate}, fence = GREATEST(fence, {fence}), label = '', session = NULL
                 WHERE lock_key = k;"
            )
        };
        let upsert = |held: u8| {
            format!(
                "INSERT INTO `{shares}` (lock_key, token, mode, weight, limit_n, held, fence, label, live_until)
                     VALUES (k, tok, m, w, n, {held}, f, lbl, {now} + INTERVAL us MICROSECOND)
                     ON DUPLICATE KEY UPDATE mode = VALUES(mode), weight = VALUES(weight), limit_n = VALUES(limit_n),
                         held = VALUES(held), fence = VALUES(fence), label = VALUES(label),
                         live_until = VALUES(live_until);"
            )
        };
        let head = "MODIFIES SQL DATA SQL SECURITY INVOKER
             COMMENT 'holdfast: shared leases (see the MySQL store docs)'
             BEGIN";
        // Never leave the caller's connection inside a transaction.
        let on_error = "DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;";
        let create_acquire = format!(
            "CREATE PROCEDURE `{acquire}`(IN k VARBINARY(256), IN tok BINARY(16), IN m TINYINT UNSIGNED,
                 IN w BIGINT UNSIGNED, IN n BIGINT UNSIGNED,
                 IN lbl VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, IN us BIGINT, IN reserve TINYINT)
             {head}
                 DECLARE rt BINARY(16) DEFAULT NULL;
                 DECLARE rf BIGINT UNSIGNED DEFAULT NULL;
                 DECLARE ru DATETIME(6) DEFAULT NULL;
                 DECLARE holder INT DEFAULT 0;
                 DECLARE soon BIGINT DEFAULT NULL;
                 DECLARE held_soon BIGINT DEFAULT NULL;
                 DECLARE top BIGINT UNSIGNED DEFAULT 0;
                 DECLARE live INT DEFAULT 0;
                 DECLARE own_held TINYINT DEFAULT NULL;
                 DECLARE own_order BIGINT UNSIGNED DEFAULT NULL;
                 DECLARE own_place BIGINT UNSIGNED DEFAULT NULL;
                 DECLARE other_limit BIGINT UNSIGNED DEFAULT NULL;
                 DECLARE blocked INT DEFAULT 0;
                 DECLARE taken BIGINT UNSIGNED DEFAULT 0;
                 DECLARE f BIGINT UNSIGNED DEFAULT NULL;
                 {on_error}
                 START TRANSACTION;
                 -- The key's row first, as every grant of the key locks it first.
                 SELECT token, fence, live_until INTO rt, rf, ru FROM `{leases}` WHERE lock_key = k FOR UPDATE;
                 -- No row (the first grant draws from the counter), or a row
                 -- of a session (whose lapse is counted): the transaction's.
                 IF rf IS NULL OR ru = {far} THEN
                     ROLLBACK;
                     SELECT {TRANSACTION}, NULL;
                     LEAVE body;
                 END IF;
                 IF rt <> {gate} AND ru > {now} THEN
                     SET holder = 1, soon = TIMESTAMPDIFF(MICROSECOND, {now}, ru);
                 END IF;
                 -- The live shares and reservations, locked as the transaction reads them.
                 SELECT COUNT(*), COALESCE(MAX(fence), 0),
                        MIN(IF(held = 1, TIMESTAMPDIFF(MICROSECOND, {now}, live_until), NULL))
                     INTO live, top, held_soon
                     FROM `{shares}` WHERE lock_key = k AND live_until > {now} FOR UPDATE;
                 SET top = GREATEST(top, rf), soon = COALESCE(LEAST(soon, held_soon), soon, held_soon);
                 SELECT held, fence INTO own_held, own_order FROM `{shares}`
                     WHERE lock_key = k AND token = tok AND live_until > {now};
                 IF own_held = 0 THEN
                     SET own_place = own_order;
                 END IF;
                 -- Held already: extended, with its fence.
                 IF holder = 1 AND rt = tok THEN
                     UPDATE `{leases}` SET live_until = {now} + INTERVAL us MICROSECOND
                         WHERE lock_key = k AND token = tok;
                     COMMIT;
                     SELECT {GRANTED}, rf;
                     LEAVE body;
                 END IF;
                 IF own_held = 1 THEN
                     UPDATE `{shares}` SET live_until = {now} + INTERVAL us MICROSECOND
                         WHERE lock_key = k AND token = tok AND held = 1;
                     {gate_up}
                     COMMIT;
                     SELECT {GRANTED}, own_order;
                     LEAVE body;
                 END IF;
                 IF m = {shared} THEN
                     SELECT limit_n INTO other_limit FROM `{shares}`
                         WHERE lock_key = k AND token <> tok AND live_until > {now} AND mode = {shared}
                             AND limit_n <> n LIMIT 1;
                     IF other_limit IS NOT NULL THEN
                         ROLLBACK;
                         SELECT {CONFLICT}, other_limit;
                         LEAVE body;
                     END IF;
                     -- Held by a writer, or a writer waiting ahead: refused.
                     SELECT holder + COUNT(*) INTO blocked FROM `{shares}`
                         WHERE lock_key = k AND token <> tok AND live_until > {now}
                             AND ((held = 1 AND mode <> {shared})
                                  OR (held = 0 AND mode = {writer} AND (own_place IS NULL OR fence < own_place)));
                     SELECT w + COALESCE(SUM(weight), 0) INTO taken FROM `{shares}`
                         WHERE lock_key = k AND token <> tok AND live_until > {now} AND mode = {shared}
                             AND (held = 1 OR own_place IS NULL OR fence < own_place);
                     SET blocked = blocked > 0 OR taken > n;
                 ELSE
                     SELECT holder + COUNT(*) INTO blocked FROM `{shares}`
                         WHERE lock_key = k AND token <> tok AND live_until > {now} AND held = 1;
                 END IF;
                 IF blocked = 0 THEN
                     SET f = top + 1;
                     IF m = {shared} THEN
                         {upsert_held}
                         {gate_up_f}
                     ELSE
                         UPDATE `{leases}` SET token = tok, fence = f, label = lbl,
                             live_until = {now} + INTERVAL us MICROSECOND, session = NULL WHERE lock_key = k;
                         DELETE FROM `{shares}` WHERE lock_key = k AND token = tok;
                     END IF;
                     COMMIT;
                     SELECT {GRANTED}, f;
                 ELSEIF reserve = 1 THEN
                     SET f = COALESCE(own_place, top + 1);
                     {upsert_place}
                     COMMIT;
                     SELECT {BUSY}, soon;
                 ELSE
                     ROLLBACK;
                     SELECT {BUSY}, soon;
                 END IF;
             END body",
            head = head.replacen("BEGIN", "body: BEGIN", 1),
            shared = MODE_SHARED,
            writer = MODE_WRITER,
            gate_up = gate_to_shares("own_order"),
            gate_up_f = gate_to_shares("f"),
            upsert_held = upsert(1),
            upsert_place = upsert(0),
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
            acquire_call: format!("CALL `{acquire}`(?, ?, ?, ?, ?, ?, ?, ?)"),
            release_call: format!("CALL `{release}`(?, ?)"),
            procedures: [(acquire, create_acquire), (release, create_release)],
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

    /// The shared acquire of `ask` in one call: what it decided, or `None`
    /// when the transaction decides (a key without a row, or with a row of
    /// a session: nothing changed) or the procedures cannot be called (no
    /// longer used by this client).
    ///
    /// # Cancel safety
    ///
    /// One statement whose transaction commits inside it: dropped, the
    /// server committed it or rolls it back with the connection.
    pub(super) async fn acquire(
        &self,
        conn: &mut Conn,
        ask: &Ask<'_>,
        label: &str,
    ) -> mysql_async::Result<Option<Shared>> {
        let (code, weight, limit) = admission::encode(ask.mode);
        let (key, token) = (ask.key.as_bytes(), ask.token.to_bytes());
        let ttl_us = i64::try_from(ask.ttl.as_micros()).unwrap_or(i64::MAX);
        let params = (key, &token[..], code, weight, limit, label, ttl_us, u8::from(ask.reserve));
        let answer = conn.exec_first::<(u8, Option<u64>), _, _>(self.acquire_call.as_str(), params).await;
        let asked = ask.mode.limit().unwrap_or(UNLIMITED);
        Ok(match self.answer(answer)?.flatten() {
            Some((GRANTED, Some(fence))) => Some(Shared::Granted(fence)),
            Some((BUSY, left)) => Some(Shared::Busy(left.map(Duration::from_micros))),
            Some((CONFLICT, Some(held))) => {
                let held = u32::try_from(held).unwrap_or(UNLIMITED);
                Some(Shared::Conflict(admission::conflict_reason(asked, held)))
            }
            _ => None,
        })
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
