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
    // Commands a script calls count as calls too; their time is inside the
    // script's, so only the scripts' time is summed.
    let lines = || info.lines().filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info"));
    let calls = lines().map(|l| field(l, "calls=")).sum();
    let scripts = lines().filter(|l| l.starts_with("cmdstat_fcall:") || l.starts_with("cmdstat_evalsha:"));
    (calls, scripts.map(|l| field(l, "usec=")).sum())
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn redis_mutex_path_against_shared_path() {
    let server = holdfast_testkit::servers::redis::RedisServer::start();
    let store = holdfast::stores::redis::RedisBackend::open_url(&server.url()).await.expect("open");
    let mut conn =
        redis::Client::open(server.url()).expect("client").get_multiplexed_async_connection().await.expect("conn");
    cycle(&store, LeaseMode::Exclusive).await; // warm-up: connections, library load
    for mode in [LeaseMode::Exclusive, LeaseMode::Writer, LeaseMode::Exclusive, LeaseMode::Writer] {
        let (c0, u0) = server_usec(&mut conn).await;
        let wall = cycle(&store, mode).await;
        let (c1, u1) = server_usec(&mut conn).await;
        println!(
            "redis {mode:?}: {wall:?} per cycle (client in this build), scripts {:.1} us of server time and {:.2} commands per cycle",
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
    let store = holdfast::stores::postgres::PostgresBackend::open_url(&server.url()).await.expect("open");
    cycle(&store, LeaseMode::Exclusive).await;
    for mode in [LeaseMode::Exclusive, LeaseMode::Writer, LeaseMode::Exclusive, LeaseMode::Writer] {
        // Round trips per cycle, from the code: the mutex one statement to
        // acquire and one to release; the writer BEGIN, five statements and
        // COMMIT to acquire, one to release.
        let wall = cycle(&store, mode).await;
        println!("postgres {mode:?}: {wall:?} per cycle (client in this build)");
    }
}
