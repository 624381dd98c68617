//! The PostgreSQL floor against a real server (testkit: loopback port, temp
//! dir, killed on drop).
#![cfg(feature = "postgres")]

use std::time::Duration;

use holdfast_bench::floor_for;
use holdfast_testkit::servers::free_port;
use holdfast_testkit::servers::postgres::PostgresServer;

use super::floor_checks;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_floor_is_owner_checked_and_takes_over_expired_rows() {
    let server = PostgresServer::start();
    let floor = floor_for(&server.url()).await.expect("floor");
    floor_checks::owner_checked(floor.as_ref(), "k").await;
    let holder = floor_checks::expired_key_taken_over(floor.as_ref(), "k").await;
    assert!(floor.release("k", holder).await.unwrap());

    let r = floor_checks::contended_run(floor, 8, None).await;
    assert_eq!(r.tasks_never_acquired, 0, "{r:?}");
}

#[tokio::test]
async fn unreachable_postgres_is_a_typed_error_within_seconds() {
    let started = std::time::Instant::now();
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable&connect_timeout=2", free_port());
    let err = match floor_for(&url).await {
        Ok(_) => panic!("connected to nothing"),
        Err(e) => e,
    };
    assert!(matches!(err, holdfast::Error::Backend { store: "postgres", .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// `readers` on a store whose floor has no read-write lock: the floor takes
/// each task's own key with its mutex, and the report says so; both subjects
/// run every task with no two holders of a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_on_a_floor_without_read_write_locks_compare_with_its_mutex() {
    use holdfast_bench::{BenchOptions, Workload, run};
    let server = PostgresServer::start();
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
