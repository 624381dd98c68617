//! RedLock over three fresh redis-server processes (no persistence), the
//! whole suite through `redlock://`, as users open it. The fault proxy sits
//! in front of one store, so the `f*` clauses do not apply to a quorum; the
//! RedLock fault tests (`tests/redlock`) cut members instead.

use std::time::Duration;

use holdfast_testkit::conformance::Store;
use holdfast_testkit::servers::{closed_port, redis::RedisServer};

fn start() -> Store {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let hosts: Vec<String> = servers.iter().map(|s| format!("127.0.0.1:{}", s.port())).collect();
    Store {
        url: format!("redlock://{}", hosts.join(",")),
        expiry_slack: Duration::from_millis(50),
        unreachable_url: format!(
            "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}?timeout_ms=1000",
            closed_port(),
            closed_port(),
            closed_port()
        ),
        via_proxy: None,
        in_process: None,
        server: Box::new(servers),
    }
}

holdfast_testkit::conformance_suite!(start);

/// Three Redis members; the clauses take the third down, and once it is
/// back the first, so that the majority needs the one that returned.
fn composite() -> holdfast_testkit::conformance::Composite {
    use std::sync::{Arc, Mutex};
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let hosts: Vec<String> = servers.iter().map(|s| format!("127.0.0.1:{}", s.port())).collect();
    let servers = Arc::new(Mutex::new(servers));
    let (stop, start) = (Arc::clone(&servers), Arc::clone(&servers));
    holdfast_testkit::conformance::Composite {
        url: format!("redlock://{}?timeout_ms=1000", hosts.join(",")),
        member: 2,
        then_stop: Some(0),
        stop: Box::new(move |i| stop.lock().expect("servers")[i].kill()),
        start: Box::new(move |i| start.lock().expect("servers")[i].restart()),
        servers: Box::new(servers),
    }
}

mod members {
    holdfast_testkit::member_clauses!(super::composite);
}
