//! ZooKeeper-specific tests against real servers: fairness across clients,
//! ACLs and container cleanup, session loss, and a leader failover on a
//! three-member ensemble.
#![cfg(feature = "zookeeper")]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast::backend::zookeeper::ZkBackend;
use holdfast::{Client, ClientOptions, Error};
use holdfast_testkit::servers::zookeeper::{TICK_MS, ZkServer, watches_by_path};
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

/// Grants follow request order across several clients (each its own
/// session); `status` counts the waiters; fences strictly increase; nothing
/// is left in the queue afterwards.
#[test]
fn fair_order_across_clients() {
    let server = ZkServer::start();
    let url = server.url();
    runtime().block_on(async {
        let holder = client(&url, "holder").await;
        let key = "fair/orders";
        let g = holder.mutex(key).acquire().await.expect("acquire");
        let first_fence = g.fence();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..6 {
            let c = client(&url, &format!("w{i}")).await;
            let order = order.clone();
            waiters.push(tokio::spawn(async move {
                let g = c.mutex(key).acquire_timeout(Duration::from_secs(60)).await.expect("waiter");
                order.lock().expect("order").push((i, g.fence()));
                tokio::time::sleep(Duration::from_millis(30)).await;
                g.release().await.expect("waiter release");
            }));
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let status = holder.status(key).await.expect("status");
        assert_eq!(status.holder.as_ref().map(|h| (h.label.as_str(), h.fence)), Some(("holder", first_fence)));
        assert_eq!(status.waiters, Some(6), "{status:?}");
        // No herd: each waiter watches only the node just before its own, so
        // six distinct queue nodes are watched, by one session each, and
        // nobody watches the lock's children.
        let watches = watches_by_path(server.client_port(0));
        assert_eq!(watches.len(), 6, "{watches:?}");
        assert!(
            watches.iter().all(|(p, n)| *n == 1 && p.starts_with("/holdfast/locks/fair%2Forders/lk-")),
            "{watches:?}"
        );
        g.release().await.expect("release");
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(60), w).await.expect("waiter stuck").expect("task");
        }
        let order = order.lock().expect("order").clone();
        assert_eq!(order.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5], "{order:?}");
        let mut last = first_fence;
        for (_, f) in &order {
            assert!(*f > last, "fences not increasing: {order:?}");
            last = *f;
        }
        let status = holder.status(key).await.expect("status");
        assert!(status.holder.is_none() && status.waiters == Some(0), "{status:?}");
    });
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
        assert!(!format!("{:?}", alice.backend()).contains("secret"), "password in Debug output");
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

/// A hung ensemble (SIGSTOP longer than the session timeout): the holder's
/// `lost()` fires before anyone else is granted; its release says `Lost`;
/// the client opens a new session and locks again with a higher fence.
#[test]
fn session_loss_fires_lost_before_regrant() {
    let server = ZkServer::start();
    let url = format!("{}?session_timeout=2000&timeout=3000", server.url());
    runtime().block_on(async {
        let backend = ZkBackend::connect_url(&url).await.expect("connect");
        let first_session = backend.session_id().await.expect("session id");
        let a = Client::with_backend(Arc::new(backend.clone()), ClientOptions::default().with_label("a"));
        let b = client(&url, "b").await;
        let key = "session/loss";
        let g = a.mutex(key).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let lost_at = {
            let lost = g.lost();
            tokio::spawn(async move {
                lost.await;
                Instant::now()
            })
        };
        let waiter = tokio::spawn(async move {
            let g = b.mutex(key).acquire_timeout(Duration::from_secs(60)).await.expect("waiter");
            (Instant::now(), g.fence(), g)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.pause(0, true);
        tokio::time::sleep(Duration::from_millis(2000 + 2000)).await;
        server.pause(0, false);
        let lost_at =
            tokio::time::timeout(Duration::from_secs(5), lost_at).await.expect("lost() never fired").expect("task");
        let (granted_at, fence, wg) =
            tokio::time::timeout(Duration::from_secs(30), waiter).await.expect("waiter never granted").expect("task");
        assert!(lost_at < granted_at, "lost() fired {:?} after the regrant", lost_at - granted_at);
        assert!(fence > g.fence());
        assert!(matches!(g.release().await, Err(Error::Lost { .. })));
        wg.release().await.expect("waiter release");
        let again = a.mutex(key).acquire_timeout(Duration::from_secs(20)).await.expect("lock on a new session");
        assert!(again.fence() > fence);
        assert_ne!(backend.session_id().await.expect("session id"), first_session, "the lost session was reused");
        again.release().await.expect("release");
    });
}

/// Kill the leader of a three-member ensemble while a lock is held and three
/// clients wait: the holder keeps its grant or sees `lost()` before anyone
/// else is granted; the waiters are granted in their request order; fences
/// strictly increase.
#[test]
fn leader_failover_keeps_order_and_fences() {
    let mut server = ZkServer::start_ensemble(3);
    // Session timeout 10 s: a disconnection up to 2.5 s (the election) keeps
    // grants and queue places.
    let url = format!("{}?session_timeout=10000", server.url());
    let rt = runtime();
    let holder = rt.block_on(client(&url, "holder"));
    let key = "failover/key";
    let g = rt.block_on(holder.mutex(key).ttl(Duration::from_secs(3)).acquire()).expect("acquire");
    let holder_fence = g.fence();
    let lost_at = {
        let lost = g.lost();
        rt.spawn(async move {
            lost.await;
            Instant::now()
        })
    };
    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let c = rt.block_on(client(&url, &format!("w{i}")));
        let grants = grants.clone();
        waiters.push(rt.spawn(async move {
            let g = c.mutex(key).acquire_timeout(Duration::from_secs(90)).await.expect("waiter acquire");
            grants.lock().expect("grants").push((i, g.fence(), Instant::now()));
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = g.release().await;
        }));
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(rt.block_on(holder.status(key)).expect("status").waiters, Some(3));
    let leader = server.leader().expect("a leader");
    server.kill(leader);
    // Wait for a new leader among the survivors, then hold a little longer.
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.leader().is_none() {
        assert!(Instant::now() < deadline, "no new leader after 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1) + Duration::from_millis(4 * TICK_MS));
    assert!(grants.lock().expect("grants").is_empty() || g.is_lost(), "a waiter was granted while the holder held");
    let held_through = !g.is_lost();
    let released_at = Instant::now();
    let release = rt.block_on(g.release());
    if held_through {
        release.expect("holder kept its grant through the failover");
    }
    for w in waiters {
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(90), w).await })
            .expect("waiter stuck")
            .expect("task");
    }
    let grants = grants.lock().expect("grants").clone();
    assert_eq!(
        grants.iter().map(|(i, _, _)| *i).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "order after failover: {grants:?}"
    );
    let mut last = holder_fence;
    for (_, f, _) in &grants {
        assert!(*f > last, "fences not increasing across the failover: {holder_fence} then {grants:?}");
        last = *f;
    }
    let first_grant = grants[0].2;
    if held_through {
        assert!(first_grant >= released_at, "granted before the holder released");
    } else {
        let lost_at = rt.block_on(lost_at).expect("lost task");
        assert!(lost_at <= first_grant, "lost() fired after the key was granted again");
    }
    eprintln!("holder kept its grant through the leader kill: {held_through}");
    drop(rt);
}
