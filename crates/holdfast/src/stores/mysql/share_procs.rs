//! The server-side release of a granted share: one `CALL` where the
//! shares' transaction (`shares::release`) takes six round trips with the
//! key's lease row locked across four of them.
//!
//! The procedure runs that transaction's granted path, the same statements
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
//! Creating it needs `CREATE ROUTINE` on the database, and calling it
//! `EXECUTE` (which its creator is given). A client whose user has neither,
//! or whose server refuses the procedure in any other way, keeps the
//! transaction (`SQL SECURITY INVOKER`: the procedure never reaches a table
//! its caller could not). The name carries a version: a later change of the
//! body gets a new name, so clients of different versions never run each
//! other's.

use std::sync::atomic::{AtomicBool, Ordering};

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use super::shares::GATE_LITERAL;

/// Server errors after which the procedure is not used again by this
/// client: `ER_PROCACCESS_DENIED_ERROR` (no `EXECUTE`) and
/// `ER_SP_DOES_NOT_EXIST` (dropped since).
const GONE: [u16; 2] = [1370, 1305];

/// The procedure of a namespace, and whether this client calls it.
#[derive(Debug)]
pub(super) struct ShareProcs {
    name: String,
    create: String,
    release_call: String,
    usable: AtomicBool,
}

impl ShareProcs {
    /// The procedure over `<leases>` and `<shares>` of namespace `ns` (a
    /// checked name of at most 48 bytes: the procedure's stays within 64).
    pub(super) fn new(ns: &str, leases: &str, shares: &str) -> Self {
        let name = format!("{ns}_share_release1");
        let now = "UTC_TIMESTAMP(6)";
        let create = format!(
            "CREATE PROCEDURE `{name}`(IN k VARBINARY(256), IN tok BINARY(16))
             MODIFIES SQL DATA SQL SECURITY INVOKER
             COMMENT 'holdfast: the release of a granted share (see the MySQL store docs)'
             BEGIN
                 DECLARE locked INT DEFAULT 0;
                 DECLARE latest DATETIME(6) DEFAULT NULL;
                 -- Never leave the caller's connection inside a transaction.
                 DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
                 START TRANSACTION;
                 SELECT COUNT(*) INTO locked FROM `{leases}` WHERE lock_key = k FOR UPDATE;
                 DELETE FROM `{shares}` WHERE lock_key = k AND token = tok AND held = 1 AND live_until > {now};
                 IF ROW_COUNT() = 1 THEN
                     SELECT MAX(live_until) INTO latest FROM `{shares}`
                         WHERE lock_key = k AND held = 1 AND live_until > {now} FOR UPDATE;
                     UPDATE `{leases}` SET live_until = COALESCE(latest, '1970-01-01')
                         WHERE lock_key = k AND token = {GATE_LITERAL};
                     COMMIT;
                     SELECT 1;
                 ELSE
                     ROLLBACK;
                     SELECT 0;
                 END IF;
             END"
        );
        let release_call = format!("CALL `{name}`(?, ?)");
        ShareProcs { name, create, release_call, usable: AtomicBool::new(false) }
    }

    /// Creates the procedure if the namespace has none, and marks it usable
    /// if it is there afterwards. A refusal is not an error: the client
    /// keeps the transaction.
    pub(super) async fn install(&self, conn: &mut Conn) -> mysql_async::Result<()> {
        let there = "SELECT 1 FROM information_schema.ROUTINES
                     WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = ? AND ROUTINE_TYPE = 'PROCEDURE'";
        let found: Option<u8> = conn.exec_first(there, (self.name.as_str(),)).await?;
        let usable = match found {
            Some(_) => true,
            None => match conn.query_drop(self.create.as_str()).await {
                Ok(()) => true,
                // ER_SP_ALREADY_EXISTS: another client created it meanwhile.
                Err(mysql_async::Error::Server(e)) if e.code == 1304 => true,
                Err(mysql_async::Error::Server(e)) => {
                    tracing::debug!(
                        procedure = self.name,
                        code = e.code,
                        "share releases stay transactions: the server refused the procedure ({})",
                        e.message
                    );
                    false
                }
                Err(other) => return Err(other),
            },
        };
        self.usable.store(usable, Ordering::Relaxed);
        Ok(())
    }

    /// Whether this client calls the procedure.
    pub(super) fn usable(&self) -> bool {
        self.usable.load(Ordering::Relaxed)
    }

    /// Releases `token`'s granted share of `key` in one call: `Some(true)`
    /// if it was held and unexpired and is gone, with the gate moved down;
    /// `Some(false)` if there was no such share (nothing changed); `None`
    /// if the procedure cannot be called (no longer used by this client).
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
        match conn.exec_first::<u8, _, _>(self.release_call.as_str(), (key, &token[..])).await {
            Ok(answer) => Ok(Some(answer == Some(1))),
            Err(mysql_async::Error::Server(e)) if GONE.contains(&e.code) => {
                tracing::debug!(procedure = self.name, code = e.code, "share releases back to transactions");
                self.usable.store(false, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}
