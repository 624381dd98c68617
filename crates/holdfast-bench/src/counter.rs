//! Counting what reaches the store: the store's own command counter where it
//! has one, and holdfast's `Backend` calls for every store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use holdfast::backend::{AcquireRequest, Backend, Grant, LockStatus, RenewRequest};
use holdfast::{Capabilities, LockKey, OwnerToken, Result};

/// A store-side count of the commands the store has executed, read on a
/// connection of its own. Deltas between two snapshots give commands per
/// acquisition (the snapshot's own commands are not counted).
#[async_trait]
pub trait CommandCounter: Send + Sync {
    /// Commands executed by the store so far.
    async fn snapshot(&self) -> Result<u64>;
}

/// The command counter of the store `url` names, or `None` when the store
/// cannot count its commands (reported as n/a). Redis: the sum of `calls` in
/// `INFO commandstats`, less the `INFO` calls themselves.
pub async fn command_counter_for(url: &str) -> Result<Option<Box<dyn CommandCounter>>> {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase()).unwrap_or_default();
    match scheme.as_str() {
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(Some(Box::new(redis_counter::RedisCommandCounter::connect(url).await?))),
        _ => Ok(None),
    }
}

#[cfg(feature = "redis")]
mod redis_counter {
    use super::*;

    /// `INFO commandstats` on a plain connection of its own.
    pub(super) struct RedisCommandCounter {
        conn: tokio::sync::Mutex<redis::aio::MultiplexedConnection>,
    }

    impl RedisCommandCounter {
        pub(super) async fn connect(url: &str) -> Result<Self> {
            let conn = crate::floor::redis::plain_connection(url).await?;
            Ok(RedisCommandCounter { conn: tokio::sync::Mutex::new(conn) })
        }
    }

    #[async_trait]
    impl CommandCounter for RedisCommandCounter {
        async fn snapshot(&self) -> Result<u64> {
            let mut conn = self.conn.lock().await;
            let info: String =
                crate::floor::redis::timed(redis::cmd("INFO").arg("commandstats").query_async(&mut *conn)).await?;
            Ok(sum_calls(&info))
        }
    }

    /// Sums `calls=` over `cmdstat_*` lines, except `cmdstat_info`.
    pub(super) fn sum_calls(info: &str) -> u64 {
        info.lines()
            .filter_map(|l| l.trim().strip_prefix("cmdstat_"))
            .filter(|l| !l.starts_with("info:"))
            .filter_map(|l| l.split_once(":calls=").map(|(_, rest)| rest))
            .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .sum()
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn sums_calls_without_info() {
            let info = "# Commandstats\r\ncmdstat_set:calls=10,usec=5,usec_per_call=0.5\r\n\
                        cmdstat_info:calls=3,usec=1\r\ncmdstat_evalsha:calls=7,usec=9\r\n";
            assert_eq!(super::sum_calls(info), 17);
        }
    }
}

/// A [`Backend`] wrapper that counts the calls holdfast makes to the store,
/// so that renewal round trips are measured the same way on every store.
#[derive(Debug)]
pub struct CountingBackend {
    inner: Arc<dyn Backend>,
    acquires: AtomicU64,
    releases: AtomicU64,
    renews: AtomicU64,
    renewed_leases: AtomicU64,
}

impl CountingBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        CountingBackend {
            inner,
            acquires: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            renews: AtomicU64::new(0),
            renewed_leases: AtomicU64::new(0),
        }
    }

    /// Calls of `acquire` so far.
    pub fn acquires(&self) -> u64 {
        self.acquires.load(Ordering::Relaxed)
    }

    /// Calls of `release` so far.
    pub fn releases(&self) -> u64 {
        self.releases.load(Ordering::Relaxed)
    }

    /// Calls of `renew` so far (each is one batch).
    pub fn renews(&self) -> u64 {
        self.renews.load(Ordering::Relaxed)
    }

    /// Leases named in all `renew` calls so far.
    pub fn renewed_leases(&self) -> u64 {
        self.renewed_leases.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl Backend for CountingBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        self.acquires.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire(req).await
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        self.releases.fetch_add(1, Ordering::Relaxed);
        self.inner.release(key, token).await
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        self.renews.fetch_add(1, Ordering::Relaxed);
        self.renewed_leases.fetch_add(leases.len() as u64, Ordering::Relaxed);
        self.inner.renew(leases).await
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        self.inner.status(key).await
    }
}
