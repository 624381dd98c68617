//! PostgreSQL connections against real servers: TLS modes, a
//! transaction-pooling PgBouncer in front of the server, and a statement the
//! client gave up on, cancelled on the server.
#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use holdfast::backend::AcquireRequest;
use holdfast::{Client, Error, LockKey, OwnerToken};
use holdfast_testkit::servers::postgres::{PgBouncer, PostgresServer};

use crate::postgres_common::{connect, psql};

/// TLS: verify-full with the right CA works, with another CA fails with a
/// non-retryable error, verify-ca ignores the host name, require encrypts
/// without checking, and the server really sees TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_modes() {
    let server = PostgresServer::start();
    let dir = server.dir().join("tls");
    std::fs::create_dir_all(&dir).expect("tls dir");
    holdfast_testkit::servers::tls::make_server_certificate(&dir);
    holdfast_testkit::servers::tls::make_ca(&dir, "other");
    let status = std::process::Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status();
    assert!(status.is_ok_and(|s| s.success()) || !dir.join("server.key").exists());
    let mut perms = std::fs::metadata(dir.join("server.key")).expect("key").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(dir.join("server.key"), perms).expect("chmod");
    psql(&server, &format!("ALTER SYSTEM SET ssl_cert_file = '{}'", dir.join("server.pem").display()));
    psql(&server, &format!("ALTER SYSTEM SET ssl_key_file = '{}'", dir.join("server.key").display()));
    psql(&server, "ALTER SYSTEM SET ssl = on");
    psql(&server, "SELECT pg_reload_conf()");
    let base = format!("postgres://postgres@127.0.0.1:{}/postgres", server.port());
    let ca = dir.join("ca.pem");
    let other = dir.join("other.pem");
    let deadline = Instant::now() + Duration::from_secs(10);
    while psql(&server, "SHOW ssl") != "on" {
        assert!(Instant::now() < deadline, "ssl not enabled by reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let full = connect(&format!("{base}?sslmode=verify-full&sslrootcert={}", ca.display()), "tls-full").await;
    let g = full.mutex("tls/k").acquire().await.expect("acquire over verify-full");
    let ssl_sessions = "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                        WHERE s.ssl AND a.application_name = 'holdfast'";
    assert_ne!(psql(&server, ssl_sessions), "0", "no TLS session seen by the server");
    g.release().await.expect("release");
    match Client::connect(&format!("{base}?sslmode=verify-full&sslrootcert={}", other.display())).await {
        Err(e @ Error::Backend { retryable: false, .. }) => eprintln!("wrong CA refused: {e}"),
        other => panic!("a server certificate from another CA was accepted: {:?}", other.map(|_| ())),
    }
    // The certificate names 127.0.0.1, not localhost: verify-full refuses, verify-ca accepts.
    let by_name = format!("postgres://postgres@localhost:{}/postgres", server.port());
    assert!(Client::connect(&format!("{by_name}?sslmode=verify-full&sslrootcert={}", ca.display())).await.is_err());
    let c = connect(&format!("{by_name}?sslmode=verify-ca&sslrootcert={}", ca.display()), "tls-ca").await;
    c.mutex("tls/k").acquire().await.expect("verify-ca").release().await.expect("release");
    let missing = format!("{base}?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem");
    assert!(matches!(Client::connect(&missing).await, Err(Error::InvalidInput { what: "url", .. })));
    let c = connect(&format!("{base}?sslmode=require"), "tls-req").await;
    c.mutex("tls/k").acquire().await.expect("require").release().await.expect("release");
}

/// Behind a transaction-pooling PgBouncer (1.18: no protocol-level prepared
/// statements) with 2 server connections shared by all clients: first use,
/// exclusion, renewal, NOTIFY wake-ups (LISTEN over `listen_url`, direct)
/// and polling with `listen=off` all work, because nothing is session state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_transaction_pooling_pgbouncer() {
    let server = PostgresServer::start();
    let bouncer = PgBouncer::start(&server);
    let direct: String = url::form_urlencoded::byte_serialize(server.url().as_bytes()).collect();
    let url = format!("{}&schema=pooled&poll_min_ms=20000&poll_max_ms=30000&listen_url={direct}", bouncer.url());
    // Concurrent first use through the pooler.
    let mut joins = Vec::new();
    for i in 0..4 {
        let url = url.clone();
        joins.push(tokio::spawn(async move { connect(&url, &format!("p{i}")).await }));
    }
    let mut clients = Vec::new();
    for j in joins {
        clients.push(j.await.expect("task"));
    }
    // Exclusion under interleaving on shared server connections.
    let key = "pooled/k";
    let inside = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (c, inside) = (clients[t % 4].clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let mut last = 0;
            for _ in 0..10 {
                let g = c.mutex(key).acquire_timeout(Duration::from_secs(30)).await.expect("acquire via pooler");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders behind the pooler");
                assert!(g.fence() > last);
                last = g.fence();
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.expect("release via pooler");
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t).await.expect("stalled behind the pooler").expect("task");
    }
    // Renewal through the pooler.
    let g = clients[0].mutex(key).ttl(Duration::from_millis(500)).acquire().await.expect("hold");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!g.is_lost(), "renewal through the pooler failed");
    assert!(clients[1].mutex(key).try_acquire().await.expect("try").is_none());
    // A waiter woken by NOTIFY (its LISTEN goes direct; the poll is 20 s).
    let w = clients[1].clone();
    let waiter = tokio::spawn(async move {
        let g = w.mutex(key).acquire().await.expect("waiter");
        let at = Instant::now();
        g.release().await.expect("release");
        at
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    g.release().await.expect("release");
    let at = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("waiter stuck").expect("task");
    assert!(at - released < Duration::from_secs(2), "NOTIFY wake-up took {:?}", at - released);
    // listen=off: waiters poll (5..50 ms), through the pooler only.
    let polling = connect(&format!("{}&schema=pooled&listen=off", bouncer.url()), "poll").await;
    assert!(!polling.capabilities().store_notification);
    let g = clients[2].mutex(key).acquire().await.expect("hold");
    let p = polling.clone();
    let waiter = tokio::spawn(async move { p.mutex(key).acquire().await.expect("polling waiter").release().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    g.release().await.expect("release");
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("polling waiter stuck")
        .expect("task")
        .expect("release");
    drop(bouncer);
}

/// A renewal the client stops waiting for ends on the server too: it does
/// not wait on on its rows' locks after the client gave up (issue 15: the
/// abandoned renewal of 100k rows ran on, and its retry queued behind it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abandoned_renewal_is_cancelled_on_the_server() {
    let server = PostgresServer::start();
    let url = format!("{}&timeout_ms=300", server.url());
    let store = holdfast::stores::connect(&url).await.expect("connect");
    let req = AcquireRequest::new(LockKey::new("slow-renew").unwrap(), OwnerToken::random(), Duration::from_secs(30));
    store.try_acquire(&req).await.expect("acquire").expect("free");
    // Another session locks the client's session row (which renewal
    // extends for all its mutex leases) for 3 s: the renewal waits on it.
    let locker = {
        let port = server.port();
        std::thread::spawn(move || {
            std::process::Command::new("psql")
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres", "-d", "postgres", "-X", "-c"])
                .arg("BEGIN; SELECT 1 FROM holdfast_leases_sess FOR UPDATE; SELECT pg_sleep(3); COMMIT;")
                .output()
                .expect("psql")
        })
    };
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'";
    for _ in 0..50 {
        if psql(&server, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'") == "1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let renewal = holdfast::backend::RenewRequest { key: req.key.clone(), token: req.token, ttl: req.ttl };
    let outcome = store.renew(std::slice::from_ref(&renewal)).await;
    assert!(outcome.is_err(), "the renewal should have timed out behind the row lock: {outcome:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = psql(&server, waiting);
    assert_eq!(still, "0", "the abandoned renewal still waits on the server");
    locker.join().expect("locker");
}
