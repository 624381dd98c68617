//! What the separate mutex path saves (docs/design.md, "One rule, two paths
//! where it pays"): the same exclusive lease taken uncontended through the
//! mutex path (`LeaseMode::Exclusive`) and through the shared path
//! (`LeaseMode::Writer`, which the admission rule treats alike when nothing
//! waits), on Redis and PostgreSQL. Ignored by default (a measurement, not
//! a check): `cargo test -p holdfast-lock --all-features --test stores --
//! --ignored --nocapture admission::cost`.

use std::time::{Duration, Instant};

use holdfast::backend::{AcquireRequest, Backend, LeaseMode};
use holdfast::{LockKey, OwnerToken};

const CYCLES: u32 = 2000;

/// Mean wall time of one uncontended try-acquire + release in `mode`.
async fn cycle(store: &dyn Backend, mode: LeaseMode) -> Duration {
    let key = LockKey::new(format!("cost/{mode:?}")).expect("key");
    let start = Instant::now();
    for _ in 0..CYCLES {
        let req = AcquireRequest::new(key.clone(), OwnerToken::random(), Duration::from_secs(10)).with_mode(mode);
        store.try_acquire(&req).await.expect("acquire").expect("uncontended: granted");
        assert!(store.release(&key, req.token).await.expect("release"));
    }
    start.elapsed() / CYCLES
}

#[cfg(feature = "redis")]
async fn server_usec(conn: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.expect("info");
    let field = |l: &str, name: &str| -> u64 {
        l.split([':', ',']).find_map(|kv| kv.strip_prefix(name)).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info"))
        .fold((0, 0), |(c, u), l| (c + field(l, "calls="), u + field(l, "usec=")))
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn redis_mutex_path_against_shared_path() {
    let server = holdfast_testkit::servers::redis::RedisServer::start();
    let store = holdfast::backend::redis::RedisBackend::open_url(&server.url()).await.expect("open");
    let mut conn =
        redis::Client::open(server.url()).expect("client").get_multiplexed_async_connection().await.expect("conn");
    cycle(&store, LeaseMode::Exclusive).await; // warm-up: connections, library load
    for mode in [LeaseMode::Exclusive, LeaseMode::Writer, LeaseMode::Exclusive, LeaseMode::Writer] {
        let (c0, u0) = server_usec(&mut conn).await;
        let wall = cycle(&store, mode).await;
        let (c1, u1) = server_usec(&mut conn).await;
        println!(
            "redis {mode:?}: {wall:?} per cycle (client in this build), server {:.1} us and {:.2} commands per cycle",
            (u1 - u0) as f64 / f64::from(CYCLES),
            (c1 - c0) as f64 / f64::from(CYCLES)
        );
    }
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn postgres_mutex_path_against_shared_path() {
    let server = holdfast_testkit::servers::postgres::PostgresServer::start();
    let store = holdfast::backend::postgres::PostgresBackend::open_url(&server.url()).await.expect("open");
    let xacts = || -> u64 {
        // The statistics of other sessions reach the view within a second.
        std::thread::sleep(Duration::from_millis(1200));
        let n = server.psql("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'postgres'");
        n.trim().parse().expect("xacts")
    };
    cycle(&store, LeaseMode::Exclusive).await;
    for mode in [LeaseMode::Exclusive, LeaseMode::Writer, LeaseMode::Exclusive, LeaseMode::Writer] {
        let x0 = tokio::task::block_in_place(xacts);
        let wall = cycle(&store, mode).await;
        let x1 = tokio::task::block_in_place(xacts);
        println!(
            "postgres {mode:?}: {wall:?} per cycle (client in this build), {:.2} transactions per cycle",
            (x1 - x0 - 1) as f64 / f64::from(CYCLES)
        );
    }
}
