//! Redis: a fresh redis-server (no persistence) on a free loopback port per test.

use std::time::Duration;

use holdfast_testkit::conformance::Store;
use holdfast_testkit::servers::{free_port, redis::RedisServer};

pub fn start_with(options: &str) -> Store {
    let server = RedisServer::start();
    Store {
        url: format!("{}{options}", server.url()),
        expiry_slack: Duration::from_millis(50),
        unreachable_url: format!("redis://127.0.0.1:{}?timeout_ms=1000", free_port()),
        server: Box::new(server),
    }
}

fn start() -> Store {
    start_with("")
}

holdfast_testkit::conformance_suite!(start);
