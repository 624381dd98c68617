//! Redis through Sentinel (`redis+sentinel://`): a master, a replica and
//! three sentinels per test, every grant and renewal confirmed by the
//! replica (`replicas=1`, `WAIT`).
//!
//! `via_proxy` is `None`: the client asks the sentinels for the master's
//! address, and they name the master itself, so a fault proxy put in front
//! of the master would be bypassed (the sentinels monitor a fixed address,
//! while the suite starts a proxy on a new port per fault test). Faults of
//! this setup (the master killed, a failover) are covered in
//! `tests/redis_sentinel.rs`; the fault clauses run against plain Redis in
//! `redis::f*`, on the same store code.

use std::time::Duration;

use holdfast_testkit::conformance::Store;
use holdfast_testkit::servers::{closed_port, redis::RedisSentinel};

fn start() -> Store {
    // A long down-after: no failover the suite did not ask for on a busy machine.
    let set = RedisSentinel::start_with(5000);
    Store {
        url: format!("{}?replicas=1", set.url()),
        expiry_slack: Duration::from_millis(50),
        unreachable_url: format!("redis+sentinel://127.0.0.1:{}/nobody?timeout_ms=1000", closed_port()),
        via_proxy: None,
        in_process: None,
        server: Box::new(set),
    }
}

holdfast_testkit::conformance_suite!(start);
