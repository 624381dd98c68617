//! The composites' member clauses (`m1`..`m3`): a composite (RedLock,
//! layered, fallback) rides out the outage of a member it exists to ride
//! out, whether that member is down when the clients are built, goes down
//! while they run, or comes back. Each clause is an `async fn(&Composite)`,
//! run from the composite's conformance module with
//! [`member_clauses!`](crate::member_clauses).
//!
//! What every clause checks through the outage: grants are made (within a
//! generous wait: a fallback chain first switches), exclusion holds (a second
//! client finds a held key busy), and fences increase from one grant to the
//! next.

use std::any::Any;
use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error, MutexGuard};

use super::fresh_key;

/// A composite under test whose members the clauses can stop and start.
pub struct Composite {
    /// The composite's URL, as users open it.
    pub url: String,
    /// The member the clauses take down: one whose loss the composite rides
    /// out (a RedLock member, a layered chain's fast store, a fallback
    /// chain's first store).
    pub member: usize,
    /// Another member to take down once `member` is back, whose loss the
    /// composite rides out only with `member` taking part again (a second
    /// RedLock member); `None` where no such member exists.
    pub then_stop: Option<usize>,
    /// Stops member `i` (SIGKILL).
    pub stop: Box<dyn Fn(usize) + Send + Sync>,
    /// Starts member `i` again at its address.
    pub start: Box<dyn Fn(usize) + Send + Sync>,
    /// Keeps the servers alive for the clause.
    pub servers: Box<dyn Any + Send + Sync>,
}

/// How long a grant may take through an outage: a fallback chain switches
/// (`switch_after` plus a mode TTL), a member is reconnected with backoff;
/// generous for a loaded 2-core machine.
const THROUGH_OUTAGE: Duration = Duration::from_secs(60);

async fn composite_client(c: &Composite, label: &str) -> Client {
    let started = Instant::now();
    let opts = ClientOptions::default().with_label(label).with_store_retry(THROUGH_OUTAGE);
    let client = Client::connect_with(&c.url, opts)
        .await
        .unwrap_or_else(|e| panic!("{label}: a composite must build with a member down: {e}"));
    assert!(started.elapsed() < Duration::from_secs(20), "{label}: building took {:?}", started.elapsed());
    client
}

/// Takes `key` on `a` through the outage, checks that `b` finds it busy and
/// that its fence is above `after`; returns the guard.
async fn grant_excluding(a: &Client, b: &Client, key: &str, after: u64, what: &str) -> MutexGuard {
    let g = a.mutex(key).acquire_timeout(THROUGH_OUTAGE).await.unwrap_or_else(|e| panic!("{what}: no grant: {e}"));
    assert!(g.fence() > after, "{what}: fence {} not above {after}", g.fence());
    let busy = tokio::time::timeout(THROUGH_OUTAGE, b.mutex(key).try_acquire())
        .await
        .unwrap_or_else(|_| panic!("{what}: a try hung"));
    match busy {
        Ok(None) => {}
        Ok(Some(other)) => panic!("{what}: two holders (fences {} and {})", g.fence(), other.fence()),
        // A try does not wait: during a fallback chain's switch or
        // fail-back it may meet a retryable store error. Not a grant, so
        // exclusion holds.
        Err(e) if e.is_retryable() => {}
        Err(e) => panic!("{what}: the try of a held key failed: {e}"),
    }
    g
}

/// M1: a member is down when the clients are built: they build, grants are
/// made, exclusion holds and fences increase.
pub async fn m1_member_down_at_start(c: &Composite) {
    (c.stop)(c.member);
    let (a, b) = (composite_client(c, "m1-a").await, composite_client(c, "m1-b").await);
    let key = fresh_key("m1");
    let g1 = grant_excluding(&a, &b, &key, 0, "m1 first grant").await;
    let f1 = g1.fence();
    g1.release().await.expect("release");
    let g2 = grant_excluding(&b, &a, &key, f1, "m1 second grant").await;
    g2.release().await.expect("release");
}

/// M2: a member goes down while the clients run: grants go on, exclusion
/// holds, fences increase past the grants made before the outage.
pub async fn m2_member_down_mid_run(c: &Composite) {
    let (a, b) = (composite_client(c, "m2-a").await, composite_client(c, "m2-b").await);
    let key = fresh_key("m2");
    let g0 = grant_excluding(&a, &b, &key, 0, "m2 before the outage").await;
    let f0 = g0.fence();
    g0.release().await.expect("release");
    (c.stop)(c.member);
    let g1 = grant_excluding(&a, &b, &key, f0, "m2 during the outage").await;
    let f1 = g1.fence();
    g1.release().await.expect("release");
    let g2 = grant_excluding(&b, &a, &key, f1, "m2 during the outage, other client").await;
    g2.release().await.expect("release");
}

/// M3: a member down at start comes back: grants go on through its return
/// (a fallback chain may fail back to it meanwhile), exclusion holds, fences
/// increase; where the composite has a `then_stop` member, stopping it
/// shows the returned member taking part again.
pub async fn m3_member_back_again(c: &Composite) {
    (c.stop)(c.member);
    let (a, b) = (composite_client(c, "m3-a").await, composite_client(c, "m3-b").await);
    let key = fresh_key("m3");
    let g = grant_excluding(&a, &b, &key, 0, "m3 during the outage").await;
    let mut fence = g.fence();
    g.release().await.expect("release");
    (c.start)(c.member);
    // Grants through the member's return: its background reconnection
    // (backoff up to 2 s), and a fail-back where the composite makes one.
    let until = Instant::now() + Duration::from_secs(5);
    let mut round = 0;
    while Instant::now() < until {
        let (x, y) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let g = grant_excluding(x, y, &key, fence, "m3 as the member returns").await;
        fence = g.fence();
        g.release().await.expect("release");
        round += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(other) = c.then_stop {
        (c.stop)(other);
        let g = grant_excluding(&a, &b, &key, fence, "m3 with the returned member needed").await;
        g.release().await.expect("release");
    }
}

/// M4: permits through a member's outage and return, for a composite that
/// declares shared leases (a semaphore takes its own path through every
/// composite): a member is down when the clients are built; a semaphore of
/// 2 grants two permits (one to each client) and refuses a third to
/// either, then again and again as the member comes back (and a fallback
/// chain fails back to it).
pub async fn m4_permits_through_an_outage(c: &Composite) {
    (c.stop)(c.member);
    let (a, b) = (composite_client(c, "m4-a").await, composite_client(c, "m4-b").await);
    if !a.capabilities().shared_leases {
        eprintln!("m4_permits_through_an_outage: the composite declares no shared leases");
        return;
    }
    let key = fresh_key("m4");
    permits_bounded(&a, &b, &key, "m4 during the outage").await;
    (c.start)(c.member);
    let until = Instant::now() + Duration::from_secs(5);
    let mut round = 0;
    while Instant::now() < until {
        let (x, y) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        permits_bounded(x, y, &key, "m4 as the member returns").await;
        round += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One permit of `key`'s semaphore of 2 to each of `a` and `b` through the
/// outage; a third is refused to both while neither is lost (a switch of a
/// fallback chain loses the holders of the epoch before, as documented:
/// then a third permit is no double grant); then both are released.
async fn permits_bounded(a: &Client, b: &Client, key: &str, what: &str) {
    let take = async |c: &Client, which: &str| {
        c.semaphore(key, 2)
            .acquire_timeout(THROUGH_OUTAGE)
            .await
            .unwrap_or_else(|e| panic!("{what}: no permit for {which}: {e}"))
    };
    let (pa, pb) = (take(a, "a").await, take(b, "b").await);
    assert_ne!(pa.fence(), pb.fence(), "{what}: two permits of one fence");
    for c in [a, b] {
        let third = tokio::time::timeout(THROUGH_OUTAGE, c.semaphore(key, 2).try_acquire())
            .await
            .unwrap_or_else(|_| panic!("{what}: a try hung"));
        match third {
            Ok(None) => {}
            // Both unlost after the third grant: both were during it.
            Ok(Some(p)) if !pa.is_lost() && !pb.is_lost() => {
                panic!("{what}: three permits of 2 (fences {}, {}, {})", pa.fence(), pb.fence(), p.fence())
            }
            Ok(Some(p)) => eprintln!("{what}: a permit lost to a switch; fence {} granted after it", p.fence()),
            // Not a grant (a fallback chain's switch, see `grant_excluding`).
            Err(e) if e.is_retryable() => {}
            Err(e) => panic!("{what}: the try of a full semaphore failed: {e}"),
        }
    }
    for p in [pa, pb] {
        let lost = p.is_lost();
        match p.release().await {
            Ok(()) => {}
            Err(Error::Lost { .. }) if lost => {}
            Err(e) => panic!("{what}: release: {e}"),
        }
    }
}

/// Expands to one `#[test]` per member clause, each on a fresh composite
/// from `$start` (a `fn() -> Composite`), named like `redlock::m1_member_down_at_start`.
#[macro_export]
macro_rules! member_clauses {
    ($start:path) => {
        $crate::member_clauses!(@clauses $start;
            m1_member_down_at_start, m2_member_down_mid_run, m3_member_back_again, m4_permits_through_an_outage);
    };
    (@clauses $start:path; $($clause:ident),*) => {
        $(
            #[test]
            fn $clause() {
                let composite = $start();
                let rt = ::tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(4)
                    .enable_all()
                    .build()
                    .expect("tokio runtime");
                rt.block_on($crate::conformance::$clause(&composite));
                drop(rt);
                drop(composite);
            }
        )*
    };
}
