//! `replicas=N` on a fixed server: `WAIT` confirms a grant only on the
//! connection that wrote it.

use std::time::{Duration, Instant};

use holdfast::backend::AcquireRequest;
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::faults::{Fault, FaultProxy};
use holdfast_testkit::servers::redis::RedisServer;

use super::rt;

/// A replica of `master` through `link` (a fault proxy to the master), once
/// the master sees it online.
async fn attach_replica(master: &RedisServer, replica: &RedisServer, link: &FaultProxy) {
    let open = |s: &RedisServer| redis::Client::open(s.url()).expect("client");
    let mut r = open(replica).get_multiplexed_async_connection().await.expect("replica connection");
    let port = link.addr().port().to_string();
    let _: () = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(&port).query_async(&mut r).await.expect("replicaof");
    let mut m = open(master).get_multiplexed_async_connection().await.expect("master connection");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut m).await.expect("info");
        if info.contains("state=online") {
            return;
        }
        assert!(Instant::now() < deadline, "the replica did not come online: {info}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The connection to the master is lost right after the script's reply (the
/// fault proxy closes it once that reply is through), and the connection
/// manager makes a new one by itself. The replica's link is blackholed, so
/// no replica has any grant: every acquire must fail unconfirmed. (A `WAIT`
/// on the new connection, which wrote nothing, counted the replica and
/// confirmed the grant.)
#[test]
fn wait_after_a_reconnect_does_not_confirm_a_grant() {
    let (master, replica) = (RedisServer::start(), RedisServer::start());
    let master_addr = format!("127.0.0.1:{}", master.port()).parse().expect("addr");
    let (link, commands) = (FaultProxy::start(master_addr), FaultProxy::start(master_addr));
    rt().block_on(async {
        attach_replica(&master, &replica, &link).await;
        link.blackhole();
        let url = format!("redis://{}?replicas=1&replicas_timeout_ms=200&timeout_ms=2000", commands.addr());
        let backend = holdfast::stores::connect(&url).await.expect("connect");
        let mut confirmed = Vec::new();
        for i in 0..20 {
            let key = LockKey::new(format!("replicas/reconnect/{i}")).expect("key");
            let req = AcquireRequest::new(key.clone(), OwnerToken::random(), Duration::from_secs(60));
            commands.cut_after_replies(1);
            let outcome = backend.try_acquire(&req).await;
            assert_eq!(commands.fault(), Fault::Forward, "attempt {i}: no reply came through, so nothing was cut");
            if let Ok(Some(grant)) = outcome {
                confirmed.push((i, grant.fence));
            }
            commands.forward();
        }
        assert!(confirmed.is_empty(), "grants no replica has were confirmed after a reconnect: {confirmed:?}");
    });
}
