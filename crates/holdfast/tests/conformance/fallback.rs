//! The fallback chain over a fresh redis-server (the first store) and a
//! fresh SQLite file (the arbiter), the whole suite through `fallback://`,
//! as users open it. The fault proxy sits in front of Redis, the store that
//! grants; the chain's own faults (a partition that splits clients between
//! stores, a switch) are in `tests/fallback.rs`.

use std::time::Duration;

use holdfast_testkit::conformance::{ProxyTarget, Store};
use holdfast_testkit::servers::{free_port, redis::RedisServer};

/// A 2 s mode lease: every clause's leases fit in one, and a switch (none
/// should happen here) would cost 2 s.
const OPTIONS: &str = "?mode_ttl_ms=2000";

fn start() -> Store {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let arbiter = format!("sqlite://{}/arbiter.db", dir.path().display());
    let url = |redis: &str| format!("fallback://{OPTIONS}|{redis}|{arbiter}");
    let with_timeout = format!("{}?timeout_ms=1000", server.url());
    Store {
        url: url(&server.url()),
        expiry_slack: Duration::from_millis(50),
        unreachable_url: url(&format!("redis://127.0.0.1:{}?timeout_ms=1000", free_port())),
        via_proxy: Some(ProxyTarget::loopback(server.port(), url(&with_timeout), Duration::from_millis(1000))),
        in_process: None,
        server: Box::new((server, dir)),
    }
}

holdfast_testkit::conformance_suite!(start);
