//! The sweep: rows released or expired more than a minute ago deleted, a
//! few at a time (and session rows lapsed a minute ago), by each client as it releases, with the namespace's fence
//! counter raised to what it deletes (model `mysql_fence`). Each client
//! walks the lease table's primary key from where its last step stopped;
//! there is no index on the expiry, which every grant, release and renewal
//! writes.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, TxOpts, Value};

use super::MysqlBackend;
use super::sql::{SWEEP_ROWS, SWEEP_WINDOW, Statements};
use crate::vocabulary::error::Result;

/// Least time between two sweeps of long-expired rows by one client.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Where one client's sweep is in its walk over the lease table.
#[derive(Debug, Default)]
pub(super) struct SweepWalk {
    /// When the last sweep started.
    last: Option<Instant>,
    /// The key the last sweep stopped at (empty: the start).
    from: Vec<u8>,
}

impl MysqlBackend {
    /// One step of the sweep: reads the next 256 rows of the lease table in
    /// key order (from where this client's last step stopped, starting over
    /// after the last), and deletes up to 32 of them that were released or
    /// expired more than a minute ago (their keys unused since), raising the
    /// namespace's fence counter to the highest fence deleted; returns how
    /// many it deleted. About once a second, a release runs a step in the
    /// background, so the lease table holds about one row per key used in
    /// the last minutes without a separate cleanup job.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read, then one transaction that either committed or
    /// did not; it only deletes rows released or expired long ago. A step
    /// dropped before it ends leaves this client's walk where it was.
    pub async fn sweep_expired(&self) -> Result<u64> {
        let mut walk = self.sweep_turn.lock().await;
        self.sweep_step(&mut walk).await
    }

    pub(super) async fn sweep_step(&self, walk: &mut SweepWalk) -> Result<u64> {
        let (deleted, next) = self
            .timed(async |op| {
                let mut conn = op.conn().await?;
                let swept = sweep_rows(&mut conn, &self.sql, &walk.from).await?;
                // Session rows lapsed a minute ago (see `session_rows`).
                conn.query_drop(self.sql.sessions.sweep.as_str()).await?;
                Ok(swept)
            })
            .await?;
        walk.from = next;
        Ok(deleted)
    }

    /// Best effort, in the background so that it can never delay or fail a
    /// release: a step of the sweep. A step that finds the previous one
    /// still running (a slow server) or that comes within `SWEEP_EVERY` of
    /// it is skipped, so sweeps never queue up on the server.
    pub(super) fn maybe_sweep(&self) {
        let Ok(mut walk) = self.sweep_turn.clone().try_lock_owned() else { return };
        if walk.last.is_some_and(|t| t.elapsed() < SWEEP_EVERY) {
            return;
        }
        walk.last = Some(Instant::now());
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.sweep_step(&mut walk).await {
                tracing::debug!(error = %e, "sweep of long-expired rows failed");
            }
        });
    }
}

/// One step of the sweep: reads the next 256 rows in key order after
/// `from` (the key the last step stopped at; empty: from the start), and
/// deletes up to 32 of them that were released or expired more than a
/// minute ago, raising the namespace's counter to the highest fence deleted,
/// in one transaction (the counter's lock first, as every transaction that
/// takes it): the next grant of such a key draws from the counter, above
/// every fence the key had (model `mysql_fence`, variant
/// `SweepWithoutRaise`). Returns the rows deleted and where the next step
/// starts (empty after the last window: the walk starts over).
///
/// The rows are found by a plain read, then locked by primary key, so that
/// the sweep locks nothing but the rows it deletes. As one `DELETE ...
/// WHERE expires_at < ... LIMIT n` over an expiry index, each sweep held a
/// next-key lock on the oldest live lease's index entry while it scanned;
/// with 100,000 leases renewed, the index fills with entries that purge has
/// not yet removed, a sweep scanned (and locked) them for seconds, and
/// renewals queued behind it until leases expired.
async fn sweep_rows(conn: &mut Conn, s: &Statements, from: &[u8]) -> mysql_async::Result<(u64, Vec<u8>)> {
    let window: Vec<(Vec<u8>, u8)> = conn.exec(s.sweep_find.as_str(), (from,)).await?;
    let mut next = if window.len() == SWEEP_WINDOW { window.last().map(|(k, _)| k.clone()) } else { None };
    let mut keys: Vec<Vec<u8>> = Vec::new();
    for (key, old) in window {
        if old == 1 {
            keys.push(key);
            if keys.len() == SWEEP_ROWS {
                next = keys.last().cloned();
                break;
            }
        }
    }
    let next = next.unwrap_or_default();
    let Some(last) = keys.last().cloned() else { return Ok((0, next)) };
    keys.resize(SWEEP_ROWS, last);
    let keys = || Params::Positional(keys.iter().cloned().map(Value::Bytes).collect());
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    tx.exec_drop(s.lock_counter.as_str(), ()).await?;
    let highest: Option<u64> = tx.exec_first(s.sweep_fence.as_str(), keys()).await?;
    tx.exec_drop(s.raise_counter.as_str(), (highest.unwrap_or(0),)).await?;
    tx.exec_drop(s.sweep_count.as_str(), keys()).await?;
    tx.exec_drop(s.sweep_delete.as_str(), keys()).await?;
    let deleted = tx.affected_rows();
    tx.commit().await?;
    Ok((deleted, next))
}
