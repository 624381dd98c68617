//! The clauses C1..C11, each an `async fn(&Store)`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error, OwnerToken};
use rand::Rng;

use super::Store;

/// A client of the store under test, with a label naming the test.
pub async fn client(store: &Store, label: &str) -> Client {
    let opts = ClientOptions::default().with_label(label);
    match store.client_at(&store.url, opts).await {
        Ok(c) => c,
        Err(e) => panic!("cannot connect to {}: {e}", store.url),
    }
}

/// A key no other test uses.
pub fn fresh_key(clause: &str) -> String {
    format!("conformance/{clause}/{:016x}", rand::rng().random::<u64>())
}

/// Polls `f` every 10 ms until true, failing after `within`.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if f().await {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not true within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether `client` can take `key` right now (a grant it then releases).
pub(crate) async fn is_free(client: &Client, key: &str) -> bool {
    match client.mutex(key).try_acquire().await {
        Ok(Some(g)) => {
            g.release().await.expect("release of a probe grant");
            true
        }
        Ok(None) => false,
        Err(e) => panic!("probe try_acquire failed: {e}"),
    }
}

/// C1: among unexpired grants of a key there is at most one holder.
pub async fn c1_exclusion(store: &Store) {
    let (a, b) = (client(store, "c1-a").await, client(store, "c1-b").await);
    let key = fresh_key("c1");
    let held = a.mutex(&key).acquire().await.expect("first acquire");
    assert!(b.mutex(&key).try_acquire().await.expect("try").is_none(), "a second client got a held key");
    assert!(a.mutex(&key).try_acquire().await.expect("try").is_none(), "the same client got a held key twice");
    match b.mutex(&key).acquire_timeout(Duration::from_millis(300)).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected Timeout on a held key, got {other:?}"),
    }
    held.release().await.expect("release");

    // Many tasks over three clients: never two inside, no cycle lost.
    let clients = [a, b, client(store, "c1-c").await];
    let inside = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let (tasks, cycles) = (9u64, 12u64);
    let mut joins = Vec::new();
    for t in 0..tasks {
        let c = clients[(t % 3) as usize].clone();
        let (key, inside, done) = (key.clone(), inside.clone(), done.clone());
        joins.push(tokio::spawn(async move {
            for _ in 0..cycles {
                let g = c.mutex(&key).acquire_timeout(Duration::from_secs(60)).await.expect("acquire");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders inside at once");
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                done.fetch_add(1, Ordering::SeqCst);
                g.release().await.expect("release");
            }
        }));
    }
    for j in joins {
        j.await.expect("task");
    }
    assert_eq!(done.load(Ordering::SeqCst), tasks * cycles);
}

/// C2: every grant's fence is strictly greater than every earlier fence of the key,
/// across clients, releases and expiries.
pub async fn c2_fencing(store: &Store) {
    let clients = [client(store, "c2-a").await, client(store, "c2-b").await];
    let key = fresh_key("c2");
    let mut last = 0u64;
    for i in 0..20 {
        let g = clients[i % 2].mutex(&key).acquire().await.expect("acquire");
        assert!(g.fence() > last, "fence {} after {last}", g.fence());
        last = g.fence();
        g.release().await.expect("release");
    }
    // After an expiry (the holder never releases) the next fence is higher too.
    let g = clients[0].mutex(&key).ttl(Duration::from_millis(300)).no_renew().acquire().await.expect("acquire");
    assert!(g.fence() > last);
    last = g.fence();
    g.leak();
    let g = clients[1]
        .mutex(&key)
        .acquire_timeout(Duration::from_secs(10) + store.expiry_slack)
        .await
        .expect("after expiry");
    assert!(g.fence() > last, "fence {} after expiry of {last}", g.fence());
    g.release().await.expect("release");
    // Fences of other keys never interfere with this one's order.
    let other = fresh_key("c2-other");
    let g2 = clients[0].mutex(&other).acquire().await.expect("acquire other");
    g2.release().await.expect("release other");
}

/// C3: a holder that vanishes without releasing frees the key within its TTL
/// (plus the store's slack). Here the holder stops renewing and is forgotten;
/// [`c3_expiry_killed_process`](super::child) kills a real process.
pub async fn c3_expiry(store: &Store) {
    let (a, b) = (client(store, "c3-a").await, client(store, "c3-b").await);
    let key = fresh_key("c3");
    let ttl = Duration::from_millis(500);
    let g = a.mutex(&key).ttl(ttl).no_renew().acquire().await.expect("acquire");
    let granted = Instant::now();
    g.leak();
    let g = b.mutex(&key).acquire_timeout(ttl + store.expiry_slack + Duration::from_secs(5)).await.expect("key freed");
    let took = granted.elapsed();
    assert!(took <= ttl + store.expiry_slack + Duration::from_secs(1), "key freed only after {took:?}");
    // A session-bound store keeps a grant while its session lives, and `a`'s
    // session is alive: only the client's release at the lease's deadline
    // can have freed the key, so it must come at the TTL, not the session's.
    if a.capabilities().session_bound {
        assert!(took <= ttl + Duration::from_secs(1), "live client freed its unrenewed lease only after {took:?}");
    }
    g.release().await.expect("release");
}

/// C4: release and renew with a stale or forged token fail and touch nobody else's grant.
pub async fn c4_ownership(store: &Store) {
    let (a, b, c) = (client(store, "c4-a").await, client(store, "c4-b").await, client(store, "c4-c").await);
    let key = fresh_key("c4");
    let held = b.mutex(&key).acquire().await.expect("acquire");
    let lock_key = holdfast::LockKey::new(key.clone()).expect("key");
    let forged = OwnerToken::random();
    let raw = store.backend(&store.url).await.expect("raw store connection");
    assert!(!raw.release(&lock_key, forged).await.expect("forged release"), "a forged token released a lock");
    let renewed = raw
        .renew(&[holdfast::backend::RenewRequest {
            key: lock_key.clone(),
            token: forged,
            ttl: Duration::from_secs(60),
        }])
        .await
        .expect("forged renew");
    assert_eq!(renewed, vec![false], "a forged token renewed a lock");
    assert!(c.mutex(&key).try_acquire().await.expect("try").is_none(), "forged calls freed the key");
    held.release().await.expect("owner release");

    // A stale holder (its lease expired and someone else took the key)
    // gets a typed error on release, and the new holder keeps the key.
    let stale = a.mutex(&key).ttl(Duration::from_millis(300)).no_renew().acquire().await.expect("acquire");
    let fresh = b.mutex(&key).acquire_timeout(Duration::from_secs(10) + store.expiry_slack).await.expect("take over");
    assert!(fresh.fence() > stale.fence());
    match stale.release().await {
        Err(Error::Lost { .. }) => {}
        other => panic!("stale release should be Lost, got {other:?}"),
    }
    assert!(c.mutex(&key).try_acquire().await.expect("try").is_none(), "a stale release freed the new holder's key");
    fresh.release().await.expect("release");
    // Releasing twice through the backend is idempotent and says not held.
    assert!(!raw.release(&lock_key, forged).await.expect("second release"));
}

/// C5: while a guard lives its lease is renewed, and `lost()` stays pending.
pub async fn c5_renewal(store: &Store) {
    let (a, b) = (client(store, "c5-a").await, client(store, "c5-b").await);
    let key = fresh_key("c5");
    // Short enough that the hold outlives several TTLs, long enough that a
    // CI machine running every test at once does not starve a renewal past
    // it (400 ms did, once).
    let ttl = Duration::from_millis(1000);
    let g = a.mutex(&key).ttl(ttl).acquire().await.expect("acquire");
    let lost = g.lost();
    tokio::pin!(lost);
    let hold_for = ttl * 4 + store.expiry_slack;
    tokio::select! {
        _ = &mut lost => panic!("lost() fired while renewal was running"),
        _ = tokio::time::sleep(hold_for) => {}
    }
    assert_eq!(a.renewing_leases(), 1);
    assert!(!g.is_lost());
    assert!(b.mutex(&key).try_acquire().await.expect("try").is_none(), "the key was free although renewed");
    g.release().await.expect("release after renewals");
    assert_eq!(a.renewing_leases(), 0, "renewal continued after release");
}

/// C5: when renewal stops (here by the hold cap) `lost()` resolves before
/// another client is granted the key.
pub async fn c5_lost_before_regrant(store: &Store) {
    let (a, b) = (client(store, "c5l-a").await, client(store, "c5l-b").await);
    let key = fresh_key("c5l");
    let ttl = Duration::from_millis(400);
    let g = a.mutex(&key).ttl(ttl).max_hold(Duration::from_millis(200)).acquire().await.expect("acquire");
    let lost_at = {
        let lost = g.lost();
        tokio::spawn(async move {
            lost.await;
            Instant::now()
        })
    };
    let waiter = b.mutex(&key).acquire_timeout(Duration::from_secs(10) + store.expiry_slack).await.expect("regrant");
    // The holder's view at the moment the key is granted again: lost. (A
    // task that awaits lost() and then reads the clock measures when it
    // was scheduled, which a loaded machine delays past the regrant: once
    // by 91 µs, with the lease lost long before.)
    assert!(g.is_lost(), "the holder still saw its lease held when the key was granted again");
    let granted_at = Instant::now();
    let lost_at =
        tokio::time::timeout(Duration::from_secs(5), lost_at).await.expect("lost() never fired").expect("task");
    assert!(
        lost_at <= granted_at + Duration::from_millis(100),
        "lost() fired {:?} after the regrant",
        lost_at - granted_at
    );
    assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    waiter.release().await.expect("release");
}

/// C6: a waiter is woken by the release, long before any TTL would free the key,
/// and one release grants one waiter.
pub async fn c6_waiting(store: &Store) {
    let clients = [client(store, "c6-a").await, client(store, "c6-b").await, client(store, "c6-c").await];
    let key = fresh_key("c6");
    let g = clients[0].mutex(&key).ttl(Duration::from_secs(60)).acquire().await.expect("acquire");
    let granted = Arc::new(AtomicU32::new(0));
    // Waiters holding the key now, and the most that ever did at once: a
    // release that granted more than one waiter shows here, however late the
    // checks below run on a loaded machine.
    let (inside, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let mut waiters = Vec::new();
    for i in 0..4 {
        let (c, key, granted) = (clients[1 + i % 2].clone(), key.clone(), granted.clone());
        let (inside, most) = (inside.clone(), most.clone());
        waiters.push(tokio::spawn(async move {
            let g = c.mutex(&key).ttl(Duration::from_secs(60)).acquire().await.expect("waiter acquire");
            most.fetch_max(inside.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            granted.fetch_add(1, Ordering::SeqCst);
            let at = Instant::now();
            tokio::time::sleep(Duration::from_millis(200)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            g.release().await.expect("waiter release");
            at
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(granted.load(Ordering::SeqCst), 0, "a waiter was granted a held key");
    let released = Instant::now();
    g.release().await.expect("release");
    eventually("a waiter granted after the release", Duration::from_secs(5), || {
        let granted = granted.clone();
        async move { granted.load(Ordering::SeqCst) >= 1 }
    })
    .await;
    let mut first = None;
    for w in waiters {
        let at = tokio::time::timeout(Duration::from_secs(20), w).await.expect("waiter stuck").expect("task");
        first = Some(first.map_or(at, |f: Instant| f.min(at)));
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "one release must grant exactly one waiter at a time");
    let wake = first.expect("a waiter") - released;
    // Generous liveness bound: a 60 s TTL never freed it, a wake-up did.
    assert!(wake < Duration::from_secs(2), "first waiter woke {wake:?} after release");
}

/// C7: where the store declares fairness, grants follow request order.
pub async fn c7_fairness(store: &Store) {
    let a = client(store, "c7-a").await;
    let caps = a.capabilities();
    let key = fresh_key("c7");
    if !caps.fair && !caps.always_fair {
        match a.mutex(&key).fair(true).try_acquire().await {
            Err(Error::Unsupported { .. }) => return,
            other => panic!("fair lock on a store without fairness should be Unsupported, got {other:?}"),
        }
    }
    let g = a.mutex(&key).fair(true).acquire().await.expect("acquire");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5 {
        let c = client(store, &format!("c7-w{i}")).await;
        let (key, order) = (key.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let g = c.mutex(&key).fair(true).acquire().await.expect("fair acquire");
            order.lock().expect("order").push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.expect("release");
        }));
        // Let this waiter's request reach the store before the next one's.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    g.release().await.expect("release");
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(30), w).await.expect("waiter stuck").expect("task");
    }
    assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3, 4], "grants out of request order");
}

/// C8: a reentrant owner re-acquires; the key is free only after the last release.
pub async fn c8_reentrancy(store: &Store) {
    let (a, b) = (client(store, "c8-a").await, client(store, "c8-b").await);
    let key = fresh_key("c8");
    let outer = a.mutex(&key).reentrant("job-1").acquire().await.expect("outer");
    let inner = a.mutex(&key).reentrant("job-1").try_acquire().await.expect("inner").expect("reentrant grant");
    assert_eq!(inner.fence(), outer.fence(), "a re-entry is the same grant");
    assert_eq!(outer.hold_count(), 2);
    assert!(a.mutex(&key).reentrant("job-2").try_acquire().await.expect("try").is_none(), "another owner re-entered");
    assert!(
        b.mutex(&key).reentrant("job-1").try_acquire().await.expect("try").is_none(),
        "reentrancy leaked across clients"
    );
    inner.release().await.expect("inner release");
    assert!(b.mutex(&key).try_acquire().await.expect("try").is_none(), "freed before the outer release");
    outer.release().await.expect("outer release");
    assert!(is_free(&b, &key).await, "not free after the last release");
    // Not reentrant unless asked.
    let g = a.mutex(&key).acquire().await.expect("acquire");
    assert!(a.mutex(&key).try_acquire().await.expect("try").is_none());
    g.release().await.expect("release");
}

/// C9: acquire futures aborted at random points leave no grant and no queue entry.
pub async fn c9_cancel_safety(store: &Store) {
    let (a, b) = (client(store, "c9-a").await, client(store, "c9-b").await);
    let key = fresh_key("c9");
    let fair = a.capabilities().fair;
    // On a free key: aborts race the grant itself.
    for i in 0..40 {
        let m = a.mutex(&key).ttl(Duration::from_secs(60)).fair(fair && i % 2 == 0);
        let abort_after = Duration::from_micros(rand::rng().random_range(0..4000));
        if let Ok(Ok(g)) = tokio::time::timeout(abort_after, m.acquire()).await {
            g.release().await.expect("release");
        }
    }
    // On a held key: aborted waiters must leave no queue entry behind.
    let g = b.mutex(&key).ttl(Duration::from_secs(60)).acquire().await.expect("hold");
    for i in 0..20 {
        let m = a.mutex(&key).ttl(Duration::from_secs(60)).fair(fair && i % 2 == 0);
        let abort_after = Duration::from_micros(rand::rng().random_range(0..20_000));
        assert!(tokio::time::timeout(abort_after, m.acquire()).await.is_err(), "granted a held key");
    }
    // acquire_timeout cleans up before it returns.
    assert!(matches!(a.mutex(&key).acquire_timeout(Duration::from_millis(50)).await, Err(Error::Timeout { .. })));
    g.release().await.expect("release");
    // Background releases of raced grants finish quickly; long before the 60 s TTL.
    eventually("key free after aborted acquires", Duration::from_secs(5), || is_free(&b, &key)).await;
    let status = b.status(&key).await.expect("status");
    assert!(status.holder.is_none(), "a holder remained: {status:?}");
    if let Some(w) = status.waiters {
        assert_eq!(w, 0, "queue entries remained after aborted waiters");
    }
}

/// C10: bad input is a typed error, before any I/O, with nothing written;
/// an unreachable store is a typed error within a bounded time.
pub async fn c10_bad_input(store: &Store) {
    let a = client(store, "c10").await;
    let key = fresh_key("c10");
    let bad_keys =
        [String::new(), "k".repeat(holdfast::LockKey::MAX_BYTES + 1), "nul\0byte".into(), "new\nline".into()];
    for bad in &bad_keys {
        match a.mutex(bad.clone()).try_acquire().await {
            Err(Error::InvalidInput { what: "key", .. }) => {}
            other => panic!("key {bad:?}: expected InvalidInput, got {other:?}"),
        }
        assert!(matches!(a.status(bad).await, Err(Error::InvalidInput { .. })));
    }
    for ttl in [Duration::ZERO, Duration::from_millis(1), holdfast::LockOptions::MAX_TTL + Duration::from_secs(1)] {
        match a.mutex(&key).ttl(ttl).try_acquire().await {
            Err(Error::InvalidInput { what: "ttl", .. }) => {}
            other => panic!("ttl {ttl:?}: expected InvalidInput, got {other:?}"),
        }
    }
    assert!(matches!(
        a.mutex(&key).ttl(Duration::from_secs(1)).renew_every(Duration::from_secs(2)).try_acquire().await,
        Err(Error::InvalidInput { .. })
    ));
    assert!(a.status(&key).await.expect("status").holder.is_none(), "bad input wrote a grant");
    // Hostile but valid keys work.
    for odd in ["quote'\"", "back\\slash", "100%_like", "ünï/cødé", "semi;colon -- DROP TABLE x"] {
        let g = a.mutex(odd).acquire().await.unwrap_or_else(|e| panic!("key {odd:?}: {e}"));
        g.release().await.expect("release");
    }
    for bad_url in ["", "://", "nonsense", "gopher://x"] {
        assert!(matches!(Client::connect(bad_url).await, Err(Error::InvalidInput { .. })), "url {bad_url:?}");
    }
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(30), async {
        let c = store.client_at(&store.unreachable_url, ClientOptions::default()).await?;
        c.mutex("k").acquire_timeout(Duration::from_secs(5)).await.map(|_| ())
    })
    .await
    .expect("an unreachable store hung for 30 s");
    match outcome {
        Err(Error::Backend { .. } | Error::Timeout { .. }) => {}
        other => panic!("unreachable store: expected a Backend or Timeout error, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// C11: a guard dropped without release frees the key in the background;
/// with no runtime left, the lease expires instead.
pub async fn c11_drop(store: &Store) {
    let (a, b) = (client(store, "c11-a").await, client(store, "c11-b").await);
    let key = fresh_key("c11");
    let g = a.mutex(&key).ttl(Duration::from_secs(60)).acquire().await.expect("acquire");
    drop(g);
    eventually("key released after drop", Duration::from_secs(5), || is_free(&b, &key)).await;
    assert_eq!(a.renewing_leases(), 0, "renewal continued after drop");

    // No runtime at drop time: the lease expires after its TTL.
    let key2 = fresh_key("c11-nort");
    let k = key2.clone();
    let backend = store.backend(&store.url).await.expect("connect");
    let guard = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        let g = rt.block_on(async {
            let c = Client::with_backend(backend, ClientOptions::default());
            c.mutex(&k).ttl(Duration::from_millis(600)).acquire().await.expect("acquire")
        });
        drop(rt);
        g
    })
    .join()
    .expect("thread");
    let dropped = Instant::now();
    std::thread::spawn(move || drop(guard)).join().expect("drop without runtime must not panic");
    let g = b
        .mutex(&key2)
        .acquire_timeout(Duration::from_secs(10) + store.expiry_slack)
        .await
        .expect("lease expired after drop without runtime");
    assert!(dropped.elapsed() <= Duration::from_millis(600) + store.expiry_slack + Duration::from_secs(2));
    g.release().await.expect("release");
}

/// C9 (lost reply): an acquire retried by the token that already holds the
/// key (its first reply was lost) gets the grant back with its lease counted
/// from the retry, as the client counts it: the key stays held past the
/// first attempt's TTL.
pub async fn c9_retry_refreshes_the_lease(store: &Store) {
    let raw = store.backend(&store.url).await.expect("raw store connection");
    let key = holdfast::LockKey::new(fresh_key("c9-retry")).expect("key");
    let ttl = Duration::from_millis(1500);
    let req = holdfast::backend::AcquireRequest::new(key.clone(), OwnerToken::random(), ttl).with_label("c9-retry");
    let first = raw.try_acquire(&req).await.expect("acquire").expect("a free key is granted");
    let first_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(900)).await;
    let again = raw.try_acquire(&req).await.expect("retry").expect("the retry gets the grant back");
    assert!(again.fence >= first.fence, "the retry's fence went backwards");
    // Past the first attempt's TTL (and its store's slack), within the retry's.
    tokio::time::sleep((first_at + ttl + Duration::from_millis(200)).saturating_duration_since(Instant::now())).await;
    let other = holdfast::backend::AcquireRequest::new(key.clone(), OwnerToken::random(), ttl);
    let stolen = raw.try_acquire(&other).await.expect("other try");
    if let Some(g) = &stolen {
        let _ = raw.release(&key, other.token).await;
        panic!("another token was granted (fence {}) while the retried lease was still running", g.fence);
    }
    assert!(raw.release(&key, req.token).await.expect("release"), "the retried grant was gone");
}
