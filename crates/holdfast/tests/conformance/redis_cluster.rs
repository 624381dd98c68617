//! Redis Cluster (`redis+cluster://`): a fresh cluster of three masters
//! per test (`RedisCluster`), the suite's locks spread over their slots.
//!
//! `via_proxy` is `None`: the client learns the nodes' own addresses from
//! `CLUSTER SLOTS` and connects to them, so a fault proxy in front of the
//! seed address would be bypassed (a node could announce a proxy's port
//! with `cluster-announce-port`, but the suite starts a new proxy per
//! fault test, and with three masters a proxy would stand in front of a
//! third of the slots only). The fault clauses run on plain Redis
//! (`redis::f*`) on the same store code; cluster faults (a slot that moves
//! under a held lease) are in `tests/redis_cluster.rs`.

use std::time::Duration;

use holdfast_testkit::conformance::Store;
use holdfast_testkit::servers::{closed_port, redis::RedisCluster};

fn start() -> Store {
    let cluster = RedisCluster::start();
    Store {
        url: cluster.url(),
        expiry_slack: Duration::from_millis(50),
        unreachable_url: format!("redis+cluster://127.0.0.1:{}?timeout_ms=1000", closed_port()),
        via_proxy: None,
        in_process: None,
        server: Box::new(cluster),
    }
}

holdfast_testkit::conformance_suite!(start);
