//! The fault clauses F3..F5 (F1 and F2 in `lost_replies`) and what all
//! five share: a client reaches the store through a
//! [`FaultProxy`], which loses replies, withholds traffic or refuses
//! connections while the client calls; another client, connected directly,
//! then checks what the store was left with.
//!
//! Every lease here has a 30 s TTL and every bound checked is a few seconds,
//! so a key that comes free in time was released by a token, never expired.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error, LockStatus};

use super::{ProxyTarget, Store, client, eventually, fresh_key, is_free};
use crate::faults::FaultProxy;

/// The TTL of every lease in these clauses: far above every bound they check.
pub(super) const TTL: Duration = Duration::from_secs(30);
/// How soon a key must be free for another client once its holder released it
/// (or once the faulty network is healed).
pub(super) const FREED_WITHIN: Duration = Duration::from_secs(3);
/// F3: how soon after the store is reachable again; leaves room for a
/// background retry's backoff.
const FREED_AFTER_OUTAGE: Duration = Duration::from_secs(5);
/// What a call may take beyond the store operation timeouts it may spend
/// before it counts as hung: scheduling on a loaded machine.
const HANG_SLACK: Duration = Duration::from_secs(3);

/// The store's proxy target, or `None` when there is no network between
/// client and store to fault (SQLite: a file in the client's process) or no
/// way to put the proxy on it (Redis Sentinel names the master's own
/// address); the clause then has nothing to test, says so, and returns.
pub(super) fn target<'a>(store: &'a Store, clause: &str) -> Option<&'a ProxyTarget> {
    let target = store.via_proxy.as_ref();
    if target.is_none() {
        let scheme = store.url.split("://").next().unwrap_or_default();
        if store.in_process.is_some() {
            eprintln!("{clause}: not applicable to {scheme}: its links inject these faults in the seeded runs");
        } else {
            eprintln!(
                "{clause}: not applicable to {scheme}: no fault proxy between client and store (no network, \
                 or the client finds the server's own address, as through Redis Sentinel)"
            );
        }
    }
    target
}

/// [`target`] for a clause of shared leases: `None` also (said so) when the
/// store declares none.
pub(super) async fn shared_target<'a>(store: &'a Store, clause: &str) -> Option<&'a ProxyTarget> {
    let target = target(store, clause)?;
    if !client(store, &format!("{clause}-probe")).await.capabilities().shared_leases {
        eprintln!("{clause}: the store declares no shared leases");
        return None;
    }
    Some(target)
}

/// A client that reaches the store through a fault proxy.
pub(super) struct Proxied {
    pub(super) proxy: FaultProxy,
    pub(super) client: Client,
    pub(super) op_timeout: Duration,
}

impl Proxied {
    pub(super) async fn start(target: &ProxyTarget, label: &str) -> Self {
        let proxy = FaultProxy::start(target.upstream);
        let url = (target.url)(proxy.addr());
        let client = Client::connect_with(&url, ClientOptions::default().with_label(label))
            .await
            .unwrap_or_else(|e| panic!("cannot connect through the proxy to {url}: {e}"));
        let proxied = Proxied { proxy, client, op_timeout: target.op_timeout };
        proxied.warm_up(None).await;
        proxied
    }

    /// Lock cycles through the proxy, retried for up to 15 s (after a cut
    /// the client has to reconnect): four at once on fresh keys (so that a
    /// pool opens several connections), then on `key` if given, each cycle a
    /// `try_acquire` and an `acquire_timeout`. Connections, prepared
    /// statements, loaded scripts, etcd's session lease of [`TTL`] and a
    /// ZooKeeper lock parent for `key` then exist, so that a fault switched on
    /// next hits the request under test, not a step before it whose lost
    /// reply would keep the request from being sent at all.
    pub(super) async fn warm_up(&self, key: Option<&str>) {
        self.warm_up_for(key, Ask::Mutex).await;
    }

    /// [`warm_up`](Self::warm_up) with cycles of what `ask` asks for.
    pub(super) async fn warm_up_for(&self, key: Option<&str>, ask: Ask) {
        let cycle = async |key: String| -> holdfast::Result<()> {
            match ask {
                Ask::Mutex => {
                    let mutex = self.client.mutex(&key).ttl(TTL);
                    if let Some(guard) = mutex.try_acquire().await? {
                        guard.release().await?;
                    }
                    mutex.acquire_timeout(self.op_timeout * 2).await?.release().await
                }
                Ask::Permit => {
                    let semaphore = self.client.semaphore(&key, 1).ttl(TTL);
                    if let Some(permit) = semaphore.try_acquire().await? {
                        permit.release().await?;
                    }
                    semaphore.acquire_timeout(self.op_timeout * 2).await?.release().await
                }
            }
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let cycles = async {
                futures::future::try_join_all((0..4).map(|_| cycle(fresh_key("warm-up")))).await?;
                match key {
                    Some(key) => cycle(key.to_owned()).await,
                    None => Ok(()),
                }
            };
            let error = match tokio::time::timeout(self.op_timeout * 8 + HANG_SLACK, cycles).await {
                Ok(Ok(())) => return,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "a lock cycle hung".to_owned(),
            };
            assert!(Instant::now() < deadline, "the client through the proxy did not recover within 15 s: {error}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Heals the network: closes every connection, then forwards again. The
    /// cut matters: after lost replies a connection's byte stream is out of
    /// step, and bytes a blackhole held must not reach the store late (a
    /// release must come from the client, not from a stale buffer).
    pub(super) fn heal(&self) {
        self.proxy.cut();
        self.proxy.forward();
    }

    /// Awaits `call`, which may spend `budget` in store operation timeouts;
    /// panics if it is still running [`HANG_SLACK`] after that.
    pub(super) async fn bounded<T>(&self, what: &str, budget: Duration, call: impl Future<Output = T>) -> T {
        let limit = budget + HANG_SLACK;
        tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
            panic!("{what}: still running after {limit:?} (the store's operation timeout is {:?})", self.op_timeout)
        })
    }

    /// Acquires `key` (its mutex, or a permit) through the proxy while it forwards.
    pub(super) async fn hold_as(&self, key: &str, ask: Ask) -> Held {
        let wait = self.op_timeout * 2;
        let acquire = async {
            match ask {
                Ask::Mutex => self.client.mutex(key).ttl(TTL).acquire_timeout(wait).await.map(Held::Guard),
                Ask::Permit => self.client.semaphore(key, 1).ttl(TTL).acquire_timeout(wait).await.map(Held::Permit),
            }
        };
        self.bounded("acquire through the proxy", wait, acquire)
            .await
            .unwrap_or_else(|e| panic!("acquire through the proxy failed: {e}"))
    }
}

/// What [`Proxied::hold_as`] holds.
pub(super) enum Held {
    Guard(holdfast::MutexGuard),
    Permit(holdfast::Permit),
}

/// Waits until `by` can take `key` (a probe grant it releases at once).
pub(super) async fn freed(by: &Client, key: &str, within: Duration, what: &str) {
    eventually(&format!("{what}: key free for another client"), within, || is_free(by, key)).await;
}

/// Whether `by` can take `key` within `within`.
pub(super) async fn free_within(by: &Client, key: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if is_free(by, key).await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What F1's acquire asks for: the key's mutex, or a permit of a semaphore
/// of one.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ask {
    Mutex,
    Permit,
}

/// Watches `key` through `by` (directly) every 10 ms while a fault is on;
/// [`StatusProbe::seen`] tells whether the store ever showed it as
/// `seen_when` says (held, held by a share, or free).
pub(super) struct StatusProbe {
    task: tokio::task::JoinHandle<()>,
    seen: Arc<AtomicBool>,
}

impl StatusProbe {
    pub(super) fn start(by: &Client, key: &str, seen_when: fn(&LockStatus) -> bool) -> Self {
        let (by, key, seen) = (by.clone(), key.to_owned(), Arc::new(AtomicBool::new(false)));
        let flag = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                if by.status(&key).await.is_ok_and(|s| seen_when(&s)) {
                    flag.store(true, Ordering::SeqCst);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        StatusProbe { task, seen }
    }

    pub(super) fn seen(self) -> bool {
        self.task.abort();
        self.seen.load(Ordering::SeqCst)
    }
}

/// F3 (C3, C11): a holder releases while the store is unreachable (silent,
/// then refusing connections): the release may fail, but the key must come
/// free within seconds of the store being reachable again, while the holder's
/// client lives on: not at TTL expiry, and not never (a key kept on a live
/// session until the process exits).
pub async fn f3_release_while_unreachable(store: &Store) {
    let Some(target) = target(store, "f3_release_while_unreachable") else { return };
    release_while_unreachable(store, target, Ask::Mutex).await;
}

/// F3 for a permit (a semaphore of one), whose release takes its own path
/// on most stores.
pub async fn f3_shared_release_while_unreachable(store: &Store) {
    let Some(target) = shared_target(store, "f3_shared_release_while_unreachable").await else { return };
    release_while_unreachable(store, target, Ask::Permit).await;
}

async fn release_while_unreachable(store: &Store, target: &ProxyTarget, ask: Ask) {
    let b = client(store, "f3-b").await;
    let a = Proxied::start(target, "f3-a").await;
    let outage = Duration::from_secs(3);
    let mut failures = Vec::new();
    for refuse in [false, true] {
        let variant = if refuse { "store refusing connections" } else { "store silent" };
        let key = fresh_key("f3");
        a.warm_up_for(Some(&key), ask).await;
        let held = a.hold_as(&key, ask).await;
        if refuse {
            a.proxy.refuse();
            a.proxy.cut();
        } else {
            a.proxy.blackhole();
        }
        let release = tokio::spawn(async move {
            match held {
                Held::Guard(g) => g.release().await,
                Held::Permit(p) => p.release().await,
            }
        });
        tokio::time::sleep(outage).await;
        a.heal();
        if !free_within(&b, &key, FREED_AFTER_OUTAGE).await {
            failures.push(format!("{variant}: key still held {FREED_AFTER_OUTAGE:?} after the store was back"));
        }
        // Its outcome may be an error; it must not hang once the store is back.
        let what = format!("release() called during the outage ({variant})");
        let _ = a.bounded(&what, a.op_timeout * 2, release).await;
        a.warm_up(None).await;
    }
    assert!(failures.is_empty(), "release during a 3 s outage, TTL 30 s: {}", failures.join("; "));
}

/// F4 (C6, C10): a waiter whose store hangs fails with the store's error
/// ([`Error::Backend`]), not [`Error::Timeout`] (which means "busy"), within
/// its deadline plus the store's operation timeout (and some slack).
pub async fn f4_hung_store_while_waiting(store: &Store) {
    let Some(target) = target(store, "f4_hung_store_while_waiting") else { return };
    let a = client(store, "f4-a").await;
    let key = fresh_key("f4");
    let held = a.mutex(&key).ttl(TTL).acquire().await.expect("A acquires directly");
    let b = Proxied::start(target, "f4-b").await;
    let deadline = Duration::from_secs(3);
    let started = Instant::now();
    let mutex = b.client.mutex(&key).ttl(TTL);
    let waiting = tokio::spawn(async move { mutex.acquire_timeout(deadline).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    b.proxy.blackhole();
    let outcome = b.bounded("acquire_timeout on a hung store", deadline + b.op_timeout * 2, waiting).await;
    let took = started.elapsed();
    match outcome.expect("waiter task") {
        Err(Error::Backend { .. }) => {}
        Err(e @ Error::Timeout { .. }) => {
            panic!("a waiter whose store hung got `{e}` after {took:?}: a store failure must be Error::Backend")
        }
        Ok(guard) => panic!("granted (fence {}) a key another client holds", guard.fence()),
        Err(e) => panic!("a waiter whose store hung: unexpected error {e:?}"),
    }
    let limit = deadline + b.op_timeout + Duration::from_secs(2);
    assert!(took <= limit, "the waiter failed after {took:?}: beyond deadline + operation timeout + slack ({limit:?})");
    b.heal();
    held.release().await.expect("A releases");
}

/// F5 (C6, C10): a store that is silent before it answers a waiter's first
/// attempt, with a deadline shorter than the store's operation timeout (the
/// CLI's `--wait 5s` against a 5 s timeout), fails with the store's error,
/// not [`Error::Timeout`]: nobody was seen holding the key, so "busy" would
/// be a guess that sends cron to "try later" instead of to the store. Two
/// ways in: silent from before the client connects (a client that dials
/// lazily, as etcd's does, builds fine and meets it on its first call), and
/// silent after the client has worked.
pub async fn f5_silent_store_at_the_deadline(store: &Store) {
    let Some(target) = target(store, "f5_silent_store_at_the_deadline") else { return };
    let key = fresh_key("f5");

    // Silent from the start.
    let proxy = FaultProxy::start(target.upstream);
    proxy.blackhole();
    let url = (target.url)(proxy.addr());
    let deadline = target.op_timeout / 2;
    let started = Instant::now();
    let attempt = async {
        let client = Client::connect_with(&url, ClientOptions::default().with_label("f5-a")).await?;
        client.mutex(&key).ttl(TTL).acquire_timeout(deadline).await.map(|guard| guard.fence())
    };
    let limit = target.op_timeout * 3 + HANG_SLACK;
    let outcome = tokio::time::timeout(limit, attempt).await.unwrap_or_else(|_| {
        panic!("connect and acquire_timeout({deadline:?}) on a silent store: still running after {limit:?}")
    });
    silent_store_outcome("silent before the client connected", outcome, started.elapsed());
    drop(proxy);

    // Silent after the client has worked.
    let b = Proxied::start(target, "f5-b").await;
    b.proxy.blackhole();
    let started = Instant::now();
    let mutex = b.client.mutex(&key).ttl(TTL);
    let waited = mutex.acquire_timeout(deadline);
    let outcome = b.bounded("acquire_timeout on a silent store", deadline + b.op_timeout * 2, waited).await;
    silent_store_outcome("silent after the client worked", outcome.map(|guard| guard.fence()), started.elapsed());
    b.heal();
    b.warm_up(Some(&key)).await;
}

fn silent_store_outcome(case: &str, outcome: holdfast::Result<u64>, took: Duration) {
    match outcome {
        Err(Error::Backend { .. }) => {}
        Err(e @ Error::Timeout { .. }) => {
            panic!("{case}: a waiter whose store never answered got `{e}` after {took:?}: it must be Error::Backend")
        }
        Ok(fence) => panic!("{case}: granted (fence {fence}) by a store that cannot be reached"),
        Err(e) => panic!("{case}: a waiter whose store never answered: unexpected error {e:?}"),
    }
}
