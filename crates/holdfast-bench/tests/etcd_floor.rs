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

/// The read-write floor: reads share, writers exclude (a transaction a
/// call, etcd's own compare over the readers' prefix); then `rwlock` and
/// `readers` against it with every task served and no overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_floor_has_a_read_write_lock() {
    let server = EtcdServer::start();
    let floor = floor_for(&server.url()).await.unwrap();
    floor_checks::read_write_with(floor.as_ref(), "rw", false).await;
    // A reader of another key whose name extends this one's is not this
    // key's reader.
    let (r, w) = (OwnerToken::random(), OwnerToken::random());
    assert!(floor.acquire_rw("rw/r/x", r, floor_checks::TTL, false).await.unwrap());
    assert!(floor.acquire_rw("rw", w, floor_checks::TTL, true).await.unwrap(), "another key's reader kept it");
    floor_checks::rwlock_and_readers_run(server.url()).await;
}
