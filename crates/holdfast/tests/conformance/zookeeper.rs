//! ZooKeeper: a fresh standalone server per test (tickTime 200 ms, session timeout 4 s).

use std::time::Duration;

use holdfast_testkit::conformance::{ProxyTarget, Store};
use holdfast_testkit::servers::closed_port;
use holdfast_testkit::servers::zookeeper::{SESSION_TIMEOUT_MS, TICK_MS, ZkServer};

fn start() -> Store {
    let server = ZkServer::start();
    let url = format!("{}?session_timeout={SESSION_TIMEOUT_MS}", server.url());
    Store {
        url: url.clone(),
        // A holder that dies keeps its node until the ensemble expires its
        // session: the session timeout, rounded up to the server's expiry
        // granularity (one tick), plus one tick to deliver the watch.
        expiry_slack: Duration::from_millis(SESSION_TIMEOUT_MS + 2 * TICK_MS),
        unreachable_url: format!("zk://127.0.0.1:{}?timeout=2000", closed_port()),
        // One member is enough behind the proxy; every request within 1 s.
        via_proxy: Some(ProxyTarget::loopback(
            server.client_port(0),
            format!("{url}&timeout=1000"),
            Duration::from_millis(1000),
        )),
        in_process: None,
        server: Box::new(server),
    }
}

holdfast_testkit::conformance_suite!(start);
