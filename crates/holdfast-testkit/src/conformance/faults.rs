//! The fault clauses F1..F4: a client reaches the store through a
//! [`FaultProxy`], which loses replies, withholds traffic or refuses
//! connections while the client calls; another client, connected directly,
//! then checks what the store was left with.
//!
//! Every lease here has a 30 s TTL and every bound checked is a few seconds,
//! so a key that comes free in time was released by a token, never expired.

use std::future::Future;
use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error};

use super::{ProxyTarget, Store, client, eventually, fresh_key, is_free};
use crate::faults::FaultProxy;

/// The TTL of every lease in these clauses: far above every bound they check.
const TTL: Duration = Duration::from_secs(30);
/// How soon a key must be free for another client once its holder released it
/// (or once the faulty network is healed).
const FREED_WITHIN: Duration = Duration::from_secs(3);
/// F3: how soon after the store is reachable again; leaves room for a
/// background retry's backoff.
const FREED_AFTER_OUTAGE: Duration = Duration::from_secs(5);
/// What a call may take beyond the store operation timeouts it may spend
/// before it counts as hung: scheduling on a loaded machine.
const HANG_SLACK: Duration = Duration::from_secs(3);

/// The store's proxy target, or `None` when there is no network between
/// client and store to fault (SQLite: a file in the client's process); the
/// clause then has nothing to test, says so, and returns.
fn target<'a>(store: &'a Store, clause: &str) -> Option<&'a ProxyTarget> {
    let target = store.via_proxy.as_ref();
    if target.is_none() {
        let scheme = store.url.split("://").next().unwrap_or_default();
        eprintln!("{clause}: not applicable to {scheme}: no network between client and store");
    }
    target
}

/// A client that reaches the store through a fault proxy.
struct Proxied {
    proxy: FaultProxy,
    client: Client,
    op_timeout: Duration,
}

impl Proxied {
    async fn start(target: &ProxyTarget, label: &str) -> Self {
        let proxy = FaultProxy::start(target.upstream);
        let url = (target.url)(proxy.addr());
        let client = Client::connect_with(&url, ClientOptions::default().with_label(label))
            .await
            .unwrap_or_else(|e| panic!("cannot connect through the proxy to {url}: {e}"));
        let proxied = Proxied { proxy, client, op_timeout: target.op_timeout };
        proxied.warm_up().await;
        proxied
    }

    /// One lock cycle through the proxy, retried for up to 15 s (after a cut
    /// the client has to reconnect). Connections, and etcd's session lease of
    /// [`TTL`], then exist, so that a fault switched on next hits the request
    /// under test and not a handshake: a handshake whose reply is lost keeps
    /// the request from being sent at all, and the clause would test nothing.
    async fn warm_up(&self) {
        let key = fresh_key("warm-up");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let cycle = async {
                let guard = self.client.mutex(&key).ttl(TTL).acquire_timeout(self.op_timeout * 2).await?;
                guard.release().await
            };
            let error = match tokio::time::timeout(self.op_timeout * 4 + HANG_SLACK, cycle).await {
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
    fn heal(&self) {
        self.proxy.cut();
        self.proxy.forward();
    }

    /// Awaits `call`, which may spend `budget` in store operation timeouts;
    /// panics if it is still running [`HANG_SLACK`] after that.
    async fn bounded<T>(&self, what: &str, budget: Duration, call: impl Future<Output = T>) -> T {
        let limit = budget + HANG_SLACK;
        tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
            panic!("{what}: still running after {limit:?} (the store's operation timeout is {:?})", self.op_timeout)
        })
    }

    /// Acquires `key` through the proxy while it forwards.
    async fn hold(&self, key: &str) -> holdfast::MutexGuard {
        let mutex = self.client.mutex(key).ttl(TTL);
        self.bounded("acquire through the proxy", self.op_timeout * 2, mutex.acquire_timeout(self.op_timeout * 2))
            .await
            .unwrap_or_else(|e| panic!("acquire through the proxy failed: {e}"))
    }
}

/// Waits until `by` can take `key` (a probe grant it releases at once).
async fn freed(by: &Client, key: &str, within: Duration, what: &str) {
    eventually(&format!("{what}: key free for another client"), within, || is_free(by, key)).await;
}

/// F1 (C9, lost reply): an acquire the store applied but whose reply was lost
/// is released by its token, so another client gets the key within seconds,
/// not after the 30 s TTL. For `try_acquire` and for a waiting
/// `acquire_timeout`; the call itself must fail within about the store's
/// operation timeout.
pub async fn f1_lost_acquire_reply(store: &Store) {
    let Some(target) = target(store, "f1_lost_acquire_reply") else { return };
    let b = client(store, "f1-b").await;
    let a = Proxied::start(target, "f1-a").await;
    let op = a.op_timeout;

    let key = fresh_key("f1-try");
    a.proxy.drop_replies();
    let sent = a.proxy.stats().bytes_to_server;
    let outcome =
        a.bounded("try_acquire with its replies lost", op * 2, a.client.mutex(&key).ttl(TTL).try_acquire()).await;
    assert!(a.proxy.stats().bytes_to_server > sent, "the acquire request never reached the store");
    match outcome {
        Err(_) => {}
        Ok(Some(_)) => panic!("try_acquire returned a grant although every reply was lost"),
        Ok(None) => panic!("try_acquire said a free key was busy"),
    }
    a.heal();
    freed(&b, &key, FREED_WITHIN, "after a try_acquire whose reply was lost").await;

    a.warm_up().await;
    let key = fresh_key("f1-wait");
    let wait = Duration::from_secs(2);
    a.proxy.drop_replies();
    let mutex = a.client.mutex(&key).ttl(TTL);
    if let Ok(guard) =
        a.bounded("acquire_timeout with its replies lost", wait + op * 2, mutex.acquire_timeout(wait)).await
    {
        panic!("acquire_timeout returned a grant (fence {}) although every reply was lost", guard.fence());
    }
    a.heal();
    freed(&b, &key, FREED_WITHIN, "after an acquire_timeout whose reply was lost").await;
}

/// F2 (C4, C9): a release the store applied but whose reply was lost freed
/// the key, and does not report [`Error::Lost`] for a lease that was alive
/// (`Ok` or a store error are both honest answers).
pub async fn f2_lost_release_reply(store: &Store) {
    let Some(target) = target(store, "f2_lost_release_reply") else { return };
    let b = client(store, "f2-b").await;
    let a = Proxied::start(target, "f2-a").await;
    let key = fresh_key("f2");
    let guard = a.hold(&key).await;
    a.proxy.drop_replies();
    match a.bounded("release with its reply lost", a.op_timeout * 2, guard.release()).await {
        Ok(()) | Err(Error::Backend { .. }) => {}
        Err(e @ Error::Lost { .. }) => panic!("release of a live lease whose reply was lost said: {e}"),
        Err(e) => panic!("release with its reply lost: unexpected error {e:?}"),
    }
    a.heal();
    freed(&b, &key, FREED_WITHIN, "after a release whose reply was lost").await;
}

/// F3 (C3, C11): a holder releases while the store is unreachable (silent,
/// then refusing connections): the release may fail, but the key must come
/// free within seconds of the store being reachable again, while the holder's
/// client lives on: not at TTL expiry, and not never (a key kept on a live
/// session until the process exits).
pub async fn f3_release_while_unreachable(store: &Store) {
    let Some(target) = target(store, "f3_release_while_unreachable") else { return };
    let b = client(store, "f3-b").await;
    let a = Proxied::start(target, "f3-a").await;
    let outage = Duration::from_secs(3);
    for refuse in [false, true] {
        let variant = if refuse { "store refusing connections" } else { "store silent" };
        let key = fresh_key("f3");
        let guard = a.hold(&key).await;
        if refuse {
            a.proxy.refuse();
            a.proxy.cut();
        } else {
            a.proxy.blackhole();
        }
        let release = tokio::spawn(guard.release());
        tokio::time::sleep(outage).await;
        a.heal();
        freed(&b, &key, FREED_AFTER_OUTAGE, &format!("release during an outage ({variant}), then the store back"))
            .await;
        // Its outcome may be an error; it must not hang once the store is back.
        let what = format!("release() called during the outage ({variant})");
        let _ = a.bounded(&what, a.op_timeout * 2, release).await;
        a.warm_up().await;
    }
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
