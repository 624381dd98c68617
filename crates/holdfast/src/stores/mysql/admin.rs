//! The admin calls on MySQL/MariaDB: the held keys under a prefix, the
//! forced release, a holder's new label and the held shares of a key. The
//! first two build their statements at the call from the namespace's
//! checked table names (admin calls are rare); every value is a bound
//! parameter.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, TxOpts};

use super::MysqlBackend;
use super::session_rows::{self, SessionSql, held_session_sql, until_sql};
use super::shares::{ShareSql, is_gate};
use crate::backend::ForceReleased;
use crate::backend::LockStatus;
use crate::vocabulary::error::Result;
use crate::vocabulary::key::{LockKey, OwnerToken};

impl MysqlBackend {
    /// Every key under `prefix` with an unexpired lease row (an exclusive
    /// holder, or the gate that held shares keep at least as long as
    /// themselves), then each one's status. The read walks the primary key
    /// from the prefix on: O(rows from there), one status read per key.
    pub(super) async fn list_held(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        let l = self.config.leases_table();
        let u = until_sql("l", &SessionSql::table(&self.config.sessions_table()));
        let sql = format!(
            "SELECT lock_key FROM `{l}` AS l WHERE lock_key >= ? AND SUBSTRING(lock_key, 1, ?) = ?
               AND {u} > UTC_TIMESTAMP(6) ORDER BY lock_key"
        );
        let p = prefix.as_bytes();
        let keys: Vec<Vec<u8>> = self
            .timed(async |op| {
                let mut conn = op.conn().await?;
                conn.exec(sql.as_str(), (p, p.len() as u64, p)).await
            })
            .await?;
        crate::backend::held_statuses(self, keys.into_iter().filter_map(|k| String::from_utf8(k).ok())).await
    }

    /// One transaction: the namespace's fence counter locked first (as
    /// every transaction that takes it does, before any row: no deadlock;
    /// no grant of a key without a row until commit), then the key's lease row (the exclusive
    /// holder, or the shares' gate) and its held shares deleted
    /// (reservations stay), and the counter raised to the highest fence
    /// deleted, so the key's next grant, which draws from the counter (the
    /// key has no row), is above every fence it had (model `mysql_fence`,
    /// `ForceWithoutRaise`); the holders' renewals find no row and fail.
    /// Waiters poll and are woken in this process as by a release.
    pub(super) async fn force(&self, key: &LockKey) -> Result<ForceReleased> {
        let (l, f, s) = (self.config.leases_table(), self.config.fence_table(), self.config.shares_table());
        let lock_counter = format!("SELECT value FROM `{f}` WHERE id = 0 FOR UPDATE");
        let (u, hs) = (until_sql("l", &SessionSql::table(&self.config.sessions_table())), held_session_sql("l"));
        let read_lease =
            format!("SELECT token, fence, {u} > UTC_TIMESTAMP(6), {hs} FROM `{l}` AS l WHERE lock_key = ? FOR UPDATE");
        let del_lease = format!("DELETE FROM `{l}` WHERE lock_key = ?");
        let read_shares = format!(
            "SELECT fence, live_until > UTC_TIMESTAMP(6) FROM `{s}` WHERE lock_key = ? AND held = 1 FOR UPDATE"
        );
        let del_shares = format!("DELETE FROM `{s}` WHERE lock_key = ? AND held = 1");
        let raise_counter = format!("UPDATE `{f}` SET value = GREATEST(value, ?) WHERE id = 0");
        let k = key.as_str().as_bytes();
        let out = self
            .retry_contention(|| {
                self.timed(async |op| {
                    let mut conn = op.conn().await?;
                    let mut tx = conn.start_transaction(TxOpts::default()).await?;
                    tx.exec_drop(lock_counter.as_str(), ()).await?;
                    let mut out = ForceReleased::free();
                    let mut highest = 0;
                    type Lease = (Vec<u8>, u64, u8, Option<Vec<u8>>);
                    let lease: Option<Lease> = tx.exec_first(read_lease.as_str(), (k,)).await?;
                    if let Some((token, fence, live, session)) = lease {
                        highest = fence;
                        // Its holder's renewal hears of it (the lease row
                        // is locked: its session row second).
                        if let Some(session) = session {
                            session_rows::count_removal(&mut tx, &self.sql.sessions, &session).await?;
                        }
                        tx.exec_drop(del_lease.as_str(), (k,)).await?;
                        if live == 1 && !is_gate(&token) {
                            out.add(fence, true);
                        }
                    }
                    let shares: Vec<(u64, u8)> = tx.exec(read_shares.as_str(), (k,)).await?;
                    if !shares.is_empty() {
                        tx.exec_drop(del_shares.as_str(), (k,)).await?;
                    }
                    for (fence, live) in shares {
                        highest = highest.max(fence);
                        if live == 1 {
                            out.add(fence, false);
                        }
                    }
                    tx.exec_drop(raise_counter.as_str(), (highest,)).await?;
                    tx.commit().await?;
                    Ok(out)
                })
            })
            .await?;
        for _ in out.fences() {
            self.wakeups.wake_one(key.as_str());
        }
        Ok(out)
    }
}

/// Changes the label of `token`'s live grant or share; true if it had one.
pub(super) async fn relabel(
    conn: &mut Conn,
    q: &ShareSql,
    key: &str,
    token: OwnerToken,
    label: &str,
) -> mysql_async::Result<bool> {
    let label: String = label.chars().take(255).collect();
    let (k, tok) = (key.as_bytes(), token.to_bytes());
    conn.exec_drop(q.relabel_lease.as_str(), (&label, k, &tok[..])).await?;
    if conn.affected_rows() == 1 {
        return Ok(true);
    }
    conn.exec_drop(q.relabel_share.as_str(), (&label, k, &tok[..])).await?;
    if conn.affected_rows() == 1 {
        return Ok(true);
    }
    // MySQL counts a row set to the value it had as unchanged.
    let owns: Option<i64> = conn.exec_first(q.owns.as_str(), (k, &tok[..], k, &tok[..])).await?;
    Ok(owns == Some(1))
}

/// The held shares of `key`: (label, fence, time left, weight, limit).
pub(super) async fn list(
    conn: &mut Conn,
    q: &ShareSql,
    key: &str,
) -> mysql_async::Result<Vec<(String, u64, Duration, u64, u64)>> {
    let rows: Vec<(String, u64, Option<i64>, u64, u64)> = conn.exec(q.list.as_str(), (key.as_bytes(),)).await?;
    Ok(rows
        .into_iter()
        .map(|(l, f, us, w, n)| (l, f, Duration::from_micros(us.unwrap_or(0).max(0) as u64), w, n))
        .collect())
}
