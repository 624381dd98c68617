//! The checks every raw floor must pass, shared by the per-store floor tests
//! (each store's module uses the ones that fit its store).
#![allow(dead_code)] // each store uses a subset, and a build without a store's feature none

use std::sync::Arc;
use std::time::Duration;

use holdfast::OwnerToken;
use holdfast_bench::{CommandCounter, CycleSpec, Floor, FloorLocker, Workload, WorkloadResult, run_cycles};

/// TTL of the grants these checks take and keep.
pub const TTL: Duration = Duration::from_secs(10);

/// A held key is not taken, another token does not release it, release is
/// idempotent. Leaves `key` free.
pub async fn owner_checked(floor: &dyn Floor, key: &str) {
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    assert!(floor.acquire(key, a, TTL).await.expect("acquire"));
    assert!(!floor.acquire(key, b, TTL).await.expect("acquire"), "a held key is not taken");
    assert!(!floor.release(key, b).await.expect("release"), "another token does not release");
    assert!(floor.release(key, a).await.expect("release"));
    assert!(!floor.release(key, a).await.expect("release"), "release is idempotent");
}

/// A 50 ms grant expires and another token takes `key` over; returns the
/// token now holding it (for `TTL`).
pub async fn expired_key_taken_over(floor: &dyn Floor, key: &str) -> OwnerToken {
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    assert!(floor.acquire(key, b, Duration::from_millis(50)).await.expect("acquire"));
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(floor.acquire(key, a, TTL).await.expect("acquire"), "an expired key is taken over");
    a
}

/// A read-write floor: reads share `key`, a writer is refused while a
/// reader holds it and refuses readers while it holds it, an expired
/// writer lets readers in, and releases are owner-checked. Leaves `key` free.
pub async fn read_write(floor: &dyn Floor, key: &str) {
    read_write_with(floor, key, true).await;
}

/// [`read_write`], with the writer that readers outlast released instead of
/// expired unless `expires` (etcd's floor keeps its leases alive, as a
/// hand-written etcd lock does, so nothing it holds expires).
pub async fn read_write_with(floor: &dyn Floor, key: &str, expires: bool) {
    let (r1, r2, w) = (OwnerToken::random(), OwnerToken::random(), OwnerToken::random());
    assert!(floor.acquire_rw(key, r1, TTL, false).await.expect("read"), "a free key is read");
    assert!(floor.acquire_rw(key, r2, TTL, false).await.expect("read"), "reads share");
    assert!(!floor.acquire_rw(key, w, TTL, true).await.expect("write"), "a writer waits for the readers");
    assert!(!floor.release_rw(key, w).await.expect("release"), "a token that holds nothing releases nothing");
    assert!(floor.release_rw(key, r1).await.expect("release"));
    assert!(!floor.acquire_rw(key, w, TTL, true).await.expect("write"), "one reader is left");
    assert!(floor.release_rw(key, r2).await.expect("release"));
    let short = if expires { Duration::from_millis(50) } else { TTL };
    assert!(floor.acquire_rw(key, w, short, true).await.expect("write"), "free again");
    assert!(!floor.acquire_rw(key, r1, TTL, false).await.expect("read"), "a writer keeps readers out");
    assert!(!floor.acquire_rw(key, r2, TTL, true).await.expect("write"), "and other writers");
    assert!(!floor.release_rw(key, r1).await.expect("release"), "a reader refused releases nothing");
    if expires {
        tokio::time::sleep(Duration::from_millis(120)).await;
    } else {
        assert!(floor.release_rw(key, w).await.expect("release"), "the writer releases");
    }
    assert!(floor.acquire_rw(key, r1, TTL, false).await.expect("read"), "an expired writer lets readers in");
    assert!(floor.release_rw(key, r1).await.expect("release"));
    assert!(floor.acquire_rw(key, w, TTL, true).await.expect("write"), "the last reader gone, a writer gets in");
    assert!(floor.release_rw(key, w).await.expect("release"));
}

/// `rwlock` and `readers` on the store `url` names, briefly, for both
/// subjects: every task served, no two holders where one writes, no note
/// that the floor fell back to its mutex, one ratio per workload.
pub async fn rwlock_and_readers_run(url: String) {
    use holdfast_bench::{BenchOptions, run};
    let mut opts = BenchOptions::new(url);
    opts.workloads = vec![Workload::RwLock, Workload::Readers];
    (opts.tasks_uncontended, opts.tasks_rwlock) = (8, 8);
    opts.duration = Duration::from_millis(500);
    let report = run(&opts, |_| {}).await.expect("bench");
    for workload in [Workload::RwLock, Workload::Readers] {
        for subject in ["holdfast", "floor"] {
            let r = report.result(workload, subject).unwrap_or_else(|| panic!("no {workload} result for {subject}"));
            assert!(r.cycles > 0 && r.tasks_never_acquired == 0 && r.overlaps == 0, "{workload}/{subject}: {r:?}");
        }
    }
    assert!(report.notes.is_empty(), "{:?}", report.notes);
    assert_eq!(report.ratios.len(), 2, "one holdfast/floor ratio per workload");
}

/// The contended workload for 300 ms with `tasks` tasks: some cycles ran and
/// never two holders at once. Returns the result for further checks.
pub async fn contended_run(
    floor: Box<dyn Floor>,
    tasks: usize,
    counter: Option<&dyn CommandCounter>,
) -> WorkloadResult {
    let spec = CycleSpec {
        workload: Workload::Contended,
        subject: "floor".into(),
        tasks,
        duration: Duration::from_millis(300),
        max_cycles: None,
        think_time: Duration::ZERO,
        key_prefix: "bench-test".into(),
        mix: holdfast_bench::Mix::Exclusive,
    };
    let r = run_cycles(Arc::new(FloorLocker::new(floor)), &spec, counter, &|_| {}).await.expect("workload");
    assert!(r.cycles > 0 && r.overlaps == 0, "{r:?}");
    r
}
