//! Redis: a fresh redis-server (no persistence) on a free loopback port per test.

use std::time::Duration;

use holdfast_testkit::conformance::{ProxyTarget, Store};
use holdfast_testkit::servers::{closed_port, redis::RedisServer};

/// A fresh server; `options` (`"fair=default"`, or empty) go into every URL.
pub fn start_with(options: &str) -> Store {
    let server = RedisServer::start();
    let query = |more: &str| {
        let pairs: Vec<&str> = [more, options].into_iter().filter(|p| !p.is_empty()).collect();
        if pairs.is_empty() { String::new() } else { format!("?{}", pairs.join("&")) }
    };
    Store {
        url: format!("{}{}", server.url(), query("")),
        expiry_slack: Duration::from_millis(50),
        unreachable_url: format!("redis://127.0.0.1:{}?timeout_ms=1000", closed_port()),
        via_proxy: Some(ProxyTarget::loopback(
            server.port(),
            format!("{}{}", server.url(), query("timeout_ms=1000")),
            Duration::from_millis(1000),
        )),
        in_process: None,
        server: Box::new(server),
    }
}

fn start() -> Store {
    start_with("")
}

holdfast_testkit::conformance_suite!(start);
