//! The MySQL/MariaDB floor against a real MariaDB (started by the testkit on
//! a free loopback port in a temp dir, killed on drop).

use std::time::Duration;

use holdfast::OwnerToken;
use holdfast_bench::floor_for;
use holdfast_testkit::servers::mysql::MysqlServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_floor_is_owner_checked_and_takes_over_expired_rows() {
    let server = MysqlServer::start();
    let floor = floor_for(&server.url()).await.expect("floor");
    let ttl = Duration::from_secs(10);
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    assert!(floor.acquire("k", a, ttl).await.expect("acquire"));
    assert!(!floor.acquire("k", b, ttl).await.expect("acquire"), "a held key is not taken");
    assert!(!floor.release("k", b).await.expect("release"), "another token does not release");
    assert!(floor.release("k", a).await.expect("release"));
    assert!(!floor.release("k", a).await.expect("release"), "release is idempotent");
    assert!(floor.acquire("k", b, Duration::from_millis(50)).await.expect("acquire"));
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(floor.acquire("k", a, ttl).await.expect("acquire"), "an expired key is taken over");
    // Keys compare as bytes, as in holdfast's table.
    assert!(floor.acquire("K", b, ttl).await.expect("acquire"));
    assert!(floor.acquire("k ", b, ttl).await.expect("acquire"));
    let fences = server.sql("SELECT COUNT(DISTINCT fence) FROM holdfast.holdfast_bench_floor");
    assert_eq!(fences.trim(), "3", "each grant has its own fence");
}
