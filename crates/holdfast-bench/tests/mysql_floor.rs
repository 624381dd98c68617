//! The MySQL/MariaDB floor against a real MariaDB (started by the testkit on
//! a free loopback port in a temp dir, killed on drop).
#![cfg(feature = "mysql")]

use holdfast::OwnerToken;
use holdfast_bench::floor_for;
use holdfast_testkit::servers::mysql::MysqlServer;

use super::floor_checks;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_floor_is_owner_checked_and_takes_over_expired_rows() {
    let server = MysqlServer::start();
    let floor = floor_for(&server.url()).await.expect("floor");
    floor_checks::owner_checked(floor.as_ref(), "k").await;
    floor_checks::expired_key_taken_over(floor.as_ref(), "k").await;
    let (b, ttl) = (OwnerToken::random(), floor_checks::TTL);
    // Keys compare as bytes, as in holdfast's table.
    assert!(floor.acquire("K", b, ttl).await.expect("acquire"));
    assert!(floor.acquire("k ", b, ttl).await.expect("acquire"));
    let keys = server.sql("SELECT COUNT(*) FROM holdfast.holdfast_bench_floor");
    assert_eq!(keys.trim(), "3", "three keys, three rows");
    // Fences are per key, kept in the row a release leaves: "k" was granted
    // at least three times (owner checks, then a takeover), each above the last.
    let fence = server.sql("SELECT fence FROM holdfast.holdfast_bench_floor WHERE lock_key = 'k'");
    assert!(fence.trim().parse::<u64>().expect("fence") >= 3, "k's fence: {fence}");
}

/// `readers` on a store whose floor has no read-write lock: the floor takes
/// each task's own key with its mutex, and the report says so; both subjects
/// run every task with no two holders of a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_on_a_floor_without_read_write_locks_compare_with_its_mutex() {
    use holdfast_bench::{BenchOptions, Workload, run};
    use std::time::Duration;
    let server = MysqlServer::start();
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
