//! Starts the servers to compare Redis Cluster and Sentinel with a single
//! Redis in one session: the testkit's 3-master cluster, its master with a
//! replica and three sentinels, and one redis-server (no persistence), all
//! on loopback. Prints their URLs, then keeps them running for the given
//! seconds (default 600); killed with it.
//!
//! ```text
//! cargo run -p holdfast-bench --features redis --example redis_cluster_servers -- 600 &
//! holdfast bench --backend redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3 --json
//! holdfast bench --backend redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/NAME --json
//! holdfast bench --backend redis://127.0.0.1:P --json
//! ```

use std::io::Write;
use std::time::Duration;

use holdfast_testkit::servers::redis::{RedisCluster, RedisSentinel, RedisServer};

fn main() {
    let secs: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(600);
    let cluster = RedisCluster::start();
    let sentinel = RedisSentinel::start();
    let single = RedisServer::start();
    println!("cluster {}", cluster.url());
    println!("sentinel {}", sentinel.url());
    println!("single {}", single.url());
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_secs(secs));
    drop((cluster, sentinel, single));
}
