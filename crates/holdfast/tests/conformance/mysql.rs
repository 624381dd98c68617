//! MySQL/MariaDB: a fresh MariaDB server (temp data dir, random port) per test.

use std::time::Duration;

use holdfast_testkit::conformance::{ProxyTarget, Store};
use holdfast_testkit::servers::{closed_port, mysql::MysqlServer};

fn start() -> Store {
    let server = MysqlServer::start();
    Store {
        url: server.url(),
        // Expiry is exact on the server clock; waiters notice it within one poll.
        expiry_slack: Duration::from_millis(100),
        unreachable_url: format!("mysql://holdfast:pw@127.0.0.1:{}/holdfast?timeout_ms=2000", closed_port()),
        via_proxy: Some(ProxyTarget::loopback(
            server.port(),
            server.url_with("timeout_ms=1000"),
            Duration::from_millis(1000),
        )),
        in_process: None,
        server: Box::new(server),
    }
}

holdfast_testkit::conformance_suite!(start);
