//! The Redis floor and command counter against a real redis-server (started
//! here on a free loopback port in a temp dir, killed on drop).
#![cfg(feature = "redis")]

use std::time::Duration;

use holdfast_bench::{command_counter_for, floor_for};
use holdfast_testkit::servers::free_port;
use holdfast_testkit::servers::redis::RedisServer;

use super::floor_checks;

/// A redis-server of the test kit's: it is ready once it answers `PING`
/// with `PONG`, not once its port accepts a connection (a port that another
/// test's server took first accepts too, and resets a Redis client).
fn start_redis() -> RedisServer {
    RedisServer::start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_floor_is_owner_checked_and_its_commands_are_counted() {
    let redis = start_redis();
    let floor = floor_for(&redis.url()).await.unwrap();
    let counter = command_counter_for(&redis.url()).await.unwrap().expect("redis counts its commands");
    let before = counter.snapshot().await.unwrap();
    floor_checks::owner_checked(floor.as_ref(), "k").await;
    floor_checks::expired_key_taken_over(floor.as_ref(), "k").await;
    let after = counter.snapshot().await.unwrap();
    // 4 SETs + 3 EVALSHAs, plus the GETs (3) and the DEL (1) run inside the
    // script, which Redis counts too; the INFO calls themselves are not counted.
    let ran = after.since(&before);
    assert_eq!(ran.scripts(), 3, "{ran:?}");
    assert_eq!(ran.requests(), 7, "{ran:?}");
    assert_eq!(ran.total(), 11, "{ran:?}");
    floor_checks::read_write(floor.as_ref(), "rw").await;

    let r = floor_checks::contended_run(floor, 8, Some(counter.as_ref())).await;
    assert_eq!(r.tasks_never_acquired, 0, "{r:?}");
    let per_acq = r.store_commands_per_acquisition.unwrap();
    assert!(per_acq >= 4.0, "at least SET + EVALSHA(GET + DEL) per acquisition, got {per_acq}");
    let requests = r.store_requests_per_acquisition.unwrap();
    assert!(requests >= 2.0 && requests < per_acq, "SET attempts + one EVALSHA per cycle, got {requests}");
}

#[tokio::test]
async fn unreachable_redis_is_a_typed_error_within_seconds() {
    let started = std::time::Instant::now();
    let err = match floor_for(&format!("redis://127.0.0.1:{}", free_port())).await {
        Ok(_) => panic!("connected to nothing"),
        Err(e) => e,
    };
    assert!(matches!(err, holdfast::Error::Backend { store: "redis", .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}
