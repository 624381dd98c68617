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

/// The read-write floor (one `CALL` under the key's gate row): its rules,
/// then `rwlock` and `readers` for both subjects with no two holders where
/// one writes, every task served, and no note that the floor fell back to
/// its mutex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_read_write_floor_shares_reads_and_excludes_writers() {
    let server = MysqlServer::start();
    let floor = floor_for(&server.url()).await.expect("floor");
    floor_checks::read_write(floor.as_ref(), "rw").await;

    floor_checks::rwlock_and_readers_run(server.url()).await;
}
