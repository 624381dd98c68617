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

/// The read-write floor (a PL/pgSQL call under the key's advisory lock):
/// its rules, then `rwlock` and `readers` for both subjects with no two
/// holders where one writes, every task served, and no note that the floor
/// fell back to its mutex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_read_write_floor_shares_reads_and_excludes_writers() {
    use holdfast_bench::{BenchOptions, Workload, run};
    let server = PostgresServer::start();
    let floor = floor_for(&server.url()).await.expect("floor");
    floor_checks::read_write(floor.as_ref(), "rw").await;

    let mut opts = BenchOptions::new(server.url());
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
