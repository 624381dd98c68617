//! ZooKeeper-specific tests against real servers: fairness across clients
//! and across the sequence wrap, ACLs and container cleanup, and faults
//! (session loss, leader failover, a dead ensemble, a rolling restart, a
//! stalled runtime).
#![cfg(feature = "zookeeper")]

mod faults;
mod order;
mod secured;

use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error};
use holdfast_testkit::servers::zookeeper::ZkServer;
use zookeeper_client as zk;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label))
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

async fn raw(server: &ZkServer, auth: Option<&str>) -> zk::Client {
    let hosts: Vec<String> = (0..server.len()).map(|i| format!("127.0.0.1:{}", server.client_port(i))).collect();
    let mut c = zk::Client::connector().with_session_timeout(Duration::from_secs(4));
    if let Some(a) = auth {
        c = c.with_auth("digest", a.as_bytes());
    }
    c.connect(&hosts.join(",")).await.expect("raw zookeeper client")
}

/// With credentials, lock nodes carry `auth:cdrwa, world:r`: another
/// identity (or no identity) can read but cannot delete or change them, nor
/// lock under the same root. An empty lock parent (a container) is removed
/// by the server after release.
#[test]
fn acl_protects_lock_nodes_and_containers_are_cleaned() {
    let server = ZkServer::start();
    let hosts = server.url().trim_start_matches("zk://").to_owned();
    let alice_url = format!("zk://alice:secret@{hosts}");
    runtime().block_on(async {
        let alice = client(&alice_url, "alice").await;
        let key = "acl test/1";
        let parent = "/holdfast/locks/acl%20test%2F1";
        assert!(!format!("{alice:?}").contains("secret"), "password in Debug output");
        let g = alice.mutex(key).acquire().await.expect("acquire");
        for (who, auth) in [("mallory", Some("mallory:guess")), ("anonymous", None)] {
            let other = raw(&server, auth).await;
            let children = other.list_children(parent).await.expect("anyone may list");
            assert_eq!(children.len(), 1, "{children:?}");
            let node = format!("{parent}/{}", children[0]);
            let (data, _) = other.get_data(&node).await.expect("anyone may read");
            assert!(String::from_utf8_lossy(&data).ends_with("\nalice"));
            assert!(matches!(other.delete(&node, None).await, Err(zk::Error::NoAuth)), "{who} deleted a lock node");
            assert!(matches!(other.set_data(&node, b"x", None).await, Err(zk::Error::NoAuth)), "{who} changed it");
            assert!(matches!(other.delete(parent, None).await, Err(zk::Error::NoAuth | zk::Error::NotEmpty)));
            let queue_jump = other
                .create(
                    &format!("{parent}/lk-"),
                    b"",
                    &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
                )
                .await;
            assert!(matches!(queue_jump, Err(zk::Error::NoAuth)), "{who} joined the queue: {queue_jump:?}");
        }
        // holdfast logged in with alice's password itself (not a redacted
        // form of it): the node's digest identity is the one the server
        // gives a plain client that logs in as alice:secret.
        let same = raw(&server, Some("alice:secret")).await;
        let probe = zk::CreateMode::Ephemeral.with_acls(zk::Acls::creator_all());
        same.create("/acl-probe", b"", &probe).await.expect("probe node");
        let digest = |acls: Vec<zk::Acl>| acls.iter().find(|a| a.scheme() == "digest").map(|a| a.id().to_owned());
        let alice_id = digest(same.get_acl("/acl-probe").await.expect("probe acl").0).expect("digest acl");
        let children = same.list_children(parent).await.expect("list");
        let node_acl = same.get_acl(&format!("{parent}/{}", children[0])).await.expect("node acl").0;
        assert_eq!(digest(node_acl), Some(alice_id), "holdfast authenticated with another password");
        // Another identity's holdfast client gets a typed, non-retryable error.
        let bob = client(&format!("zk://bob:pw@{hosts}"), "bob").await;
        match bob.mutex("acl other").try_acquire().await {
            Err(e @ Error::Backend { .. }) => assert!(!e.is_retryable(), "{e}"),
            other => panic!("bob locked under alice's root: {other:?}"),
        }
        assert!(alice.mutex(key).try_acquire().await.expect("try").is_none(), "the lock was freed");
        g.release().await.expect("owner release");

        // The container parent goes once empty (checkIntervalMs=500 in the testkit).
        let observer = raw(&server, None).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        while observer.check_stat(parent).await.expect("stat").is_some() {
            assert!(Instant::now() < deadline, "empty lock parent {parent} never removed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // And locking the key again recreates it; the fence still increases.
        let g2 = alice.mutex(key).acquire().await.expect("acquire after cleanup");
        g2.release().await.expect("release");
    });
}

/// A lease without renewal lasts its TTL, though the session vouches for
/// less at a time: a 4 s read lease on a 4 s session (which vouches for 3 s
/// after each reply) is still held at 3.5 s and ends at its TTL, when a
/// writer gets in. (Was: the client deleted it at about 3 s.)
#[test]
fn a_lease_without_renewal_lasts_its_ttl() {
    let server = ZkServer::start();
    let url = format!("{}?session_timeout_ms=4000", server.url());
    runtime().block_on(async {
        let (a, b) = (client(&url, "reader").await, client(&url, "writer").await);
        let ttl = Duration::from_secs(4);
        let called = Instant::now();
        let g = a.rwlock("no-renew/zk").read().ttl(ttl).no_renew().acquire().await.expect("read");
        // Its validity at first is the session's word (3 s); the client
        // renews it up to one TTL, so it is still held at 3.5 s.
        let ends = called + ttl - holdfast::LockOptions::drift_margin(ttl);
        tokio::time::sleep_until((called + Duration::from_millis(3500)).into()).await;
        assert!(!g.is_lost(), "lost at 3.5 s");
        let writer = b.rwlock("no-renew/zk").write();
        assert!(writer.try_acquire().await.expect("try").is_none(), "a writer got in at 3.5 s");
        let w = writer.acquire_timeout(Duration::from_secs(20)).await.expect("the writer after the TTL");
        assert!(Instant::now() >= ends, "the writer got in {:?} before the lease's end", ends - Instant::now());
        w.release().await.expect("release");
    });
}
