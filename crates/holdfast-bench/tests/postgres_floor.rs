//! The PostgreSQL floor against a real server (testkit: loopback port, temp
//! dir, killed on drop).

use std::sync::Arc;
use std::time::Duration;

use holdfast::OwnerToken;
use holdfast_bench::{CycleSpec, FloorLocker, Workload, floor_for, run_cycles};
use holdfast_testkit::servers::free_port;
use holdfast_testkit::servers::postgres::PostgresServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_floor_is_owner_checked_and_takes_over_expired_rows() {
    let server = PostgresServer::start();
    let floor = floor_for(&server.url()).await.expect("floor");
    let ttl = Duration::from_secs(10);
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    assert!(floor.acquire("k", a, ttl).await.unwrap());
    assert!(!floor.acquire("k", b, ttl).await.unwrap(), "a held key is not taken");
    assert!(!floor.release("k", b).await.unwrap(), "another token does not release");
    assert!(floor.release("k", a).await.unwrap());
    assert!(!floor.release("k", a).await.unwrap(), "release is idempotent");
    assert!(floor.acquire("k", b, Duration::from_millis(50)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(floor.acquire("k", a, ttl).await.unwrap(), "an expired key is taken over");
    assert!(floor.release("k", a).await.unwrap());

    let spec = CycleSpec {
        workload: Workload::Contended,
        subject: "floor".into(),
        tasks: 8,
        duration: Duration::from_millis(300),
        max_cycles: None,
        think_time: Duration::ZERO,
        key_prefix: "bench-test".into(),
    };
    let locker = Arc::new(FloorLocker::new(floor));
    let r = run_cycles(locker, &spec, None, &|_| {}).await.unwrap();
    assert!(r.cycles > 0 && r.overlaps == 0 && r.tasks_never_acquired == 0, "{r:?}");
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
