//! Counting what reaches the store: the store's own command counter where it
//! has one, and holdfast's `Backend` calls for every store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use holdfast::backend::{AcquireRequest, Backend, Grant, LockStatus, RenewRequest};
use holdfast::{Capabilities, LockKey, OwnerToken, Result};

/// Commands a store has executed so far, by command name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandCounts(pub BTreeMap<String, u64>);

impl CommandCounts {
    /// All commands.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// What ran between `earlier` and `self`, by command (zero counts left out).
    pub fn since(&self, earlier: &CommandCounts) -> CommandCounts {
        CommandCounts(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v.saturating_sub(earlier.0.get(k).copied().unwrap_or(0))))
                .filter(|(_, v)| *v > 0)
                .collect(),
        )
    }

    /// Calls of script commands (`eval`, `evalsha`, `fcall` and their `_ro` forms).
    pub fn scripts(&self) -> u64 {
        self.0.iter().filter(|(k, _)| is_script(k)).map(|(_, v)| v).sum()
    }

    /// Client requests (round trips): script calls, `SET`, pub/sub and
    /// connection commands. Redis counts the commands a script runs inside
    /// the server too (`get`, `del`, `hset`, `publish`, ...); those are not
    /// requests and are left out. This assumes `SET` is only ever sent by
    /// clients, never from a script, which holds for every subject measured
    /// here (holdfast's scripts use hashes; the floor and the peers send
    /// `SET NX PX` themselves).
    pub fn requests(&self) -> u64 {
        self.0.iter().filter(|(k, _)| is_request(k)).map(|(_, v)| v).sum()
    }
}

fn is_script(name: &str) -> bool {
    name.starts_with("eval") || name.starts_with("fcall")
}

fn is_request(name: &str) -> bool {
    is_script(name)
        || name.starts_with("script|")
        || name.starts_with("client|")
        || name.ends_with("subscribe")
        || matches!(name, "set" | "ping" | "hello" | "auth" | "select" | "multi" | "exec")
}

/// A store-side count of the commands the store has executed, read on a
/// connection of its own. Deltas between two snapshots give commands per
/// acquisition (the snapshot's own commands are not counted).
#[async_trait]
pub trait CommandCounter: Send + Sync {
    /// Commands executed by the store so far.
    async fn snapshot(&self) -> Result<CommandCounts>;
}

/// A snapshot of `counter`, if there is one.
pub(crate) async fn snapshot(counter: Option<&dyn CommandCounter>) -> Result<Option<CommandCounts>> {
    match counter {
        Some(c) => c.snapshot().await.map(Some),
        None => Ok(None),
    }
}

/// The command counter of the store `url` names, or `None` when the store
/// cannot count its commands (reported as n/a). Redis: the `calls` of
/// `INFO commandstats`, less the `INFO` calls themselves. Redis also counts
/// the commands a Lua script runs (`redis.call`), so a script that reads and
/// deletes one key counts as 3 commands in 1 round trip; see
/// [`CommandCounts::scripts`].
pub async fn command_counter_for(url: &str) -> Result<Option<Box<dyn CommandCounter>>> {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase()).unwrap_or_default();
    match scheme.as_str() {
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+cluster" => {
            Ok(Some(Box::new(redis_counter::RedisCommandCounter::connect(url).await?)))
        }
        _ => Ok(None),
    }
}

#[cfg(feature = "redis")]
mod redis_counter {
    use super::*;

    /// `INFO commandstats` on a plain connection of its own; on a cluster,
    /// summed over every master.
    pub(super) enum RedisCommandCounter {
        Plain(tokio::sync::Mutex<redis::aio::MultiplexedConnection>),
        Cluster(tokio::sync::Mutex<redis::cluster_async::ClusterConnection>),
    }

    impl RedisCommandCounter {
        pub(super) async fn connect(url: &str) -> Result<Self> {
            if url.split_once("://").is_some_and(|(s, _)| s.eq_ignore_ascii_case("redis+cluster")) {
                let conn = crate::floor::redis::cluster_connection(url).await?;
                return Ok(RedisCommandCounter::Cluster(tokio::sync::Mutex::new(conn)));
            }
            let conn = crate::floor::redis::plain_connection(url).await?;
            Ok(RedisCommandCounter::Plain(tokio::sync::Mutex::new(conn)))
        }
    }

    #[async_trait]
    impl CommandCounter for RedisCommandCounter {
        async fn snapshot(&self) -> Result<CommandCounts> {
            let info = redis::cmd("INFO").arg("commandstats").clone();
            match self {
                RedisCommandCounter::Plain(conn) => {
                    let mut conn = conn.lock().await;
                    let info: String = crate::floor::redis::timed(info.query_async(&mut *conn)).await?;
                    Ok(parse_calls(&info))
                }
                RedisCommandCounter::Cluster(conn) => {
                    // INFO goes to every master: one reply per node address.
                    let mut conn = conn.lock().await;
                    let per_node: std::collections::HashMap<String, String> =
                        crate::floor::redis::timed(info.query_async(&mut *conn)).await?;
                    let mut sum = CommandCounts::default();
                    for info in per_node.values() {
                        for (name, calls) in parse_calls(info).0 {
                            *sum.0.entry(name).or_default() += calls;
                        }
                    }
                    Ok(sum)
                }
            }
        }
    }

    /// `calls=` of every `cmdstat_<name>` line, except `cmdstat_info`.
    pub(super) fn parse_calls(info: &str) -> CommandCounts {
        CommandCounts(
            info.lines()
                .filter_map(|l| l.trim().strip_prefix("cmdstat_"))
                .filter_map(|l| l.split_once(":calls="))
                .filter(|(name, _)| *name != "info")
                .filter_map(|(name, rest)| Some((name.to_owned(), rest.split(',').next()?.parse::<u64>().ok()?)))
                .collect(),
        )
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn sums_calls_without_info() {
            let info = "# Commandstats\r\ncmdstat_set:calls=10,usec=5,usec_per_call=0.5\r\n\
                        cmdstat_info:calls=3,usec=1\r\ncmdstat_evalsha:calls=7,usec=9\r\n";
            let counts = super::parse_calls(info);
            assert_eq!(counts.total(), 17);
            assert_eq!(counts.scripts(), 7);
            assert_eq!(counts.requests(), 17);
            let inner = super::parse_calls("cmdstat_evalsha:calls=2\ncmdstat_get:calls=2\ncmdstat_subscribe:calls=1");
            assert_eq!((inner.total(), inner.requests()), (5, 3));
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
    /// Since the last [`CountingBackend::take_renew_peaks`].
    largest_renew_batch: AtomicU64,
    longest_renew_us: AtomicU64,
    renew_busy_us: AtomicU64,
}

/// The largest and longest `renew` calls since the previous
/// [`CountingBackend::take_renew_peaks`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenewPeaks {
    /// Most leases named in one call.
    pub largest_batch: u64,
    /// The longest call, from the call until it returned (or was dropped).
    pub longest_call: Duration,
}

/// Times one `renew` call, also when the caller drops it (a timed-out renewal).
struct RenewTimer<'a> {
    backend: &'a CountingBackend,
    started: Instant,
}

impl Drop for RenewTimer<'_> {
    fn drop(&mut self) {
        let us = self.started.elapsed().as_micros() as u64;
        self.backend.longest_renew_us.fetch_max(us, Ordering::Relaxed);
        self.backend.renew_busy_us.fetch_add(us, Ordering::Relaxed);
    }
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
            largest_renew_batch: AtomicU64::new(0),
            longest_renew_us: AtomicU64::new(0),
            renew_busy_us: AtomicU64::new(0),
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

    /// Time spent in `renew` calls so far, summed over calls (calls that
    /// overlap count twice).
    pub fn renew_busy(&self) -> Duration {
        Duration::from_micros(self.renew_busy_us.load(Ordering::Relaxed))
    }

    /// The largest and longest `renew` calls since the previous call of this
    /// method (or since the start), and starts counting them afresh. A call
    /// still running counts when it returns.
    pub fn take_renew_peaks(&self) -> RenewPeaks {
        RenewPeaks {
            largest_batch: self.largest_renew_batch.swap(0, Ordering::Relaxed),
            longest_call: Duration::from_micros(self.longest_renew_us.swap(0, Ordering::Relaxed)),
        }
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

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        self.acquires.fetch_add(1, Ordering::Relaxed);
        self.inner.try_acquire(req).await
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
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
        self.largest_renew_batch.fetch_max(leases.len() as u64, Ordering::Relaxed);
        let _timer = RenewTimer { backend: self, started: Instant::now() };
        self.inner.renew(leases).await
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        self.inner.status(key).await
    }
}
