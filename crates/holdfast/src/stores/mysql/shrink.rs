//! Shrinking a held lease in place ([`Backend::shrink`]) on MySQL/MariaDB:
//! a writer's lease (the key's lease row, held by its token) becomes a held
//! share behind the key's gate (the same row, made the gate by
//! `shares`, keeping the lease's own expiry, which is the share's), or a held share takes a smaller
//! weight. One transaction that first locks the namespace's fence counter,
//! as every grant and gate change does, so no grant of the key runs between
//! the two modes.
//!
//! [`Backend::shrink`]: crate::backend::Backend::shrink

use mysql_async::TxOpts;
use mysql_async::prelude::Queryable;

use super::MysqlBackend;
use super::session_rows::{SessionSql, until_sql};
use crate::backend::LeaseMode;
use crate::backend::admission::{self, Shrink};
use crate::vocabulary::error::Result;
use crate::vocabulary::key::{LockKey, OwnerToken};

impl MysqlBackend {
    /// [`Backend::shrink`](crate::backend::Backend::shrink).
    ///
    /// # Cancel safety
    ///
    /// One transaction: dropped, it committed or the server rolls it back
    /// when the connection is dropped.
    pub(super) async fn shrink_lease(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        let (l, f, s) = (self.config.leases_table(), self.config.fence_table(), self.config.shares_table());
        let now = "UTC_TIMESTAMP(6)";
        // Until when the lease row is held (its session's expiry for a row
        // of a session): the share keeps it as its own expiry.
        let u = until_sql("l", &SessionSql::table(&self.config.sessions_table()));
        let lock_counter = format!("SELECT value FROM `{f}` WHERE id = 0 FOR UPDATE");
        let own_lease = format!("SELECT 1 FROM `{l}` AS l WHERE lock_key = ? AND token = ? AND {u} > {now} FOR UPDATE");
        // The lease row's grant, copied into a held share: its fence, label and expiry.
        let lease_to_share = format!(
            "INSERT INTO `{s}` (lock_key, token, mode, weight, limit_n, held, fence, label, live_until)
             SELECT lock_key, token, ?, ?, ?, 1, fence, label, {u} FROM `{l}` AS l WHERE lock_key = ? AND token = ?
             ON DUPLICATE KEY UPDATE mode = VALUES(mode), weight = VALUES(weight), limit_n = VALUES(limit_n),
                 held = 1, fence = VALUES(fence), label = VALUES(label), live_until = VALUES(live_until)"
        );
        let own_share = format!(
            "SELECT mode, weight, limit_n FROM `{s}`
             WHERE lock_key = ? AND token = ? AND held = 1 AND live_until > {now} FOR UPDATE"
        );
        let set_weight = format!("UPDATE `{s}` SET weight = ? WHERE lock_key = ? AND token = ?");
        let (k, tok) = (key.as_str().as_bytes(), token.to_bytes());
        // A deadlock victim was rolled back whole: trying again is safe.
        let outcome = self
            .retry_contention(|| {
                self.timed(async |op| {
                    let mut conn = op.conn().await?;
                    let mut tx = conn.start_transaction(TxOpts::default()).await?;
                    tx.exec_drop(lock_counter.as_str(), ()).await?;
                    let exclusive: Option<u8> = tx.exec_first(own_lease.as_str(), (k, &tok[..])).await?;
                    let held = match exclusive {
                        Some(_) => LeaseMode::Exclusive,
                        None => match tx.exec_first::<(u8, u64, u64), _, _>(own_share.as_str(), (k, &tok[..])).await? {
                            Some((m, w, n)) => admission::decode(m.into(), w as i64, n as i64),
                            None => {
                                tx.rollback().await?;
                                return Ok(Shrink::NotHeld);
                            }
                        },
                    };
                    let smaller = match admission::shrunk(held, to) {
                        Ok(mode) => mode,
                        Err(reason) => {
                            tx.rollback().await?;
                            return Ok(Shrink::NotSmaller(reason));
                        }
                    };
                    if held.is_exclusive() {
                        let (code, weight, limit) = admission::encode(smaller);
                        tx.exec_drop(lease_to_share.as_str(), (code, weight, limit, k, &tok[..])).await?;
                        self.shares.lease_to_gate(&mut tx, k, &tok).await?;
                    } else {
                        tx.exec_drop(set_weight.as_str(), (smaller.weight(), k, &tok[..])).await?;
                    }
                    tx.commit().await?;
                    Ok(Shrink::Shrunk)
                })
            })
            .await?;
        if outcome == Shrink::Shrunk {
            // A mutex lease is now a share of its own expiry, renewed as one.
            self.book().released(token);
            self.share_tokens().insert(token, true);
            // Room was made, as by a release: this process's waiter whose
            // turn it is tries again (other processes poll).
            self.wakeups.wake_one(key.as_str());
        }
        outcome.answer()
    }
}
