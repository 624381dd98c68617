//! The ZooKeeper floor against a real standalone server (testkit, loopback,
//! temp dir, killed on drop).

use std::sync::Arc;
use std::time::Duration;

use holdfast::OwnerToken;
use holdfast_bench::{CycleSpec, FloorLocker, Workload, floor_for, run_cycles};
use holdfast_testkit::servers::free_port;
use holdfast_testkit::servers::zookeeper::ZkServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_floor_is_owner_checked_and_runs_a_workload() {
    let server = tokio::task::spawn_blocking(ZkServer::start).await.unwrap();
    let floor = floor_for(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(10);
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    assert!(floor.acquire("k/1", a, ttl).await.unwrap());
    assert!(!floor.acquire("k/1", b, ttl).await.unwrap(), "a held key is not taken");
    assert!(!floor.release("k/1", b).await.unwrap(), "another token does not release");
    assert!(floor.release("k/1", a).await.unwrap());
    assert!(!floor.release("k/1", a).await.unwrap(), "release is idempotent");
    assert!(floor.acquire("k/1", b, ttl).await.unwrap(), "a released key is free");
    assert!(floor.release("k/1", b).await.unwrap());

    let spec = CycleSpec {
        workload: Workload::Contended,
        subject: "floor".into(),
        tasks: 4,
        duration: Duration::from_millis(300),
        max_cycles: None,
        think_time: Duration::ZERO,
        key_prefix: "bench-test".into(),
    };
    let locker = Arc::new(FloorLocker::new(floor));
    let r = run_cycles(locker, &spec, None, &|_| {}).await.unwrap();
    assert!(r.cycles > 0 && r.overlaps == 0, "{r:?}");
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
