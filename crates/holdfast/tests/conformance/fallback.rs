//! The fallback chain over a fresh redis-server (the first store) and a
//! fresh SQLite file (the arbiter), the whole suite through `fallback://`,
//! as users open it. The fault proxy sits in front of Redis, the store that
//! grants; the chain's own faults (a partition that splits clients between
//! stores, a switch) are in `tests/fallback.rs`.

use std::time::Duration;

use holdfast_testkit::conformance::{ProxyTarget, Store};
use holdfast_testkit::servers::{closed_port, redis::RedisServer};

/// A 2 s mode lease: every clause's leases fit in one, and a switch would
/// cost 2 s. None should happen here: the fault clauses fail the first
/// store on purpose, one fault after another, with no call between some of
/// them that could succeed (a lost reply at one moment, a connection found
/// out of step two seconds later), and with the default `switch_after_ms`
/// of 2 s the chain took that for a store down and moved its grants to the
/// arbiter, past the fault proxy (seen in CI: F1's waiting acquire was
/// granted by SQLite). The chain's switches are the member clauses' below
/// and `tests/fallback.rs`'s.
const OPTIONS: &str = "?mode_ttl_ms=2000&switch_after_ms=30000";

fn start() -> Store {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let arbiter = format!("sqlite://{}/arbiter.db", dir.path().display());
    let url = |redis: &str| format!("fallback://{OPTIONS}|{redis}|{arbiter}");
    let with_timeout = format!("{}?timeout_ms=1000", server.url());
    Store {
        url: url(&server.url()),
        expiry_slack: Duration::from_millis(50),
        // The arbiter too: a chain whose first store alone is down builds
        // and switches to the next (the member clauses below).
        unreachable_url: format!(
            "fallback://{OPTIONS}|redis://127.0.0.1:{}?timeout_ms=1000|redis://127.0.0.1:{}?timeout_ms=1000",
            closed_port(),
            closed_port()
        ),
        via_proxy: Some(ProxyTarget::loopback(server.port(), url(&with_timeout), Duration::from_millis(1000))),
        in_process: None,
        server: Box::new((server, dir)),
    }
}

holdfast_testkit::conformance_suite!(start);

/// Redis first (the member the clauses take down), SQLite the arbiter;
/// switches after 500 ms of failures and fails back after 1 s, so that
/// `m3` sees the chain go back to Redis.
fn composite() -> holdfast_testkit::conformance::Composite {
    use std::sync::{Arc, Mutex};
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!(
        "fallback://?mode_ttl_ms=2000&switch_after_ms=500&fail_back_after_ms=1000|redis://127.0.0.1:{}?timeout_ms=1000|sqlite://{}/arbiter.db",
        server.port(),
        dir.path().display()
    );
    let server = Arc::new(Mutex::new(server));
    let (stop, start) = (Arc::clone(&server), Arc::clone(&server));
    holdfast_testkit::conformance::Composite {
        url,
        member: 0,
        then_stop: None,
        stop: Box::new(move |_| stop.lock().expect("redis").kill()),
        start: Box::new(move |_| start.lock().expect("redis").restart()),
        servers: Box::new((server, dir)),
    }
}

mod members {
    holdfast_testkit::member_clauses!(super::composite);
}
