//! C9 by construction: every lock operation dropped at each of its
//! suspension points in turn ([`cancel_at_each_suspension`]), and cleanups
//! cancelled while in flight. After every drop another client must get the
//! key within seconds; leases last 60 s, so only a release by token (or no
//! grant at all) frees it in time.

use std::sync::Mutex as StdMutex;
use std::time::Duration;

use holdfast::{Client, LockOptions};
use tokio::task::JoinHandle;

use super::{Store, client, eventually, fresh_key, is_free};
use crate::faults::{Sweep, cancel_at, cancel_at_each_suspension};

/// The TTL of every lease here: far above every bound checked.
const TTL: Duration = Duration::from_secs(60);
/// How soon a key must be free for another client after a drop.
const FREED_WITHIN: Duration = Duration::from_secs(3);
/// More suspensions than any one lock operation has (a waiting acquire is
/// woken a few times); a sweep that reaches it fails.
const MAX_SUSPENSIONS: u32 = 200;
/// How many times a `release()` is dropped at each point: whether it had
/// sent its request when dropped depends on timing.
const RELEASE_SWEEPS: u32 = 5;

async fn freed(by: &Client, key: &str, what: &str) {
    eventually(&format!("{what}: key free for another client"), FREED_WITHIN, || is_free(by, key)).await;
}

/// The output of the run that completed (panics if none did), adding its
/// drops to `drops`. A run may complete on its first poll (its reply was
/// already there), so a single operation may have no drops; the clause
/// checks that the operations together had some.
fn completed<T>(operation: &str, sweep: Sweep<T>, drops: &mut u32) -> T {
    let Some(output) = sweep.output else {
        panic!("{operation}: still suspending at its {MAX_SUSPENSIONS}th suspension point")
    };
    eprintln!("{operation}: dropped at each of its first {} suspension points, then completed", sweep.drops);
    *drops += sweep.drops;
    output
}

/// C9: `try_acquire`, `acquire`, `acquire_timeout` (on a key another client
/// holds, then releases), `guard.release()` and `Client::with_lock`, each
/// dropped at its 1st, 2nd, ... suspension until a run completes; after each
/// drop nothing is left: another client gets the key within seconds.
#[expect(
    clippy::async_yields_async,
    reason = "each sweep's setup closure returns the operation's future, unpolled, for the harness to count"
)]
pub async fn c9_cancel_every_await(store: &Store) {
    let (a, c) = (client(store, "c9e-a").await, client(store, "c9e-c").await);
    let key = fresh_key("c9e");
    let mut drops = 0;

    // A key of its own for each run of `try_acquire`, which does not wait: a
    // dropped run's request may still land after the probe (it was in
    // flight, or not yet sent by its task), and the run's cleanup releases
    // it a round trip later; the next run on the same key could meet it in
    // between and be answered "busy". Every dropped run's key is looked at
    // again once the sweep is over.
    let run_key = |n: u32| format!("{key}-try-{n}");
    let sweep = cancel_at_each_suspension(
        MAX_SUSPENSIONS,
        async |n| {
            let mutex = a.mutex(run_key(n)).ttl(TTL);
            async move { mutex.try_acquire().await }
        },
        async |n| freed(&c, &run_key(n), &format!("try_acquire dropped at suspension {n}")).await,
    )
    .await;
    let dropped_runs = sweep.drops;
    let guard = completed("try_acquire", sweep, &mut drops).expect("try_acquire").expect("a free key is granted");
    guard.release().await.expect("release");
    for n in 1..=dropped_runs {
        freed(&c, &run_key(n), &format!("after the sweep, try_acquire dropped at suspension {n}")).await;
    }

    let sweep = cancel_at_each_suspension(
        MAX_SUSPENSIONS,
        async |_| {
            let mutex = a.mutex(&key).ttl(TTL);
            async move { mutex.acquire().await }
        },
        async |n| freed(&c, &key, &format!("acquire dropped at suspension {n}")).await,
    )
    .await;
    completed("acquire", sweep, &mut drops).expect("acquire").release().await.expect("release");

    // A holder that releases 100 ms into each run: drops land while the
    // waiter waits, when it is woken, and while it takes the key.
    let holder = client(store, "c9e-h").await;
    let releasing: StdMutex<Option<JoinHandle<holdfast::Result<()>>>> = StdMutex::new(None);
    let holder_done = async || {
        let task = releasing.lock().expect("slot").take().expect("a holder task");
        task.await.expect("holder task").expect("holder release");
    };
    let sweep = cancel_at_each_suspension(
        MAX_SUSPENSIONS,
        async |_| {
            let held = holder.mutex(&key).ttl(TTL).acquire_timeout(Duration::from_secs(10)).await.expect("holder");
            *releasing.lock().expect("slot") = Some(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                held.release().await
            }));
            let mutex = a.mutex(&key).ttl(TTL);
            async move { mutex.acquire_timeout(Duration::from_secs(10)).await }
        },
        async |n| {
            holder_done().await;
            freed(&c, &key, &format!("acquire_timeout on a held key dropped at suspension {n}")).await
        },
    )
    .await;
    let guard = completed("acquire_timeout on a held key", sweep, &mut drops).expect("acquire_timeout");
    holder_done().await;
    guard.release().await.expect("release");

    // Whether a dropped release had sent its request yet depends on timing:
    // sweep it a few times.
    for _ in 0..RELEASE_SWEEPS {
        let sweep = cancel_at_each_suspension(
            MAX_SUSPENSIONS,
            async |_| {
                let guard = a.mutex(&key).ttl(TTL).acquire_timeout(Duration::from_secs(10)).await.expect("acquire");
                async move { guard.release().await }
            },
            async |n| freed(&c, &key, &format!("release dropped at suspension {n}")).await,
        )
        .await;
        completed("release", sweep, &mut drops).expect("release");
    }

    let sweep = cancel_at_each_suspension(
        MAX_SUSPENSIONS,
        async |_| {
            let (a, key) = (a.clone(), key.clone());
            async move {
                let work = async |_: &holdfast::MutexGuard| {
                    tokio::task::yield_now().await;
                    7
                };
                a.with_lock(key, LockOptions::with_ttl(TTL), work).await
            }
        },
        async |n| freed(&c, &key, &format!("with_lock dropped at suspension {n}")).await,
    )
    .await;
    assert_eq!(completed("with_lock", sweep, &mut drops).expect("with_lock"), 7);
    freed(&c, &key, "after with_lock returned").await;
    assert!(drops > 0, "no operation ever suspended: nothing was cancelled");
}

/// C9: a cleanup cancelled while in flight leaves nothing behind. B's
/// `acquire_timeout(d)` inside `timeout(d)`: both timers fire on one tick, so
/// the outer drops the inner while the inner's cleanup release of its queued
/// attempt is in flight. After ten of those, A releases and a third client
/// must get the key within seconds (a stale queue entry of B, whose client
/// lives on, would hold it). Then a `release()` dropped right after its first
/// poll (five times) must still free the key.
pub async fn c9_cancel_during_cleanup(store: &Store) {
    let (a, b, c) = (client(store, "c9c-a").await, client(store, "c9c-b").await, client(store, "c9c-c").await);
    let key = fresh_key("c9c");
    let held = a.mutex(&key).ttl(TTL).acquire().await.expect("A acquires");
    for i in 0..10u64 {
        let d = Duration::from_millis(5 + 5 * i);
        let mutex = b.mutex(&key).ttl(TTL);
        if let Ok(Ok(guard)) = tokio::time::timeout(d, mutex.acquire_timeout(d)).await {
            panic!("B was granted (fence {}) a key A holds", guard.fence());
        }
    }
    held.release().await.expect("A releases");
    match c.mutex(&key).ttl(TTL).acquire_timeout(FREED_WITHIN).await {
        Ok(guard) => guard.release().await.expect("C releases"),
        Err(e) => panic!("after B's waits were cancelled during their cleanup and A released, C got: {e}"),
    }

    for _ in 0..RELEASE_SWEEPS {
        let guard = a.mutex(&key).ttl(TTL).acquire().await.expect("A acquires again");
        if let Some(outcome) = cancel_at(guard.release(), 1).await {
            // Completed on its first poll (no suspension): nothing was cancelled.
            outcome.expect("release");
        }
        freed(&c, &key, "release() dropped after its first poll").await;
    }
    drop(b);
}

/// How many times [`c9_cancel_first_suspension_repeated`] drops a try.
const FIRST_SUSPENSION_DROPS: u32 = 600;

/// C9, the race behind a drop: a `try_acquire` of a free key dropped at its
/// first suspension, many times over. The request may be on its way to the
/// store (or already running there) when the future goes; the cleanup's
/// release must still come after it. Each time, another client must get the
/// key within seconds (leases last 60 s). A store that lets the release
/// overtake the attempt it cleans up leaves a grant behind now and then:
/// once in a few drops on SQLite before its turn went with the work.
pub async fn c9_cancel_first_suspension_repeated(store: &Store) {
    let (a, c) = (client(store, "c9r-a").await, client(store, "c9r-c").await);
    let key = fresh_key("c9r");
    let mut dropped = 0;
    for i in 0..FIRST_SUSPENSION_DROPS {
        match cancel_at(a.mutex(&key).ttl(TTL).try_acquire(), 1).await {
            None => dropped += 1,
            Some(outcome) => {
                if let Some(g) = outcome.expect("try_acquire") {
                    g.release().await.expect("release");
                }
            }
        }
        freed(&c, &key, &format!("try_acquire dropped at its first suspension (drop {i})")).await;
    }
    assert!(dropped > 0, "try_acquire never suspended: nothing was dropped");
}
