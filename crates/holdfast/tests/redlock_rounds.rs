//! RedLock's round trips and fence floors against real redis-servers: an
//! uncontended acquire and its release are two rounds of member calls
//! (counted by a wrapper around each real store, which records when each
//! call starts and ends), and fences stay strictly increasing across
//! clients whose remembered fences are stale and across a member whose
//! counter stands above the others'.
#![cfg(all(feature = "redlock", feature = "redis"))]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use holdfast::backend::{AcquireRequest, Backend, Grant, LockStatus, RenewRequest};
use holdfast::redlock::RedLock;
use holdfast::{Capabilities, Client, ClientOptions, LockKey, OwnerToken, Result};
use holdfast_testkit::servers::redis::RedisServer;

/// Every member call of one test: which store call, when it started and
/// when it ended, on one logical clock (a counter every start and end
/// takes a number from).
#[derive(Debug, Default)]
struct Calls {
    clock: AtomicU64,
    log: Mutex<Vec<(&'static str, u64, u64)>>,
}

impl Calls {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    fn take(&self) -> Vec<(&'static str, u64, u64)> {
        std::mem::take(&mut *self.log.lock().expect("log"))
    }
}

/// Round trips in `calls`: the longest chain of calls each started after
/// the one before it ended (calls sent together are one round trip).
fn round_trips(calls: &[(&'static str, u64, u64)]) -> usize {
    let mut sorted = calls.to_vec();
    sorted.sort_by_key(|c| c.1);
    let mut depth = vec![0usize; sorted.len()];
    for i in 0..sorted.len() {
        depth[i] = 1 + (0..i).filter(|&j| sorted[j].2 < sorted[i].1).map(|j| depth[j]).max().unwrap_or(0);
    }
    depth.into_iter().max().unwrap_or(0)
}

/// A real store whose calls are logged in [`Calls`]; it answers as the
/// store does.
#[derive(Debug)]
struct Logged {
    store: Arc<dyn Backend>,
    calls: Arc<Calls>,
}

impl Logged {
    async fn log<T>(&self, what: &'static str, call: impl std::future::Future<Output = T>) -> T {
        let started = self.calls.tick();
        let out = call.await;
        let ended = self.calls.tick();
        self.calls.log.lock().expect("log").push((what, started, ended));
        out
    }
}

#[async_trait]
impl Backend for Logged {
    fn name(&self) -> &'static str {
        self.store.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        self.log("try_acquire", self.store.try_acquire(req)).await
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        self.log("acquire", self.store.acquire(req)).await
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        self.log("release", self.store.release(key, token)).await
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        self.log("renew", self.store.renew(leases)).await
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        self.log("status", self.store.status(key)).await
    }

    async fn raise_fence(&self, key: &LockKey, token: OwnerToken, floor: u64) -> Result<bool> {
        self.log("raise_fence", self.store.raise_fence(key, token, floor)).await
    }
}

async fn members(servers: &[RedisServer]) -> Vec<Arc<dyn Backend>> {
    let mut out = Vec::new();
    for s in servers {
        out.push(holdfast::stores::connect(&s.url()).await.expect("member"));
    }
    out
}

/// An uncontended waiting acquire and its release over three members: one
/// round trip each (every member asked at once), and no fence write-back,
/// since the fence floor the lock sends makes every member issue the same
/// fence. (Before: the first member alone, then the others, then the
/// write-back to the members that issued a lower fence, then the release:
/// four.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_uncontended_acquire_and_release_are_two_round_trips() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let calls = Arc::new(Calls::default());
    let logged: Vec<Arc<dyn Backend>> = members(&servers)
        .await
        .into_iter()
        .map(|store| Arc::new(Logged { store, calls: calls.clone() }) as Arc<dyn Backend>)
        .collect();
    let c = Client::with_backend(Arc::new(RedLock::new(logged).expect("redlock")), ClientOptions::default());
    let mut last = 0;
    for i in 0..5 {
        let g = c.mutex("uncontended").acquire_timeout(Duration::from_secs(5)).await.expect("acquire");
        assert!(g.fence() > last, "fence {} after {last}", g.fence());
        last = g.fence();
        g.release().await.expect("release");
        let log = calls.take();
        if i == 0 {
            // The first grant of a key this lock has not seen may write back.
            continue;
        }
        let names: Vec<&str> = log.iter().map(|c| c.0).collect();
        assert_eq!(names.iter().filter(|n| **n == "try_acquire").count(), 3, "cycle {i}: {names:?}");
        assert_eq!(names.iter().filter(|n| **n == "release").count(), 3, "cycle {i}: {names:?}");
        assert_eq!(log.len(), 6, "cycle {i}: only the acquire and the release: {names:?}");
        assert_eq!(round_trips(&log), 2, "cycle {i}: {log:?}");
    }
}

/// Two clients (two processes' locks, each remembering the fences it saw)
/// take turns, so each one's remembered fence is stale; one member's counter
/// is then raised far above the others' (its fences jump), and majorities
/// with and without it follow. Every fence is above the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fences_increase_with_stale_floors_and_a_member_ahead() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let a = Client::with_backend(
        Arc::new(RedLock::new(members(&servers).await).expect("redlock")),
        ClientOptions::default(),
    );
    let b = Client::with_backend(
        Arc::new(RedLock::new(members(&servers).await).expect("redlock")),
        ClientOptions::default(),
    );
    let direct = members(&servers).await;
    let key = LockKey::new("stale").expect("key");
    let mut fences = Vec::new();
    for round in 0..12 {
        let c = if round % 3 == 0 { &a } else { &b };
        if round == 4 {
            // Member 2's counter jumps an hour (in µs) ahead of the others.
            let token = OwnerToken::random();
            let req = AcquireRequest::new(key.clone(), token, Duration::from_secs(5));
            let g = direct[2].try_acquire(&req).await.expect("try").expect("free");
            assert!(direct[2].raise_fence(&key, token, g.fence + 3_600_000_000).await.expect("raise"));
            assert!(direct[2].release(&key, token).await.expect("release"));
        }
        // From round 8 on, member 2 is held by someone else: majorities
        // without the member that stands ahead.
        if round == 8 {
            let req = AcquireRequest::new(key.clone(), OwnerToken::random(), Duration::from_secs(60));
            direct[2].try_acquire(&req).await.expect("try").expect("free");
        }
        let g = if round % 2 == 0 {
            c.mutex("stale").acquire_timeout(Duration::from_secs(5)).await.expect("acquire")
        } else {
            c.mutex("stale").try_acquire().await.expect("try").expect("a majority is free")
        };
        fences.push(g.fence());
        g.release().await.expect("release");
    }
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences not strictly increasing: {fences:?}");
}
