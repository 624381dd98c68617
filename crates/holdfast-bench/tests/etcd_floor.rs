//! The etcd floor against a real single-node etcd (testkit, loopback, temp dir).
#![cfg(feature = "etcd")]

use std::time::{Duration, Instant};

use holdfast::OwnerToken;
use holdfast_bench::floor_for;
use holdfast_testkit::servers::etcd::EtcdServer;
use holdfast_testkit::servers::free_port;

use super::floor_checks;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_floor_is_owner_checked_and_expires() {
    let server = EtcdServer::start();
    let floor = floor_for(&server.url()).await.unwrap();
    floor_checks::owner_checked(floor.as_ref(), "k").await;
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    // A 1 s TTL is a 2 s lease on etcd's default timing, freed by etcd's
    // 500 ms expiry loop once its keep-alives stop; here they go on, so the
    // key is held until released.
    assert!(floor.acquire("short", b, Duration::from_secs(1)).await.unwrap());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!floor.acquire("short", a, floor_checks::TTL).await.unwrap(), "a kept-alive lease expired");
    assert!(floor.release("short", b).await.unwrap());

    let r = floor_checks::contended_run(floor, 4, None).await;
    assert_eq!(r.tasks_never_acquired, 0, "{r:?}");
}

#[tokio::test]
async fn unreachable_etcd_is_a_typed_error_within_seconds() {
    let started = Instant::now();
    let outcome = async {
        let floor = floor_for(&format!("etcd://127.0.0.1:{}", free_port())).await?;
        floor.acquire("k", OwnerToken::random(), Duration::from_secs(5)).await
    }
    .await;
    assert!(matches!(outcome, Err(holdfast::Error::Backend { store: "etcd", .. })), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(15));
}

/// `readers` on a store whose floor has no read-write lock: the floor takes
/// each task's own key with its mutex, and the report says so; both subjects
/// run every task with no two holders of a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_on_a_floor_without_read_write_locks_compare_with_its_mutex() {
    use holdfast_bench::{BenchOptions, Workload, run};
    let server = EtcdServer::start();
    let mut opts = BenchOptions::new(server.url());
    opts.workloads = vec![Workload::Readers];
    opts.tasks_uncontended = 8;
    opts.duration = Duration::from_millis(500);
    let report = run(&opts, |_| {}).await.expect("bench");
    for subject in ["holdfast", "floor"] {
        let r = report.result(Workload::Readers, subject).unwrap_or_else(|| panic!("no readers result for {subject}"));
        assert!(r.cycles > 0 && r.tasks_never_acquired == 0 && r.overlaps == 0, "{subject}: {r:?}");
    }
    assert!(
        report.notes.iter().any(|n| n.contains("the floor takes each key with its mutex")),
        "the report does not say what the floor ran: {:?}",
        report.notes
    );
    assert_eq!(report.ratios.len(), 1, "one holdfast/floor ratio");
}
