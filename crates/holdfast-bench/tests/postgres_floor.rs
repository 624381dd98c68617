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
    let server = PostgresServer::start();
    let floor = floor_for(&server.url()).await.expect("floor");
    floor_checks::read_write(floor.as_ref(), "rw").await;

    floor_checks::rwlock_and_readers_run(server.url()).await;
}
