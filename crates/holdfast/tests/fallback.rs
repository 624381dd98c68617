//! The fallback chain against real servers (a redis-server first, a SQLite
//! file as the arbiter), where clients disagree about which store is down:
//! one client is cut from Redis by the fault proxy while another reaches
//! it. The article's naive chain ("on a timeout, try the next store") gives
//! two holders; holdfast's chain does not, and every client follows its
//! switch, and fails back.
#![cfg(all(feature = "redis", feature = "sqlite"))]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use holdfast::backend::{AcquireRequest, Backend, Grant, LockStatus, RenewRequest};
use holdfast::fallback::Fallback;
use holdfast::{Capabilities, Client, ClientOptions, LockKey, OwnerToken};
use holdfast_testkit::faults::FaultProxy;
use holdfast_testkit::servers::redis::RedisServer;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(2);
/// A short mode lease and switch delay, so that a switch takes about a second.
const CHAIN_OPTIONS: &str = "?mode_ttl_ms=1000&switch_after_ms=200&fail_back_after_ms=0";

/// A Redis server, a proxy in front of it, and a SQLite file.
struct Stores {
    redis: RedisServer,
    proxy: FaultProxy,
    dir: tempfile::TempDir,
}

impl Stores {
    fn start() -> Self {
        let redis = RedisServer::start();
        let proxy = FaultProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], redis.port())));
        Stores { redis, proxy, dir: tempfile::tempdir().expect("tempdir") }
    }

    /// Redis as reached directly, or through the proxy (which the test cuts).
    fn redis(&self, proxied: bool) -> String {
        let port = if proxied { self.proxy.addr().port() } else { self.redis.port() };
        format!("redis://127.0.0.1:{port}?timeout_ms=300")
    }

    fn arbiter(&self) -> String {
        format!("sqlite://{}/arbiter.db", self.dir.path().display())
    }

    fn chain_url(&self, proxied: bool, options: &str) -> String {
        format!("fallback://{options}|{}|{}", self.redis(proxied), self.arbiter())
    }
}

/// The chain from the reference article: the first store that answers.
#[derive(Debug)]
struct NaiveChain {
    stores: Vec<Arc<dyn Backend>>,
    held_on: Mutex<HashMap<(LockKey, OwnerToken), usize>>,
}

impl NaiveChain {
    async fn connect(urls: &[String]) -> Self {
        let mut stores = Vec::new();
        for u in urls {
            stores.push(holdfast::stores::connect(u).await.expect("connect a link of the naive chain"));
        }
        NaiveChain { stores, held_on: Mutex::new(HashMap::new()) }
    }

    fn note(&self, req: &AcquireRequest, store: usize) {
        self.held_on.lock().unwrap().insert((req.key.clone(), req.token), store);
    }
}

#[async_trait]
impl Backend for NaiveChain {
    fn name(&self) -> &'static str {
        "naive-chain"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::minimal()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> holdfast::Result<Option<Grant>> {
        let mut last = None;
        for (i, store) in self.stores.iter().enumerate() {
            match store.try_acquire(req).await {
                Ok(grant) => {
                    self.note(req, i);
                    return Ok(grant);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("a chain has stores"))
    }

    async fn acquire(&self, req: &AcquireRequest) -> holdfast::Result<Grant> {
        let mut last = None;
        for (i, store) in self.stores.iter().enumerate() {
            self.note(req, i);
            match store.acquire(req).await {
                Ok(grant) => return Ok(grant),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("a chain has stores"))
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> holdfast::Result<bool> {
        let Some(store) = self.held_on.lock().unwrap().remove(&(key.clone(), token)) else { return Ok(false) };
        self.stores[store].release(key, token).await
    }

    async fn renew(&self, leases: &[RenewRequest]) -> holdfast::Result<Vec<bool>> {
        let mut out = Vec::new();
        for l in leases {
            let store = self.held_on.lock().unwrap().get(&(l.key.clone(), l.token)).copied();
            out.push(match store {
                Some(s) => self.stores[s].renew(std::slice::from_ref(l)).await?[0],
                None => false,
            });
        }
        Ok(out)
    }

    async fn status(&self, key: &LockKey) -> holdfast::Result<LockStatus> {
        self.stores[0].status(key).await
    }
}

/// What happened when A, cut from Redis, asked for the key B held.
struct Outcome {
    /// B still believed it held when A was granted.
    both_held: bool,
    b_fence: u64,
    a_fence: u64,
    /// How long A waited.
    a_waited: Duration,
    a: holdfast::MutexGuard,
}

/// B (which reaches Redis) takes the key; then the proxy cuts A from Redis
/// and A asks for the key. Records whether B still believed it held when A
/// was granted.
async fn disagree(b: &Client, a: &Client, proxy: &FaultProxy, key: &str) -> Outcome {
    let held_b = b.mutex(key).ttl(TTL).acquire_timeout(Duration::from_secs(10)).await.expect("B acquires");
    let b_fence = held_b.fence();
    let b_lost_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let watch = {
        let (lost, at) = (held_b.lost(), Arc::clone(&b_lost_at));
        tokio::spawn(async move {
            lost.await;
            *at.lock().unwrap() = Some(Instant::now());
        })
    };
    proxy.blackhole();
    let asked = Instant::now();
    let held_a = a.mutex(key).ttl(TTL).acquire_timeout(Duration::from_secs(30)).await.expect("A acquires");
    let granted = Instant::now();
    let lost_at = *b_lost_at.lock().unwrap();
    let both_held = !held_b.is_lost() && lost_at.is_none_or(|t| t > granted);
    watch.abort();
    drop(held_b);
    Outcome { both_held, b_fence, a_fence: held_a.fence(), a_waited: granted - asked, a: held_a }
}

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_naive_chain_grants_twice_when_clients_disagree() {
    let stores = Stores::start();
    let naive = |proxied: bool| {
        let urls = [stores.redis(proxied), stores.arbiter()];
        async move { Arc::new(NaiveChain::connect(&urls).await) as Arc<dyn Backend> }
    };
    let b = Client::with_backend(naive(false).await, ClientOptions::default().with_label("b"));
    let a = Client::with_backend(naive(true).await, ClientOptions::default().with_label("a"));
    let out = disagree(&b, &a, &stores.proxy, "naive/disagree").await;
    assert!(
        out.both_held,
        "the naive chain was expected to grant A on the next store while B held on Redis (A waited {:?})",
        out.a_waited
    );
    eprintln!(
        "naive chain: A granted on the next store after {:?} while B held on Redis (fences: B {}, A {})",
        out.a_waited, out.b_fence, out.a_fence
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_chain_never_grants_twice_when_clients_disagree_and_every_client_follows_it() {
    let stores = Stores::start();
    let b = client(&stores.chain_url(false, CHAIN_OPTIONS), "b").await;
    let a = client(&stores.chain_url(true, CHAIN_OPTIONS), "a").await;
    let key = "chain/disagree";
    let out = disagree(&b, &a, &stores.proxy, key).await;
    assert!(!out.both_held, "A was granted while B still believed it held");
    assert!(out.a_fence > out.b_fence, "A's fence {} is not above B's {}", out.a_fence, out.b_fence);
    assert!(out.a_fence >> 52 >= 1, "A's grant is not from a later epoch: fence {:#x}", out.a_fence);
    // A switch costs switch_after + one mode TTL + retries: a few seconds.
    assert!(out.a_waited < Duration::from_secs(10), "A waited {:?}", out.a_waited);
    eprintln!(
        "chain: A granted on the arbiter after {:?}, once B had lost (fences: B {}, A {:#x})",
        out.a_waited, out.b_fence, out.a_fence
    );

    // B, which still reaches Redis, follows the switch: the key is A's.
    let mutex = b.mutex(key).ttl(TTL);
    assert!(mutex.try_acquire().await.expect("B tries").is_none(), "B was granted the key A holds");
    let a_fence = out.a_fence;
    out.a.release().await.expect("A releases");
    let again = mutex.acquire_timeout(Duration::from_secs(10)).await.expect("B acquires after A");
    assert!(again.fence() > a_fence, "B's fence {} is not above A's {a_fence}", again.fence());
    again.release().await.expect("B releases");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_chain_fails_back_to_its_first_store() {
    let stores = Stores::start();
    let fail_back = "?mode_ttl_ms=1000&switch_after_ms=200&fail_back_after_ms=500";
    let a = client(&stores.chain_url(true, fail_back), "a").await;
    let key = "chain/fail-back";
    let first = a.mutex(key).ttl(TTL).acquire().await.expect("first grant, on Redis");
    assert_eq!(first.fence() >> 52, 0, "the first grant is not from epoch 0");
    first.release().await.expect("release");
    // Redis goes away for A: the chain moves to the arbiter.
    stores.proxy.blackhole();
    let moved = a.mutex(key).ttl(TTL).acquire_timeout(Duration::from_secs(20)).await.expect("grant after the switch");
    assert_eq!(moved.fence() >> 52, 1, "not granted in epoch 1: {:#x}", moved.fence());
    moved.release().await.expect("release");
    // Redis is back: within a few fail-back periods the chain returns to it.
    stores.proxy.forward();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = 0;
    while Instant::now() < deadline {
        let g = a.mutex(key).ttl(TTL).acquire_timeout(Duration::from_secs(10)).await.expect("grant");
        assert!(g.fence() > last, "fence {:#x} after {last:#x}", g.fence());
        last = g.fence();
        g.release().await.expect("release");
        if last >> 52 >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(last >> 52 >= 2, "the chain did not fail back within 20 s (last fence {last:#x})");
    // Epoch 2 grants on Redis again: the switch named store 0.
    let chain = Fallback::open_url(&stores.chain_url(false, fail_back)).await.expect("open");
    let mode = chain.switch_to(0).await.expect("switch_to the store already active");
    assert_eq!((mode.epoch, mode.active), (2, 0), "{mode:?}");
}

#[tokio::test]
async fn bad_chains_are_typed_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = format!("sqlite://{}/a.db", dir.path().display());
    for url in [
        format!("fallback://{sqlite}"),
        format!("fallback://?mode_ttl_ms=5|{sqlite}|{sqlite}"),
        format!("fallback://?bogus=1|{sqlite}|{sqlite}"),
        format!("fallback://{sqlite}|fallback://{sqlite}"),
        "fallback://".to_owned(),
    ] {
        match Fallback::open_url(&url).await {
            Err(holdfast::Error::InvalidInput { .. }) => {}
            other => panic!("{url}: expected InvalidInput, got {:?}", other.map(|_| ())),
        }
    }
}

#[path = "fallback/stalls.rs"]
mod stalls;
#[path = "fallback/tenants.rs"]
mod tenants;
