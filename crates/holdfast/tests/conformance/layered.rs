//! The layered hybrid lock: a fresh Redis (the fast store, no persistence)
//! in front of a fresh PostgreSQL (the authoritative store) per test, the
//! whole suite through `layered://`, as users open it. The fault proxy sits
//! in front of the authoritative store, whose answers decide every call; the
//! fast store's faults are in `tests/layered.rs`.

use std::time::Duration;

use holdfast_testkit::conformance::{ProxyTarget, Store};
use holdfast_testkit::servers::{closed_port, postgres::PostgresServer, redis::RedisServer};

fn start() -> Store {
    let (fast, authoritative) = (RedisServer::start(), PostgresServer::start());
    let auth_url = authoritative.url();
    Store {
        url: format!("layered://{}|{auth_url}", fast.url()),
        // The authoritative store's: expiry on PostgreSQL's clock, a few
        // statement round trips (the fast lease, on Redis, runs out with it).
        expiry_slack: Duration::from_millis(200),
        unreachable_url: format!(
            "layered://redis://127.0.0.1:{}?timeout_ms=1000|postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable&connect_timeout=2",
            closed_port(),
            closed_port()
        ),
        // The proxy rewrites PostgreSQL's address only; Redis is reached directly.
        via_proxy: Some(ProxyTarget::loopback(
            authoritative.port(),
            format!("layered://{}|{auth_url}&op_timeout_ms=1000&connect_timeout=1", fast.url()),
            Duration::from_millis(1000),
        )),
        in_process: None,
        server: Box::new((fast, authoritative)),
    }
}

holdfast_testkit::conformance_suite!(start);

/// A Redis fast store (the member the clauses take down) in front of
/// PostgreSQL.
fn composite() -> holdfast_testkit::conformance::Composite {
    use std::sync::{Arc, Mutex};
    let (fast, authoritative) = (RedisServer::start(), PostgresServer::start());
    let url = format!("layered://{}?timeout_ms=1000|{}", fast.url(), authoritative.url());
    let fast = Arc::new(Mutex::new(fast));
    let (stop, start) = (Arc::clone(&fast), Arc::clone(&fast));
    holdfast_testkit::conformance::Composite {
        url,
        member: 0,
        then_stop: None,
        stop: Box::new(move |_| stop.lock().expect("fast").kill()),
        start: Box::new(move |_| start.lock().expect("fast").restart()),
        servers: Box::new((fast, authoritative)),
    }
}

mod members {
    holdfast_testkit::member_clauses!(super::composite);
}
