//! PostgreSQL: a fresh server (copied from a per-process initdb template) per test.

use std::time::Duration;

use holdfast_testkit::conformance::{ProxyTarget, Store};
use holdfast_testkit::servers::{closed_port, postgres::PostgresServer};

fn start() -> Store {
    let server = PostgresServer::start();
    Store {
        url: server.url(),
        // Expiry is on the server's clock; a waiter retries at the holder's
        // expiry, so the slack is a few statement round trips.
        expiry_slack: Duration::from_millis(200),
        unreachable_url: format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable&connect_timeout=2",
            closed_port()
        ),
        // Every statement (a reconnect included) within 1 s; connecting within 1 s.
        via_proxy: Some(ProxyTarget::loopback(
            server.port(),
            format!("{}&op_timeout_ms=1000&connect_timeout=1", server.url()),
            Duration::from_millis(1000),
        )),
        in_process: None,
        server: Box::new(server),
    }
}

holdfast_testkit::conformance_suite!(start);
