//! etcd: a fresh single-node server per test (etcd's default timing, so the
//! server's minimum lease TTL is 2 s).

use std::time::Duration;

use holdfast_testkit::conformance::{ProxyTarget, Store};
use holdfast_testkit::servers::etcd::EtcdServer;

fn start() -> Store {
    let server = EtcdServer::start();
    Store {
        url: server.url(),
        // A client that dies leaves its keys to its session lease: a lock of
        // TTL t sits on a lease of max(ceil(t), 2 s) (2 s: the server's
        // minimum with a 1 s election timeout), which etcd revokes up to
        // 500 ms after it runs out. Worst case for t >= 300 ms:
        // 2 s - 0.3 s + 0.5 s = 2.2 s, plus the revoke's commit.
        expiry_slack: Duration::from_millis(2500),
        unreachable_url: format!("etcd://127.0.0.1:{}?timeout_ms=2000", holdfast_testkit::servers::closed_port()),
        // A single node; each operation (its retries included) within 1 s.
        via_proxy: Some(ProxyTarget::loopback(
            server.members[0].client_port,
            format!("{}?timeout_ms=1000", server.url()),
            Duration::from_millis(1000),
        )),
        in_process: None,
        server: Box::new(server),
    }
}

holdfast_testkit::conformance_suite!(start);
