//! What the layered hybrid lock's filter buys: N contending clients on one
//! key over the authoritative store alone, then over
//! `layered://FAST|AUTHORITATIVE`, measured the same way.
//!
//! Each task is a client of its own (its own connections, as a process of
//! its own would be: a client's tasks already take turns for a key, so
//! tasks of one client would hide the contention the filter is for). Each
//! loops acquire (waiting), hold, release for the run. Per subject:
//! acquisitions/s, acquire latency p50/p99 (call to grant), the calls
//! holdfast made to the authoritative store's `Backend` per acquisition and
//! the most `acquire` calls waiting in it at once (a thin counting wrapper
//! that forwards every call to the real store), and the authoritative
//! server's own count per acquisition where it has one: PostgreSQL's
//! committed and rolled back transactions (`pg_stat_database`, read after
//! every client of the run disconnected, so that each backend flushed its
//! statistics, less the connection setup measured alone), ZooKeeper's
//! `zk_packets_received` (`mntr`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use holdfast::backend::{AcquireRequest, Backend, Grant, LockStatus, RenewRequest};
use holdfast::layered::Layered;
use holdfast::{Capabilities, Client, ClientOptions, Error, LockKey, OwnerToken, Result};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::layered_counter::ServerCounter;
use crate::stats::{histogram, quantile_us, record};

/// What [`run_layered`] measures.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayeredOptions {
    /// The fast store's URL (Redis).
    pub fast_url: String,
    /// The authoritative store's URL.
    pub authoritative_url: String,
    /// Contending clients, one task each.
    pub tasks: usize,
    /// How long each subject runs (default 10 s).
    pub duration: Duration,
    /// Time inside the lock per acquisition (default 1 ms).
    pub hold: Duration,
    /// Lock TTL (default 10 s).
    pub ttl: Duration,
}

impl LayeredOptions {
    /// `tasks` clients of the two stores, with the defaults.
    pub fn new(fast_url: impl Into<String>, authoritative_url: impl Into<String>, tasks: usize) -> Self {
        LayeredOptions {
            fast_url: fast_url.into(),
            authoritative_url: authoritative_url.into(),
            tasks,
            duration: Duration::from_secs(10),
            hold: Duration::from_millis(1),
            ttl: Duration::from_secs(10),
        }
    }
}

/// The figures of one subject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayeredSubject {
    /// `authoritative alone` or `layered`.
    pub subject: String,
    /// Contending clients.
    pub tasks: usize,
    /// Acquisitions, all tasks.
    pub acquisitions: u64,
    /// Acquisitions per second.
    pub per_sec: f64,
    /// Acquire latency (call to grant), median, µs.
    pub wait_p50_us: Option<u64>,
    /// Acquire latency, 99th percentile, µs.
    pub wait_p99_us: Option<u64>,
    /// holdfast's calls to the authoritative store's `Backend` per acquisition.
    pub auth_calls_per_acquisition: f64,
    /// The most `acquire` calls waiting in the authoritative store at once.
    pub auth_most_waiting: u64,
    /// The authoritative server's own count per acquisition, if it has one.
    pub auth_server_per_acquisition: Option<f64>,
    /// What that count is.
    pub auth_server_counter: Option<String>,
    /// Times two tasks were inside the lock at once (must be 0).
    pub overlaps: u64,
}

/// The figures of both subjects, same run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayeredResult {
    /// Over the authoritative store alone.
    pub alone: LayeredSubject,
    /// Over `layered://FAST|AUTHORITATIVE`.
    pub layered: LayeredSubject,
}

/// Runs the authoritative store alone, then the layered lock, on fresh keys.
///
/// # Cancel safety
///
/// Not cancel-safe: dropped mid-run, the locks held are released in the
/// background or expire.
pub async fn run_layered(opts: &LayeredOptions) -> Result<LayeredResult> {
    if opts.tasks == 0 {
        return Err(Error::invalid("tasks", "run at least 1 task"));
    }
    let counter = ServerCounter::connect(&opts.authoritative_url).await?;
    let setup = match &counter {
        Some(c) => Some(setup_cost(c, opts).await?),
        None => None,
    };
    let alone = run_subject(opts, false, counter.as_ref(), setup).await?;
    let layered = run_subject(opts, true, counter.as_ref(), setup).await?;
    Ok(LayeredResult { alone, layered })
}

/// The clients of one subject: each task's client, and the counting
/// wrapper of its authoritative store.
pub(crate) async fn connect_clients(opts: &LayeredOptions, layered: bool, gauge: &Arc<Gauge>) -> Result<Vec<Client>> {
    let mut clients = Vec::with_capacity(opts.tasks);
    for _ in 0..opts.tasks {
        let auth: Arc<dyn Backend> = Arc::new(Counted {
            inner: holdfast::stores::connect(&opts.authoritative_url).await?,
            gauge: gauge.clone(),
        });
        let backend: Arc<dyn Backend> = if layered {
            Arc::new(Layered::new(holdfast::stores::connect(&opts.fast_url).await?, auth)?)
        } else {
            auth
        };
        clients.push(Client::with_backend(backend, ClientOptions::default().with_label("holdfast-bench-layered")));
    }
    Ok(clients)
}

async fn run_subject(
    opts: &LayeredOptions,
    layered: bool,
    counter: Option<&ServerCounter>,
    setup: Option<u64>,
) -> Result<LayeredSubject> {
    let gauge = Arc::new(Gauge::default());
    let before = match counter {
        Some(c) => Some(c.snapshot().await?),
        None => None,
    };
    let clients = connect_clients(opts, layered, &gauge).await?;
    let key = format!("bench/layered/{layered}/{:x}", rand_suffix());
    let (stop, holder, overlaps) =
        (CancellationToken::new(), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU64::new(0)));
    let calls0 = gauge.calls.load(Ordering::Relaxed);
    let start = Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(id, c)| {
            let mutex = c.mutex(key.clone()).ttl(opts.ttl);
            let (stop, holder, overlaps, hold) = (stop.clone(), holder.clone(), overlaps.clone(), opts.hold);
            tokio::spawn(async move {
                let (mut waits, mut count) = (histogram()?, 0u64);
                while !stop.is_cancelled() {
                    let asked = Instant::now();
                    let guard = tokio::select! {
                        biased;
                        _ = stop.cancelled() => break,
                        g = mutex.acquire() => g?,
                    };
                    record(&mut waits, asked.elapsed());
                    if holder.swap(id + 1, Ordering::AcqRel) != 0 {
                        overlaps.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(hold).await;
                    if holder.compare_exchange(id + 1, 0, Ordering::AcqRel, Ordering::Acquire).is_err() {
                        overlaps.fetch_add(1, Ordering::Relaxed);
                    }
                    guard.release().await?;
                    count += 1;
                }
                Ok::<_, Error>((waits, count))
            })
        })
        .collect();
    tokio::time::sleep(opts.duration).await;
    stop.cancel();
    let mut all = histogram()?;
    let mut acquisitions = 0;
    for t in tasks {
        let (waits, count) = t.await.map_err(|e| Error::backend("holdfast-bench", false, e))??;
        all.add(&waits).map_err(|e| Error::backend("holdfast-bench", false, e))?;
        acquisitions += count;
    }
    let elapsed = start.elapsed();
    let calls = gauge.calls.load(Ordering::Relaxed) - calls0;
    drop(clients);
    let server = match (counter, before) {
        (Some(c), Some(before)) => {
            c.settle().await?;
            let after = c.snapshot().await?;
            Some(after.saturating_sub(before).saturating_sub(setup.unwrap_or(0)))
        }
        _ => None,
    };
    let per_acq = |n: u64| n as f64 / acquisitions.max(1) as f64;
    Ok(LayeredSubject {
        subject: if layered { "layered" } else { "authoritative alone" }.to_owned(),
        tasks: opts.tasks,
        acquisitions,
        per_sec: acquisitions as f64 / elapsed.as_secs_f64().max(1e-9),
        wait_p50_us: quantile_us(&all, 0.5),
        wait_p99_us: quantile_us(&all, 0.99),
        auth_calls_per_acquisition: per_acq(calls),
        auth_most_waiting: gauge.most.load(Ordering::Relaxed),
        auth_server_per_acquisition: server.map(per_acq),
        auth_server_counter: counter.map(|c| c.describe().to_owned()),
        overlaps: overlaps.load(Ordering::Relaxed),
    })
}

fn rand_suffix() -> u64 {
    OwnerToken::random().to_bytes().iter().take(8).fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// Calls to the authoritative stores of one subject's clients, and the
/// `acquire` calls waiting in them now and at most.
#[derive(Debug, Default)]
pub(crate) struct Gauge {
    calls: AtomicU64,
    waiting: AtomicU64,
    most: AtomicU64,
}

/// Forwards every call to the real store, counting it in a [`Gauge`].
#[derive(Debug)]
struct Counted {
    inner: Arc<dyn Backend>,
    gauge: Arc<Gauge>,
}

/// Counts one `acquire` out of the store when dropped (returned or cancelled).
struct Waiting<'a>(&'a Gauge);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Backend for Counted {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        self.gauge.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.try_acquire(req).await
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        self.gauge.calls.fetch_add(1, Ordering::Relaxed);
        let now = self.gauge.waiting.fetch_add(1, Ordering::Relaxed) + 1;
        self.gauge.most.fetch_max(now, Ordering::Relaxed);
        let _waiting = Waiting(&self.gauge);
        self.inner.acquire(req).await
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        self.gauge.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.release(key, token).await
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        self.gauge.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(leases).await
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        self.gauge.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.status(key).await
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        self.gauge.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.resize(key, limit).await
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        self.gauge.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.relabel(key, token, label).await
    }

    async fn raise_fence(&self, key: &LockKey, token: OwnerToken, floor: u64) -> Result<bool> {
        self.gauge.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.raise_fence(key, token, floor).await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<u64>> {
        self.gauge.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.read_record(key).await
    }

    async fn write_record(&self, key: &LockKey, token: OwnerToken, value: u64) -> Result<bool> {
        self.gauge.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.write_record(key, token, value).await
    }
}

/// What connecting and closing `opts.tasks` clients costs the server,
/// taken off every subject's count.
async fn setup_cost(counter: &ServerCounter, opts: &LayeredOptions) -> Result<u64> {
    counter.settle().await?;
    let before = counter.snapshot().await?;
    drop(connect_clients(opts, false, &Arc::new(Gauge::default())).await?);
    counter.settle().await?;
    Ok(counter.snapshot().await?.saturating_sub(before))
}
