//! Cancellation enumerated: every lock operation dropped at each of its
//! suspension points in turn, one cut point per run, on the simulated store
//! and tokio's paused clock, so that run n+1 repeats run n exactly up to one
//! more suspension. After each drop the network stays as it was for a
//! quiescence period far shorter than the TTL: the store must then hold no
//! lease and no queue entry, and the client must renew nothing.
//!
//! Real-server tests drop operations at their suspension points too
//! (`c9_cancel_every_await`), but which point a drop lands on there depends
//! on timing; here each point is hit on purpose, with lost replies as well.

use std::time::Duration;

use holdfast::{Client, ClientOptions, LockOptions};
use holdfast_testkit::faults::cancel_at;
use holdfast_testkit::sim::{LinkFaults, SimConfig, SimStore};

/// Far above the quiescence period: only a release frees a key in time.
const TTL: Duration = Duration::from_secs(60);
/// How long after a drop the store must be empty.
const QUIESCENCE: Duration = Duration::from_secs(5);
/// When the other client lets go of a held key.
const HOLDER_LETS_GO: Duration = Duration::from_millis(900);
/// More cut points than any operation here has.
const MAX_CUTS: u32 = 400;

/// The operation dropped.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    TryAcquire,
    Acquire,
    AcquireTimeout,
    Release,
    WithLock,
}

/// What the key looks like when the operation starts: free, or held by
/// another client that lets go after [`HOLDER_LETS_GO`] (for `Release`: a
/// client waits for the key being released).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Contention {
    Free,
    Held,
}

/// One run: the operation dropped at its `cut`-th suspension (or run to
/// completion), then quiescence and the checks. `Err(cuts)` when the run
/// completed before its `cut`-th suspension: the operation has `cuts` cut
/// points in all.
fn run(op: Op, contention: Contention, lossy: Option<u64>, cut: u32) -> Result<(), u32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let _seeded = holdfast::entropy::seed_this_thread(7);
    rt.block_on(async move {
        let store = SimStore::new(SimConfig::default(), None);
        let clean = LinkFaults {
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            ..LinkFaults::default()
        };
        // Half the replies lost, in a pattern the link's seed picks.
        let faults = LinkFaults { lose_reply: if lossy.is_some() { 0.5 } else { 0.0 }, ..clean.clone() };
        let (backend, _link) = store.connect(lossy.unwrap_or(1), faults);
        let a = Client::with_backend(backend, ClientOptions::default().with_label("a"));
        let (other, _) = store.connect(2, clean);
        let b = Client::with_backend(other, ClientOptions::default().with_label("b"));
        let key = "cut";
        let what = format!("{op:?} on a {contention:?} key, reply loss seed {lossy:?}, cut at {cut}");

        // Setup, not counted: the other client's hold, or the guard to release.
        let mut background = Vec::new();
        let mut to_release = None;
        match (op, contention) {
            (Op::Release, contention) => {
                let g = a.mutex(key).ttl(TTL).acquire().await.expect("setup: acquire");
                to_release = Some(g);
                if contention == Contention::Held {
                    let b = b.clone();
                    background.push(tokio::spawn(async move {
                        let g = b.mutex(key).ttl(TTL).acquire().await.expect("the waiter");
                        g.release().await.expect("the waiter's release");
                    }));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            (_, Contention::Held) => {
                let g = b.mutex(key).ttl(TTL).acquire().await.expect("setup: the holder");
                background.push(tokio::spawn(async move {
                    tokio::time::sleep(HOLDER_LETS_GO).await;
                    g.release().await.expect("the holder's release");
                }));
            }
            (_, Contention::Free) => {}
        }

        let mutex = a.mutex(key).ttl(TTL);
        let completed = match op {
            Op::TryAcquire => cancel_at(mutex.try_acquire(), cut).await.map(|r| r.ok().flatten().map(drop).is_some()),
            Op::Acquire => cancel_at(mutex.acquire(), cut).await.map(|r| r.map(drop).is_ok()),
            Op::AcquireTimeout => {
                cancel_at(mutex.acquire_timeout(Duration::from_secs(3)), cut).await.map(|r| r.map(drop).is_ok())
            }
            Op::Release => {
                let g = to_release.take().expect("the guard to release");
                cancel_at(g.release(), cut).await.map(|r| r.is_ok())
            }
            Op::WithLock => cancel_at(
                a.with_lock(key, LockOptions::with_ttl(TTL), async |_| {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }),
                cut,
            )
            .await
            .map(|r| r.is_ok()),
        };
        // A guard returned by a completed run was dropped above: its drop
        // releases it, like a drop anywhere else.
        tokio::time::sleep(QUIESCENCE).await;
        for task in background {
            assert!(task.is_finished(), "{what}: the other client is still waiting after {QUIESCENCE:?}");
            task.await.expect("the other client");
        }
        let rows = store.live_rows();
        assert!(rows.is_empty(), "{what}: the store still holds {rows:?} after {QUIESCENCE:?}");
        assert_eq!(a.renewing_leases(), 0, "{what}: the client still renews a lease");
        match completed {
            None => Ok(()),
            Some(_) => Err(cut - 1),
        }
    })
}

/// Every operation, free and held keys, with and without lost replies: each cut
/// point of each run leaves nothing behind. Prints the cut points covered.
#[test]
fn every_cut_point_leaves_nothing() {
    let mut total = 0;
    for op in [Op::TryAcquire, Op::Acquire, Op::AcquireTimeout, Op::Release, Op::WithLock] {
        for contention in [Contention::Free, Contention::Held] {
            // No loss, then half the replies lost in sixteen patterns.
            let mut cuts = Vec::new();
            for lossy in std::iter::once(None).chain((11..27).map(Some)) {
                let n = (1..=MAX_CUTS)
                    .find_map(|cut| run(op, contention, lossy, cut).err())
                    .unwrap_or_else(|| panic!("{op:?}: still suspending after {MAX_CUTS} cut points"));
                cuts.push(n);
            }
            let sum: u32 = cuts.iter().sum();
            eprintln!(
                "{op:?}, {contention:?} key: {sum} cut points (clean link: {}, lossy: {:?})",
                cuts[0],
                &cuts[1..]
            );
            // A release retries on a task of its own: its future only waits
            // for the first outcome, once, however many attempts follow.
            if op != Op::Release {
                assert!(
                    cuts[1..].iter().any(|&n| n > cuts[0]),
                    "{op:?}, {contention:?}: no lost reply added a cut point"
                );
            }
            total += sum;
        }
    }
    eprintln!("every_cut_point_leaves_nothing: {total} cut points, each left nothing behind");
}
