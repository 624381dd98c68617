//! The ZooKeeper floor against a real standalone server (testkit, loopback,
//! temp dir, killed on drop).
#![cfg(feature = "zookeeper")]

use std::time::Duration;

use holdfast::OwnerToken;
use holdfast_bench::floor_for;
use holdfast_testkit::servers::free_port;
use holdfast_testkit::servers::zookeeper::ZkServer;

use super::floor_checks;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_floor_is_owner_checked_and_runs_a_workload() {
    let server = tokio::task::spawn_blocking(ZkServer::start).await.unwrap();
    let floor = floor_for(&server.url()).await.unwrap();
    floor_checks::owner_checked(floor.as_ref(), "k/1").await;
    let b = OwnerToken::random();
    assert!(floor.acquire("k/1", b, floor_checks::TTL).await.unwrap(), "a released key is free");
    assert!(floor.release("k/1", b).await.unwrap());

    floor_checks::contended_run(floor, 4, None).await;
    drop(server);
}

#[tokio::test]
async fn unreachable_zookeeper_is_a_typed_error_within_seconds() {
    let started = std::time::Instant::now();
    let err = match floor_for(&format!("zk://127.0.0.1:{}", free_port())).await {
        Ok(_) => panic!("connected to nothing"),
        Err(e) => e,
    };
    assert!(matches!(err, holdfast::Error::Backend { store: "zookeeper", .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// The read-write floor: reads share, writers exclude (a child created and
/// checked in one round trip); then `rwlock` and `readers` against it with
/// every task served and no overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_floor_has_a_read_write_lock() {
    let server = tokio::task::spawn_blocking(ZkServer::start).await.unwrap();
    let floor = floor_for(&server.url()).await.unwrap();
    floor_checks::read_write_with(floor.as_ref(), "rw", false).await;
    floor_checks::rwlock_and_readers_run(server.url()).await;
    drop(server);
}
