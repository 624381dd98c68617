//! Clusters and connections: killed processes, leader failover, TLS and auth, dead endpoints.

use super::*;

fn start_cluster() -> Store {
    let cluster = EtcdCluster::start_members(3);
    Store {
        url: cluster.url(),
        expiry_slack: Duration::from_millis(2500),
        unreachable_url: format!("etcd://127.0.0.1:{}", holdfast_testkit::servers::free_port()),
        via_proxy: None,
        in_process: None,
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

/// Client certificates (`--client-cert-auth`): the certificate's common name
/// is the user. A user whose role may read and write under `holdfast/` only
/// (the least an etcd user needs) locks and is woken; a user without roles
/// and a client without a certificate are each a typed, non-retryable error.
#[test]
fn client_certificates_and_roles() {
    let server = holdfast_testkit::servers::etcd::EtcdTlsServer::start_with_client_certs();
    let port = server.cluster.members[0].client_port;
    let dir = server.dir().to_owned();
    let url = |user: &str| {
        format!(
            "etcds://127.0.0.1:{port}?timeout_ms=3000&ca_file={}&cert_file={}&key_file={}",
            dir.join("ca.pem").display(),
            dir.join(format!("{user}.pem")).display(),
            dir.join(format!("{user}.key")).display()
        )
    };
    rt().block_on(async {
        let (a, b) = (client(&url("locker"), "cert-a").await, client(&url("locker"), "cert-b").await);
        let g = a.mutex("certs/lock").ttl(Duration::from_secs(3)).acquire().await.expect("acquire as locker");
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move {
                let g = b.mutex("certs/lock").acquire_timeout(Duration::from_secs(20)).await.expect("wait");
                let fence = g.fence();
                g.release().await.expect("release");
                fence
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(b.status("certs/lock").await.expect("status").holder.map(|h| h.label), Some("cert-a".into()));
        let first = g.fence();
        g.release().await.expect("release");
        let second = tokio::time::timeout(Duration::from_secs(20), waiter).await.expect("waiter stuck").expect("task");
        assert!(second > first, "fences {first} then {second}");

        let refused = |what: &str, outcome: holdfast::Result<()>| {
            let e = outcome.expect_err(what);
            assert!(matches!(e, Error::Backend { .. }), "{what}: {e:?}");
            assert!(!e.is_retryable(), "{what}: retryable: {e}");
            e
        };
        let try_lock = |u: String| async move {
            tokio::time::timeout(Duration::from_secs(30), async {
                let c = Client::connect(&u).await?;
                c.mutex("certs/lock").try_acquire().await.map(|_| ())
            })
            .await
            .expect("hung")
        };
        let e = refused("a user without roles", try_lock(url("nobody")).await);
        assert!(e.to_string().to_lowercase().contains("permission denied"), "{e}");
        let no_cert = format!("etcds://127.0.0.1:{port}?timeout_ms=3000&ca_file={}", dir.join("ca.pem").display());
        let outcome = try_lock(no_cert).await;
        assert!(matches!(outcome, Err(Error::Backend { .. })), "no client certificate: {outcome:?}");
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
