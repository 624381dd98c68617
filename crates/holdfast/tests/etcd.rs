//! etcd-specific tests: fairness across clients, status, session loss,
//! cleanup, and failover on a real three-member cluster.
#![cfg(feature = "etcd")]

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error};
use holdfast_testkit::conformance::Store;
use holdfast_testkit::servers::etcd::EtcdCluster;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

async fn raw(url: &str) -> etcd_client::Client {
    let endpoints: Vec<String> = url.trim_start_matches("etcd://").split(',').map(|h| format!("http://{h}")).collect();
    etcd_client::Client::connect(endpoints, None).await.expect("raw etcd client")
}

/// Keys under holdfast's default prefix.
async fn holdfast_keys(url: &str) -> Vec<String> {
    let resp = raw(url)
        .await
        .get("holdfast/", Some(etcd_client::GetOptions::new().with_prefix().with_keys_only()))
        .await
        .expect("get");
    resp.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect()
}

/// Eight waiters on eight clients are granted in request order, with strictly
/// increasing fences; status counts the waiters and names the holder.
#[test]
fn fair_across_clients_and_status() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let holder = client(&url, "holder-label").await;
        let key = "fair/orders";
        let g = holder.mutex(key).ttl(Duration::from_secs(10)).acquire().await.expect("acquire");
        let order = Arc::new(StdMutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..8 {
            let c = client(&url, &format!("w{i}")).await;
            let order = order.clone();
            waiters.push(tokio::spawn(async move {
                let g = c.mutex(key).ttl(Duration::from_secs(10)).acquire().await.expect("waiter");
                order.lock().expect("order").push((i, g.fence()));
                g.release().await.expect("release");
            }));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let status = holder.status(key).await.expect("status");
        let h = status.holder.expect("a holder");
        assert_eq!(h.label, "holder-label");
        assert_eq!(h.fence, g.fence());
        assert!(h.ttl_left.is_some_and(|t| t > Duration::ZERO && t <= Duration::from_secs(10)), "{h:?}");
        assert_eq!(status.waiters, Some(8));
        g.release().await.expect("release");
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(30), w).await.expect("waiter stuck").expect("task");
        }
        let order = order.lock().expect("order").clone();
        assert_eq!(order.iter().map(|(i, _)| *i).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
        let mut last = 0;
        for (_, fence) in order {
            assert!(fence > last, "fences not increasing");
            last = fence;
        }
        let status = holder.status(key).await.expect("status");
        assert_eq!((status.holder, status.waiters), (None, Some(0)));
        assert!(holdfast_keys(&url).await.is_empty(), "keys left behind");
    });
}

/// A waiter that waited longer than its TTL holds a full TTL once granted
/// (the TTL runs from the read that found it first, not from the request).
#[test]
fn long_wait_then_full_lease() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let (a, b) = (client(&url, "a").await, client(&url, "b").await);
        let ttl = Duration::from_secs(1);
        let g = a.mutex("long-wait").ttl(ttl).acquire().await.expect("acquire");
        let waiter = tokio::spawn(async move { b.mutex("long-wait").ttl(ttl).acquire().await.map(|g| (g, b)) });
        tokio::time::sleep(ttl * 3).await;
        g.release().await.expect("release");
        let (g, b) = waiter.await.expect("task").expect("waiter granted");
        let lost = g.lost();
        tokio::select! {
            _ = lost => panic!("a granted waiter lost its lease"),
            _ = tokio::time::sleep(ttl * 3) => {}
        }
        assert!(a.mutex("long-wait").try_acquire().await.expect("try").is_none());
        g.release().await.expect("release");
        drop(b);
    });
}

/// Revoking the session lease behind two guards fires `lost()` on both, and
/// the keys are gone; the next acquisition starts a new session.
#[test]
fn session_loss_fires_lost_for_every_guard() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let a = client(&url, "a").await;
        let g1 = a.mutex("s/one").ttl(Duration::from_secs(5)).acquire().await.expect("one");
        let g2 = a.mutex("s/two").ttl(Duration::from_secs(5)).acquire().await.expect("two");
        let mut etcd = raw(&url).await;
        let kv =
            etcd.get("holdfast/s%2Fone/", Some(etcd_client::GetOptions::new().with_prefix())).await.expect("get").kvs()
                [0]
            .clone();
        let other =
            etcd.get("holdfast/s%2Ftwo/", Some(etcd_client::GetOptions::new().with_prefix())).await.expect("get").kvs()
                [0]
            .lease();
        assert_eq!(kv.lease(), other, "two locks of one TTL share one session lease");
        etcd.lease_revoke(kv.lease()).await.expect("revoke");
        let lost = async {
            g1.lost().await;
            g2.lost().await;
        };
        tokio::time::timeout(Duration::from_secs(5), lost).await.expect("lost() did not fire after the lease went");
        assert!(matches!(g1.release().await, Err(Error::Lost { .. })));
        drop(g2);
        let b = client(&url, "b").await;
        let g = b.mutex("s/one").try_acquire().await.expect("try").expect("free after the session went");
        g.release().await.expect("release");
        let g = a.mutex("s/one").ttl(Duration::from_secs(5)).acquire().await.expect("a new session");
        g.release().await.expect("release");
    });
}

/// Many locks on one client renew through their shared session lease; after
/// release, and after aborted waiters, nothing is left in etcd; a dropped
/// client revokes its leases.
#[test]
fn many_locks_renew_and_nothing_accumulates() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let a = client(&url, "a").await;
        let mut guards = Vec::new();
        for i in 0..50 {
            guards.push(a.mutex(format!("many/{i}")).ttl(Duration::from_secs(1)).acquire().await.expect("acquire"));
        }
        let member = &server.members[0];
        let keep_alives = || member.metric(&["grpc_server_msg_received_total", "grpc_method=\"LeaseKeepAlive\""]);
        let txns = || member.metric(&["grpc_server_handled_total", "grpc_method=\"Txn\""]);
        let (ka0, txn0) = (keep_alives(), txns());
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (ka, txn) = (keep_alives() - ka0, txns() - txn0);
        assert!(guards.iter().all(|g| !g.is_lost()), "a renewed lock was lost");
        // 50 locks renewed every 333 ms for 3 s: about 9 renewal ticks, each
        // one keep-alive message for all 50 (plus a background one per TTL/3),
        // and no request per lock.
        eprintln!("renewing 50 locks for 3 s: {ka} keep-alive messages, {txn} transactions");
        assert_eq!(txn, 0.0, "renewal sent transactions");
        assert!(ka <= 40.0, "{ka} keep-alive messages for 50 locks in 3 s: not batched");
        let b = client(&url, "b").await;
        assert!(b.mutex("many/7").try_acquire().await.expect("try").is_none());
        for _ in 0..10 {
            let r = b.mutex("many/7").acquire_timeout(Duration::from_millis(30)).await;
            assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        }
        for g in guards {
            g.release().await.expect("release");
        }
        holdfast_testkit::conformance::eventually("no keys left", Duration::from_secs(5), || async {
            holdfast_keys(&url).await.is_empty()
        })
        .await;
        let mut etcd = raw(&url).await;
        let before = etcd.leases().await.expect("leases").leases().len();
        assert!(before >= 2, "two clients, two session leases at least");
        drop(a);
        drop(b);
        holdfast_testkit::conformance::eventually("leases revoked on drop", Duration::from_secs(5), || {
            let mut etcd = etcd.clone();
            async move { etcd.leases().await.expect("leases").leases().is_empty() }
        })
        .await;
    });
}

fn start_cluster() -> Store {
    let cluster = EtcdCluster::start_members(3);
    Store {
        url: cluster.url(),
        expiry_slack: Duration::from_millis(2500),
        unreachable_url: format!("etcd://127.0.0.1:{}", holdfast_testkit::servers::free_port()),
        via_proxy: None,
        server: Box::new(cluster),
    }
}

/// A holder process SIGKILLed on a three-member cluster frees the lock
/// within its lease TTL (plus etcd's 500 ms expiry check).
#[test]
fn killed_holder_process_frees_lock_on_cluster() {
    holdfast_testkit::conformance::child_entry(&start_cluster);
    holdfast_testkit::conformance::c3_expiry_killed_process(
        module_path!(),
        "killed_holder_process_frees_lock_on_cluster",
        &start_cluster,
    );
}

/// The leader dies while a lock is held and three clients wait: the holder
/// keeps its grant (or sees `lost()` before anyone else is granted), the
/// waiters are granted in order afterwards, fences increase strictly, and
/// the cluster keeps granting locks.
#[test]
fn failover_leader_killed_while_held_and_waited() {
    let mut cluster = EtcdCluster::start_members(3);
    let url = cluster.url();
    let runtime = rt();
    let leader = cluster.leader().expect("a leader");
    let (holder, waiters, key) = runtime.block_on(async {
        let key = "failover/job";
        let a = client(&url, "holder").await;
        let g = a.mutex(key).ttl(Duration::from_secs(5)).acquire().await.expect("acquire");
        let granted = Arc::new(StdMutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..3 {
            let c = client(&url, &format!("w{i}")).await;
            let granted = granted.clone();
            waiters.push(tokio::spawn(async move {
                let g = c.mutex(key).ttl(Duration::from_secs(5)).acquire_timeout(Duration::from_secs(60)).await;
                let g = g.unwrap_or_else(|e| panic!("waiter {i}: {e}"));
                granted.lock().expect("granted").push((i, g.fence(), Instant::now()));
                tokio::time::sleep(Duration::from_millis(50)).await;
                g.release().await.unwrap_or_else(|e| panic!("waiter {i} release: {e}"));
            }));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        ((a, g), (waiters, granted), key)
    });
    let killed_at = Instant::now();
    cluster.kill(leader);
    let ((a, g), (waiters, granted)) = (holder, waiters);
    runtime.block_on(async {
        let lost_at = {
            let lost = g.lost();
            tokio::spawn(async move {
                lost.await;
                Instant::now()
            })
        };
        // Hold through the election and beyond a lease TTL.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let kept = !g.is_lost();
        let fence = g.fence();
        let released_at = Instant::now();
        let released = g.release().await;
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(60), w).await.expect("waiter stuck").expect("waiter task");
        }
        let granted = granted.lock().expect("granted").clone();
        let order: Vec<_> = granted.iter().map(|(i, _, _)| *i).collect();
        assert_eq!(order, vec![0, 1, 2], "waiters out of order after failover");
        let mut last = fence;
        for (_, f, _) in &granted {
            assert!(*f > last, "fence {f} after {last}");
            last = *f;
        }
        let first_grant = granted[0].2;
        if kept {
            released.expect("the holder kept its grant through the failover");
            assert!(first_grant >= released_at, "a waiter was granted while the holder held");
        } else {
            let lost_at = lost_at.await.expect("lost task");
            assert!(lost_at <= first_grant, "lost() fired after a waiter was granted");
        }
        eprintln!(
            "failover: holder kept its grant: {kept}; first waiter granted {:?} after the leader was killed",
            first_grant - killed_at
        );
        // The cluster of two keeps serving new grants, with higher fences.
        let g = a.mutex(key).acquire_timeout(Duration::from_secs(20)).await.expect("acquire after failover");
        assert!(g.fence() > last);
        g.release().await.expect("release");
    });
    cluster.wait_healthy(Duration::from_secs(20));
}

/// TLS with a private CA and user/password authentication: locks work, a
/// wrong password is a typed error that does not print the password, and
/// plain `etcd://` cannot talk to a TLS port.
#[test]
fn tls_and_auth() {
    let server = holdfast_testkit::servers::etcd::EtcdTlsServer::start();
    let url = server.url();
    rt().block_on(async {
        let a = client(&url, "tls-a").await;
        let g = a.mutex("tls/lock").ttl(Duration::from_secs(3)).acquire().await.expect("acquire over TLS");
        let b = client(&url, "tls-b").await;
        assert!(b.mutex("tls/lock").try_acquire().await.expect("try").is_none());
        assert_eq!(b.status("tls/lock").await.expect("status").holder.expect("holder").label, "tls-a");
        g.release().await.expect("release");
        assert!(!format!("{a:?}").contains(&server.root_password), "the password leaked into Debug");

        let wrong = url.replace("root:", "root:wrong");
        let outcome = tokio::time::timeout(Duration::from_secs(20), async {
            let c = Client::connect(&wrong).await?;
            c.mutex("tls/lock").try_acquire().await.map(|_| ())
        })
        .await
        .expect("a wrong password hung");
        match outcome {
            Err(e @ Error::Backend { .. }) => {
                assert!(!e.is_retryable(), "a wrong password is not retryable: {e}");
                assert!(!e.to_string().contains("wrong"), "the password leaked into the error: {e}");
            }
            other => panic!("wrong password: expected a Backend error, got {other:?}"),
        }

        let port = server.cluster.members[0].client_port;
        let plain = format!("etcd://127.0.0.1:{port}?timeout_ms=1500");
        let outcome = tokio::time::timeout(Duration::from_secs(20), async {
            let c = Client::connect(&plain).await?;
            c.mutex("tls/lock").try_acquire().await.map(|_| ())
        })
        .await
        .expect("plain text to a TLS port hung");
        assert!(matches!(outcome, Err(Error::Backend { .. })), "{outcome:?}");
    });
}

/// An uncontended cycle is two writes to etcd (the queue put and the delete):
/// consecutive fences, which are etcd revisions, differ by exactly two.
#[test]
fn uncontended_cycle_is_two_writes() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let a = client(&url, "a").await;
        let m = a.mutex("two-writes").ttl(Duration::from_secs(30));
        let mut fences = Vec::new();
        for _ in 0..20 {
            let g = m.acquire().await.expect("acquire");
            fences.push(g.fence());
            g.release().await.expect("release");
        }
        let gaps: Vec<u64> = fences.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|&g| g == 2), "writes per cycle: {gaps:?}");
    });
}

/// Queues `n` waiters behind a holder, releases, and returns etcd requests
/// per hand-off until all are through.
async fn requests_per_handoff(url: &str, member: &holdfast_testkit::servers::etcd::EtcdMember, n: u64) -> f64 {
    let requests = || {
        member.metric(&["grpc_server_handled_total", "grpc_type=\"unary\""])
            + member.metric(&["grpc_server_msg_received_total", "grpc_method=\"Watch\""])
    };
    let key = format!("herd/{n}");
    let holder = client(url, "holder").await;
    let g = holder.mutex(&key).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
    let mut waiters = Vec::new();
    for i in 0..n {
        let (c, key) = (client(url, &format!("w{i}")).await, key.clone());
        waiters.push(tokio::spawn(async move {
            let g = c.mutex(&key).ttl(Duration::from_secs(30)).acquire().await.expect("waiter");
            tokio::time::sleep(Duration::from_millis(10)).await;
            g.release().await.expect("release");
        }));
    }
    holdfast_testkit::conformance::eventually("all queued", Duration::from_secs(10), || async {
        holder.status(&key).await.expect("status").waiters == Some(n)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = requests();
    g.release().await.expect("release");
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(30), w).await.expect("stuck").expect("task");
    }
    (requests() - before) / n as f64
}

/// No herd: each hand-off costs the same few requests (the releaser's
/// delete, the next waiter's position read) with 4 or 24 waiters queued;
/// a herd would cost a read per queued waiter. Counted by etcd's metrics.
#[test]
fn herd_free_handoffs() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let few = requests_per_handoff(&url, &server.members[0], 4).await;
        let many = requests_per_handoff(&url, &server.members[0], 24).await;
        eprintln!("etcd requests per hand-off: {few:.2} with 4 waiters, {many:.2} with 24");
        assert!(many <= 4.0 && many <= few * 1.3 + 0.5, "hand-off cost grows with the queue: {few} -> {many}");
    });
}

/// A dead endpoint in the URL is retried past: every operation succeeds on
/// the live one (etcd-client alone fails some requests on the dead one).
#[test]
fn dead_endpoint_in_url_is_retried_past() {
    let server = EtcdCluster::start();
    let live = server.url().trim_start_matches("etcd://").to_owned();
    let url = format!("etcd://127.0.0.1:{},{live}", holdfast_testkit::servers::free_port());
    rt().block_on(async {
        let (a, b) = (client(&url, "a").await, client(&url, "b").await);
        for i in 0..30 {
            let g = a.mutex("dead-endpoint").ttl(Duration::from_secs(2)).acquire().await.expect("acquire");
            if i % 10 == 0 {
                assert!(b.mutex("dead-endpoint").try_acquire().await.expect("try").is_none());
                assert!(b.status("dead-endpoint").await.expect("status").holder.is_some());
            }
            g.release().await.expect("release");
        }
        let g = b.mutex("dead-endpoint").ttl(Duration::from_secs(1)).acquire().await.expect("acquire");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!g.is_lost(), "renewal failed with a dead endpoint in the URL");
        g.release().await.expect("release");
    });
}
