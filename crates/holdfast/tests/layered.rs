//! The layered hybrid lock against real servers (Redis in front of
//! PostgreSQL): the fast store dying or losing its data never costs
//! exclusion, the authoritative store's lease decides `lost()`, and the
//! filter keeps contenders off the authoritative store.
#![cfg(all(feature = "redis", feature = "postgres"))]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use holdfast::backend::{AcquireRequest, Backend, Grant, LockStatus, RenewRequest};
use holdfast::layered::Layered;
use holdfast::{Capabilities, Client, ClientOptions, Error, LockKey, OwnerToken};
use holdfast_testkit::servers::{postgres::PostgresServer, redis::RedisServer};
use holdfast_testkit::witness::Witness;

/// Redis fails a call within 500 ms when it is gone.
fn fast_url(redis: &RedisServer) -> String {
    format!("{}?timeout_ms=500&connect_timeout_ms=500", redis.url())
}

fn layered_url(redis: &RedisServer, pg: &PostgresServer) -> String {
    format!("layered://{}|{}", fast_url(redis), pg.url())
}

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

/// Tasks over three clients loop acquire, check in with a witness (one
/// holder at a time, fences increasing), release, until `stop`; returns the
/// acquisitions made.
fn contend(clients: &[Client], key: &str, witness: &Witness, stop: Instant) -> Vec<tokio::task::JoinHandle<u64>> {
    (0..6)
        .map(|t| {
            let (c, key, witness) = (clients[t % clients.len()].clone(), key.to_owned(), witness.clone());
            tokio::spawn(async move {
                let mut done = 0;
                while Instant::now() < stop {
                    let g =
                        match c.mutex(&key).ttl(Duration::from_secs(5)).acquire_timeout(Duration::from_secs(3)).await {
                            Ok(g) => g,
                            // A store error while Redis dies (a call in flight): try again.
                            Err(Error::Backend { .. } | Error::Timeout { .. }) => continue,
                            Err(e) => panic!("acquire: {e}"),
                        };
                    let inside = witness.enter(g.fence()).expect("witness");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    witness.exit(inside).expect("witness");
                    // A release may fail while Redis dies; the client retries it.
                    let _ = g.release().await;
                    done += 1;
                }
                done
            })
        })
        .collect()
}

async fn total(tasks: Vec<tokio::task::JoinHandle<u64>>) -> u64 {
    let mut sum = 0;
    for t in tasks {
        sum += t.await.expect("task");
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fast_store_killed_mid_run_keeps_exclusion_and_progress() {
    let (mut redis, pg) = (RedisServer::start(), PostgresServer::start());
    let url = layered_url(&redis, &pg);
    let clients = [client(&url, "a").await, client(&url, "b").await, client(&url, "c").await];
    let dir = tempfile::tempdir().expect("tempdir");
    let witness = Witness::new(dir.path()).expect("witness");
    witness.reset(0).expect("witness");
    let key = "layered/fast-killed";

    let before = total(contend(&clients, key, &witness, Instant::now() + Duration::from_secs(2))).await;
    assert!(before > 0, "no acquisition with both stores up");
    redis.kill();
    let down = total(contend(&clients, key, &witness, Instant::now() + Duration::from_secs(4))).await;
    assert!(down > 0, "no acquisition on the authoritative store alone while the fast store was down");
    redis.restart();
    // Past the skip window: the fast store is used again.
    tokio::time::sleep(holdfast::layered::FAST_RETRY_AFTER).await;
    let after = total(contend(&clients, key, &witness, Instant::now() + Duration::from_secs(2))).await;
    assert!(after > 0, "no acquisition after the fast store came back");

    let report = witness.report().expect("report");
    assert_eq!(report.overlaps, 0, "two holders at once: {report:?}");
    assert!(report.fences_increasing, "fences went backwards: {report:?}");
    assert_eq!(report.entries, before + down + after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fast_store_restarted_without_data_grants_no_one_twice() {
    let (mut redis, pg) = (RedisServer::start(), PostgresServer::start());
    let url = layered_url(&redis, &pg);
    let (a, b) = (client(&url, "a").await, client(&url, "b").await);
    let key = "layered/fast-restarted";
    let held = a.mutex(key).ttl(Duration::from_secs(3)).acquire().await.expect("A acquires");
    // Redis without persistence: A's fast lease is gone, the authoritative one is not.
    redis.restart();
    let fast = holdfast::stores::connect(&fast_url(&redis)).await.expect("fast store");
    let lock_key = LockKey::new(key).expect("key");
    assert!(fast.status(&lock_key).await.expect("status").holder.is_none(), "Redis kept its data");
    assert!(b.mutex(key).try_acquire().await.expect("try").is_none(), "B got a key A holds");
    assert!(fast.status(&lock_key).await.expect("status").holder.is_none(), "B's refused try kept its fast lease");
    match b.mutex(key).acquire_timeout(Duration::from_millis(1500)).await {
        Err(Error::Timeout { .. }) => {}
        Ok(g) => panic!("B was granted (fence {}) while A holds (fence {})", g.fence(), held.fence()),
        Err(e) => panic!("B: expected Timeout, got {e}"),
    }
    // A's lease lives on by renewal of the authoritative store (past its 3 s TTL).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!held.is_lost(), "A lost its lease when the fast store lost its data");
    let fence = held.fence();
    held.release().await.expect("A releases");
    let g = b.mutex(key).acquire_timeout(Duration::from_secs(3)).await.expect("B after A");
    assert!(g.fence() > fence);
    g.release().await.expect("B releases");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn authoritative_lease_lost_fires_lost_though_the_fast_lease_is_held() {
    let (redis, pg) = (RedisServer::start(), PostgresServer::start());
    let url = layered_url(&redis, &pg);
    let (a, b) = (client(&url, "a").await, client(&url, "b").await);
    let key = "layered/auth-lost";
    let g = a.mutex(key).ttl(Duration::from_millis(1500)).acquire().await.expect("A acquires");
    // The authoritative lease vanishes under A (an operator, a restore):
    // renewal there says not held, while the fast lease is still A's.
    pg.psql(&format!("DELETE FROM holdfast_leases WHERE key = '{key}'"));
    let fast = holdfast::stores::connect(&fast_url(&redis)).await.expect("fast store");
    let lock_key = LockKey::new(key).expect("key");
    tokio::time::timeout(Duration::from_secs(3), g.lost()).await.expect("lost() did not fire");
    assert!(fast.status(&lock_key).await.expect("status").holder.is_some(), "the fast lease was not held");
    assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    let g = b.mutex(key).acquire_timeout(Duration::from_secs(5)).await.expect("B after A's loss");
    g.release().await.expect("release");
}

/// A thin wrapper that counts the calls reaching the real store it forwards
/// to, and (with the other clients' wrappers) how many `acquire` calls wait
/// in the store at once.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn Backend>,
    calls: AtomicU64,
    gauge: Arc<Gauge>,
}

/// `acquire` calls in the store now, and the most at once, over all clients.
#[derive(Debug, Default)]
struct Gauge {
    waiting: AtomicU64,
    most: AtomicU64,
}

impl Counting {
    fn new(inner: Arc<dyn Backend>, gauge: Arc<Gauge>) -> Arc<Self> {
        Arc::new(Counting { inner, calls: AtomicU64::new(0), gauge })
    }
}

struct Waiting<'a>(&'a Gauge);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Backend for Counting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> holdfast::Result<Option<Grant>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.try_acquire(req).await
    }
    async fn acquire(&self, req: &AcquireRequest) -> holdfast::Result<Grant> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.gauge.waiting.fetch_add(1, Ordering::SeqCst) + 1;
        self.gauge.most.fetch_max(now, Ordering::SeqCst);
        let _waiting = Waiting(&self.gauge);
        self.inner.acquire(req).await
    }
    async fn release(&self, key: &LockKey, token: OwnerToken) -> holdfast::Result<bool> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.release(key, token).await
    }
    async fn renew(&self, leases: &[RenewRequest]) -> holdfast::Result<Vec<bool>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.renew(leases).await
    }
    async fn status(&self, key: &LockKey) -> holdfast::Result<LockStatus> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.status(key).await
    }
}

/// Eight clients (each its own connections, as eight processes would be)
/// contend on one key for `run`, waiting (`wait`) or trying every 2 ms;
/// returns the authoritative store's calls per acquisition and the most
/// acquires that waited there at once.
async fn contenders(redis: &RedisServer, pg: &PostgresServer, layered: bool, wait: bool, run: Duration) -> (f64, u64) {
    let (mut counters, mut clients, gauge) = (Vec::new(), Vec::new(), Arc::new(Gauge::default()));
    for _ in 0..8 {
        let auth = Counting::new(holdfast::stores::connect(&pg.url()).await.expect("postgres"), gauge.clone());
        counters.push(auth.clone());
        let backend: Arc<dyn Backend> = if layered {
            let fast = holdfast::stores::connect(&fast_url(redis)).await.expect("redis");
            Arc::new(Layered::new(fast, auth).expect("layered"))
        } else {
            auth
        };
        clients.push(Client::with_backend(backend, ClientOptions::default()));
    }
    let key = format!("layered/filter/{layered}/{wait}");
    let stop = Instant::now() + run;
    let tasks: Vec<_> = clients
        .iter()
        .map(|c| {
            let (c, key) = (c.clone(), key.clone());
            tokio::spawn(async move {
                let mut done = 0u64;
                while Instant::now() < stop {
                    let m = c.mutex(&key).ttl(Duration::from_secs(10));
                    let g = if wait {
                        Some(m.acquire_timeout(Duration::from_secs(5)).await.expect("acquire"))
                    } else {
                        m.try_acquire().await.expect("try")
                    };
                    match g {
                        Some(g) => {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            g.release().await.expect("release");
                            done += 1;
                        }
                        None => tokio::time::sleep(Duration::from_millis(2)).await,
                    }
                }
                done
            })
        })
        .collect();
    let acquisitions = total(tasks).await;
    assert!(acquisitions > 0);
    let calls: u64 = counters.iter().map(|c| c.calls.load(Ordering::SeqCst)).sum();
    (calls as f64 / acquisitions as f64, gauge.most.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_filter_keeps_contenders_off_the_authoritative_store() {
    let (redis, pg) = (RedisServer::start(), PostgresServer::start_with_settings(&[("max_connections", "200")]));
    let run = Duration::from_secs(3);
    // Waiting: without the filter all eight wait on PostgreSQL; with it, the
    // one holding the fast lease (two at a hand-off).
    let (_, most_alone) = contenders(&redis, &pg, false, true, run).await;
    let (_, most_layered) = contenders(&redis, &pg, true, true, run).await;
    eprintln!("acquires waiting on PostgreSQL at once: alone {most_alone}, layered {most_layered}");
    assert!(most_alone >= 6, "the contenders did not contend: {most_alone}");
    assert!(most_layered <= 2, "{most_layered} acquires waited on the authoritative store at once");
    // Trying: every try reaches PostgreSQL alone; with the filter, those
    // refused by Redis never do.
    let (alone, _) = contenders(&redis, &pg, false, false, run).await;
    let (layered, _) = contenders(&redis, &pg, true, false, run).await;
    eprintln!("PostgreSQL calls per acquisition, trying: alone {alone:.2}, layered {layered:.2}");
    assert!(layered * 2.0 < alone, "the filter did not cut the authoritative calls: {layered:.2} vs {alone:.2}");
}
