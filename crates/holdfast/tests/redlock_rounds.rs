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

/// How long each logged call waits before it is sent.
const CALL_DELAY: Duration = Duration::from_millis(20);

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
        // Every call waits a moment before it is sent, so calls sent
        // together are all started before any of them ends (a loaded machine
        // ran a reply in before the next call of the same round had started).
        tokio::time::sleep(CALL_DELAY).await;
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

/// A RedLock client over `servers` whose member calls are logged in
/// `calls`, with a call timeout well above the logged calls' delay (on a
/// loaded machine).
async fn logged_client(servers: &[RedisServer], calls: &Arc<Calls>) -> Client {
    let logged: Vec<Arc<dyn Backend>> = members(servers)
        .await
        .into_iter()
        .map(|store| Arc::new(Logged { store, calls: calls.clone() }) as Arc<dyn Backend>)
        .collect();
    let lock = RedLock::new(logged).expect("redlock").with_call_timeout(Duration::from_secs(2));
    Client::with_backend(Arc::new(lock), ClientOptions::default())
}

/// An uncontended waiting acquire and its release over three members: one
/// round trip each (every member asked at once), and no fence write-back,
/// since the fence floor the lock sends makes every member issue the same
/// fence. (Before: the first member alone, then the others, then the
/// write-back to the members that issued a lower fence, then the release:
/// four.) A try refused by every member is one round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_uncontended_acquire_and_release_are_two_round_trips() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let calls = Arc::new(Calls::default());
    let c = logged_client(&servers, &calls).await;
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
    // Held by another process's lock: a try is one round, and a round that
    // every member refused leaves nothing to release.
    let other = Client::with_backend(
        Arc::new(RedLock::new(members(&servers).await).expect("redlock")),
        ClientOptions::default(),
    );
    let held = other.mutex("uncontended").try_acquire().await.expect("try").expect("free");
    assert!(c.mutex("uncontended").try_acquire().await.expect("try").is_none(), "granted while held");
    let log = calls.take();
    let names: Vec<&str> = log.iter().map(|c| c.0).collect();
    assert_eq!(names, ["try_acquire"; 3], "a refused try: {names:?}");
    held.release().await.expect("release");
}

/// Two clients (two processes' locks, each remembering the fences it saw)
/// take turns, so each one's remembered fence is stale. Then one member's
/// counter jumps far above the others' (an hour, in µs); A's next grant
/// includes that member (its fence is that member's answer, so the others
/// must be written back although A sent a floor), and B, which never saw
/// the jump, is next granted by the two others alone. Every fence is above
/// the one before. (A client that skipped the write-back because it sent a
/// floor gave B a fence an hour below A's.)
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
    let turn = |c: &Client, waiting: bool| {
        let c = c.clone();
        async move {
            let g = if waiting {
                c.mutex("stale").acquire_timeout(Duration::from_secs(5)).await.expect("acquire")
            } else {
                c.mutex("stale").try_acquire().await.expect("try").expect("a majority is free")
            };
            let fence = g.fence();
            g.release().await.expect("release");
            fence
        }
    };
    for round in 0..4 {
        fences.push(turn(if round % 2 == 0 { &a } else { &b }, round % 3 == 0).await);
    }
    // Member 2's counter jumps an hour (in µs) ahead of the others.
    let token = OwnerToken::random();
    let req = AcquireRequest::new(key.clone(), token, Duration::from_secs(5));
    let g = direct[2].try_acquire(&req).await.expect("try").expect("free");
    assert!(direct[2].raise_fence(&key, token, g.fence + 3_600_000_000).await.expect("raise"));
    assert!(direct[2].release(&key, token).await.expect("release"));
    fences.push(turn(&a, true).await);
    // Member 2 is held by someone else from now on: majorities without it.
    let req = AcquireRequest::new(key.clone(), OwnerToken::random(), Duration::from_secs(60));
    direct[2].try_acquire(&req).await.expect("try").expect("free");
    fences.push(turn(&b, true).await);
    fences.push(turn(&a, false).await);
    fences.push(turn(&b, false).await);
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences not strictly increasing: {fences:?}");
}

/// A waiting acquire whose first members free up one after another: the
/// first member's counter stands an hour (in µs) above the second's, as a
/// Redis member's does when it handed the key over locally (its fence then
/// comes from its clock). The second member is asked with the first one's
/// fence as its floor, so it answers that fence and the round needs no
/// write-back; and the release goes only to the two members the round
/// asked, not to the third. (Before: a `raise_fence` to the second member
/// in every such round, and a release to all three.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_round_floors_later_members_and_releases_only_those_it_asked() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let calls = Arc::new(Calls::default());
    let c = logged_client(&servers, &calls).await;
    let direct = members(&servers).await;
    let key = LockKey::new("floored").expect("key");
    // Members 0 and 1 held by another owner; member 0's fence an hour ahead.
    let other = OwnerToken::random();
    let req = AcquireRequest::new(key.clone(), other, Duration::from_secs(30));
    let g0 = direct[0].try_acquire(&req).await.expect("try").expect("free");
    assert!(direct[0].raise_fence(&key, other, g0.fence + 3_600_000_000).await.expect("raise"));
    let g1 = direct[1].try_acquire(&req).await.expect("try").expect("free");
    assert!(g1.fence < g0.fence + 3_600_000_000);
    let waiter = tokio::spawn({
        let c = c.clone();
        async move { c.mutex("floored").acquire_timeout(Duration::from_secs(10)).await.expect("acquire") }
    });
    // The waiter's first round (every member at once) is refused by a
    // majority; it then waits on member 0, then member 1.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(direct[0].release(&key, other).await.expect("release 0"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(direct[1].release(&key, other).await.expect("release 1"));
    let g = waiter.await.expect("waiter");
    assert!(g.fence() > g0.fence + 3_600_000_000, "fence {} not above member 0's", g.fence());
    let before_release = calls.take();
    let names: Vec<&str> = before_release.iter().map(|c| c.0).collect();
    assert!(!names.contains(&"raise_fence"), "the waiting round wrote a fence back: {names:?}");
    g.release().await.expect("release");
    let log = calls.take();
    let names: Vec<&str> = log.iter().map(|c| c.0).collect();
    assert_eq!(names, ["release"; 2], "the release of a round that asked two members: {names:?}");
    // Member 2 never held it: free there for anyone.
    let probe = AcquireRequest::new(key.clone(), OwnerToken::random(), Duration::from_secs(5));
    assert!(direct[2].try_acquire(&probe).await.expect("try").is_some());
}
