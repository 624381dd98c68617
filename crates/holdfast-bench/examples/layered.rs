//! What the layered hybrid lock's filter buys: N clients contend on one key
//! over the authoritative store alone, then behind a fast Redis
//! (`layered://redis|AUTH`), in the same run.
//!
//! ```text
//! cargo run --release -p holdfast-bench --features redis,postgres,zookeeper --example layered -- \
//!     [postgres|zookeeper] [TASKS,TASKS...] [SECONDS]
//! ```
//!
//! Starts its own servers (holdfast-testkit: Redis without persistence;
//! PostgreSQL with fsync off, or a standalone ZooKeeper with `mntr`
//! whitelisted), 16 and 64 clients by default, 10 s per subject. Prints one
//! line per subject and the layered/alone ratios.

use std::time::Duration;

use holdfast_bench::{LayeredOptions, LayeredSubject, run_layered};
use holdfast_testkit::servers::postgres::PostgresServer;
use holdfast_testkit::servers::redis::RedisServer;
use holdfast_testkit::servers::zookeeper::ZkServer;

fn line(s: &LayeredSubject) -> String {
    let ms = |us: Option<u64>| us.map_or("n/a".to_owned(), |us| format!("{:.2}", us as f64 / 1e3));
    format!(
        "{:>3} tasks  {:<19} {:>8.0} acq/s  p50 {:>7} ms  p99 {:>8} ms  auth calls/acq {:>5.2}  most waiting in auth {:>3}  server/acq {:>7}  overlaps {}",
        s.tasks,
        s.subject,
        s.per_sec,
        ms(s.wait_p50_us),
        ms(s.wait_p99_us),
        s.auth_calls_per_acquisition,
        s.auth_most_waiting,
        s.auth_server_per_acquisition.map_or("n/a".to_owned(), |v| format!("{v:.2}")),
        s.overlaps
    )
}

#[tokio::main]
async fn main() -> holdfast::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let store = args.first().map_or("postgres", String::as_str).to_owned();
    let tasks: Vec<usize> =
        args.get(1).map_or("16,64", String::as_str).split(',').filter_map(|t| t.trim().parse().ok()).collect();
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let redis = RedisServer::start();
    let (auth_url, _server): (String, Box<dyn std::any::Any>) = match store.as_str() {
        "postgres" => {
            let pg = PostgresServer::start_with_settings(&[("max_connections", "400")]);
            (format!("{}&pool_size=1", pg.url()), Box::new(pg))
        }
        "zookeeper" => {
            let zk = ZkServer::start();
            (zk.url(), Box::new(zk))
        }
        other => return Err(holdfast::Error::invalid("store", format!("{other:?}: postgres or zookeeper"))),
    };
    println!("authoritative: {store}; fast: redis; {secs} s per subject; one client per task; hold 1 ms");
    for n in tasks {
        let mut opts = LayeredOptions::new(redis.url(), auth_url.clone(), n);
        opts.duration = Duration::from_secs(secs);
        let r = run_layered(&opts).await?;
        println!("{}", line(&r.alone));
        println!("{}", line(&r.layered));
        if let Some(c) = &r.alone.auth_server_counter {
            println!("    server count: {c}");
        }
        let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}", a / b) } else { "n/a".to_owned() };
        println!(
            "    layered/alone: acq/s {}, auth calls/acq {}, server/acq {}",
            ratio(r.layered.per_sec, r.alone.per_sec),
            ratio(r.layered.auth_calls_per_acquisition, r.alone.auth_calls_per_acquisition),
            match (r.layered.auth_server_per_acquisition, r.alone.auth_server_per_acquisition) {
                (Some(l), Some(a)) => ratio(l, a),
                _ => "n/a".to_owned(),
            }
        );
    }
    Ok(())
}
