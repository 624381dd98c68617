//! RedLock over three fresh redis-server processes (no persistence), the
//! whole suite through `redlock://`, as users open it. The fault proxy sits
//! in front of one store, so the `f*` clauses do not apply to a quorum; the
//! RedLock fault tests (`tests/redlock`) cut members instead.

use std::time::Duration;

use holdfast_testkit::conformance::Store;
use holdfast_testkit::servers::{free_port, redis::RedisServer};

fn start() -> Store {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let hosts: Vec<String> = servers.iter().map(|s| format!("127.0.0.1:{}", s.port())).collect();
    Store {
        url: format!("redlock://{}", hosts.join(",")),
        expiry_slack: Duration::from_millis(50),
        unreachable_url: format!(
            "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}?timeout_ms=1000",
            free_port(),
            free_port(),
            free_port()
        ),
        via_proxy: None,
        in_process: None,
        server: Box::new(servers),
    }
}

holdfast_testkit::conformance_suite!(start);
