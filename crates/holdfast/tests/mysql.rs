//! MySQL/MariaDB store tests beyond the conformance suite: server restarts
//! and crashes while locks are held, hostile keys, expired-row takeover,
//! one waiter per release, bounded tables, URLs, TLS and namespaces.
#![cfg(feature = "mysql")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use holdfast::backend::{AcquireRequest, Backend};
use holdfast::stores::mysql::MysqlBackend;
use holdfast::{Client, ClientOptions, Error, LockKey, OwnerToken};
use holdfast_testkit::servers::mysql::{DATABASE, MysqlServer, PASSWORD};

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

pub(crate) async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

/// The rows of `table`; of a lease table, those that are not released
/// markers (a release leaves the row with its fence, the key's, and the
/// marker token all ones).
pub(crate) fn rows(server: &MysqlServer, table: &str) -> u64 {
    let not_released =
        if table.ends_with("_leases") { format!(" WHERE token <> X'{}'", "FF".repeat(16)) } else { String::new() };
    server.sql(&format!("SELECT COUNT(*) FROM {DATABASE}.{table}{not_released}")).trim().parse().expect("count")
}

pub(crate) fn req(key: &str, token: OwnerToken, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(LockKey::new(key).expect("key"), token, ttl).with_label("test")
}

/// A clean restart and a SIGKILL of the server while a lock is held: the
/// lease row survives both (InnoDB commits are durable), renewal resumes on
/// new connections within the TTL so `lost()` never fires, the key stays
/// held against others, and fences keep increasing afterwards.
#[test]
fn restart_and_crash_while_held_keep_the_lease() {
    let mut server = MysqlServer::start();
    let url = server.url_with("timeout_ms=1000");
    let rt = rt();
    let (a, b) = rt.block_on(async { (client(&url, "restart-a").await, client(&url, "restart-b").await) });
    let ttl = Duration::from_secs(8);
    let guard = rt
        .block_on(a.mutex("restart/key").ttl(ttl).renew_every(Duration::from_millis(500)).acquire())
        .expect("acquire");
    let fence = guard.fence();
    assert_eq!(rows(&server, "holdfast_leases"), 1);

    for crash in [false, true] {
        let down = Instant::now();
        if crash {
            server.kill();
        } else {
            server.stop();
        }
        server.start_again();
        let outage = down.elapsed();
        assert!(outage < ttl / 2, "server outage {outage:?} too long for this test's TTL");
        assert_eq!(
            server.sql(&format!("SELECT fence FROM {DATABASE}.holdfast_leases")).trim(),
            fence.to_string(),
            "the lease row did not survive (crash: {crash})"
        );
        // Longer than a TTL after the outage: only renewals on new connections keep it.
        rt.block_on(async {
            let lost = guard.lost();
            tokio::select! {
                _ = lost => panic!("lost() fired although the server came back within the TTL (crash: {crash})"),
                _ = tokio::time::sleep(ttl + Duration::from_secs(1)) => {}
            }
            assert!(b.mutex("restart/key").try_acquire().await.expect("try").is_none(), "key free after restart");
        });
    }
    rt.block_on(async {
        guard.release().await.expect("release after restarts");
        let g = b.mutex("restart/key").acquire().await.expect("acquire after restart");
        assert!(g.fence() > fence, "fence {} after restart not above {fence}", g.fence());
        g.release().await.expect("release");
    });
    assert_eq!(rows(&server, "holdfast_leases"), 0);
}

/// A server down longer than the TTL: `lost()` fires (from the client's own
/// deadline, before the lease ends on the server clock); a waiter that starts
/// during the outage keeps waiting, and once the server is back it takes the
/// expired row over with a higher fence.
#[test]
fn outage_longer_than_ttl_fires_lost() {
    let mut server = MysqlServer::start();
    let url = server.url_with("timeout_ms=500");
    let rt = rt();
    let (a, b) = rt.block_on(async { (client(&url, "outage-a").await, client(&url, "outage-b").await) });
    let ttl = Duration::from_secs(1);
    let guard = rt.block_on(a.mutex("outage/key").ttl(ttl).acquire()).expect("acquire");
    let fence = guard.fence();
    let lost = guard.lost();
    let stopped = Instant::now();
    server.stop();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), lost).await.expect("lost() did not fire during the outage");
    });
    assert!(stopped.elapsed() < ttl + Duration::from_secs(5));
    // A waiter during the outage fails with the store's error (see
    // waiter_on_a_dying_server_gets_the_store_error); one after it takes over.
    std::thread::sleep(Duration::from_millis(500));
    server.start_again();
    rt.block_on(async {
        let g = b.mutex("outage/key").acquire_timeout(Duration::from_secs(30)).await.expect("take over");
        assert!(g.fence() > fence);
        assert!(matches!(guard.release().await, Err(Error::Lost { .. })));
        assert!(a.mutex("outage/key").try_acquire().await.expect("try").is_none(), "stale release freed the key");
        g.release().await.expect("release");
    });
}

/// A waiter on a held key while the server dies: its `acquire_timeout`
/// fails with the store's error (`Error::Backend`, exit 69 in the CLI) soon
/// after the server is gone, not with `Error::Timeout` ("busy", exit 75) at
/// its deadline, and a waiting `acquire` does not wait forever.
#[test]
fn waiter_on_a_dying_server_gets_the_store_error() {
    let mut server = MysqlServer::start();
    let url = server.url_with("timeout_ms=1000");
    let rt = rt();
    let (a, b) = rt.block_on(async { (client(&url, "dying-a").await, client(&url, "dying-b").await) });
    let guard = rt.block_on(a.mutex("dying/key").ttl(Duration::from_secs(60)).acquire()).expect("hold");
    let (b1, b2) = (b.clone(), b.clone());
    let bounded = rt.spawn(async move { b1.mutex("dying/key").acquire_timeout(Duration::from_secs(8)).await });
    let unbounded = rt.spawn(async move { b2.mutex("dying/key").acquire().await });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!bounded.is_finished() && !unbounded.is_finished(), "a waiter returned while the key was held");
    server.kill();
    let killed = Instant::now();
    rt.block_on(async {
        for (what, waiter) in [("acquire_timeout", bounded), ("acquire", unbounded)] {
            let outcome = tokio::time::timeout(Duration::from_secs(15), waiter)
                .await
                .unwrap_or_else(|_| panic!("{what} still waits {:?} after the server died", killed.elapsed()))
                .expect("task");
            match outcome {
                Err(Error::Backend { .. }) => {}
                Err(e) => panic!("{what} on a dead server: {e:?}, not the store's error"),
                Ok(_) => panic!("{what} granted by a dead server"),
            }
        }
    });
    drop(guard);
}

/// Keys compare as exact bytes: case and trailing spaces make different
/// keys; quotes, backslashes, `%`, `_`, SQL and 256 bytes of text all work.
#[test]
fn hostile_keys_are_exact_and_inert() {
    let server = MysqlServer::start();
    let rt = rt();
    rt.block_on(async {
        let (a, b) = (client(&server.url(), "keys-a").await, client(&server.url(), "keys-b").await);
        let long = "é".repeat(128); // 256 bytes
        let keys: Vec<String> = [
            "A",
            "a",
            "a ",
            "a  ",
            " a",
            "ä",
            "a\u{301}",
            "%",
            "_",
            "a%",
            "a_",
            "'",
            "\"",
            "\\",
            "\\'",
            "`x`",
            "'; DROP TABLE holdfast_leases; --",
            "x' OR '1'='1",
            "\u{1F512}",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([long.clone(), "k".repeat(256)])
        .collect();
        let mut guards = Vec::new();
        for k in &keys {
            let g = a.mutex(k).try_acquire().await.unwrap_or_else(|e| panic!("{k:?}: {e}"));
            guards.push(g.unwrap_or_else(|| panic!("{k:?} was busy: it collided with another key")));
        }
        for (k, g) in keys.iter().zip(&guards) {
            assert!(b.mutex(k).try_acquire().await.expect("try").is_none(), "{k:?} not exclusive");
            let status = b.status(k).await.expect("status");
            assert_eq!(status.holder.expect("holder").fence, g.fence(), "{k:?} status shows another grant");
        }
        assert_eq!(rows(&server, "holdfast_leases"), keys.len() as u64);
        for g in guards {
            g.release().await.expect("release");
        }
        // 257 bytes and NUL are refused before any I/O.
        for bad in ["k".repeat(257), "nul\0".into()] {
            assert!(matches!(a.mutex(bad).try_acquire().await, Err(Error::InvalidInput { what: "key", .. })));
        }
    });
    assert_eq!(rows(&server, "holdfast_leases"), 0, "rows left after releases");
    assert_eq!(rows(&server, "holdfast_fence"), 1, "one fence counter row per namespace");
}

/// The next acquirer takes an expired row over in place (one row per key,
/// higher fence); the old token can then neither release nor renew it; a
/// retried attempt with the same token gets the key back with a new fence.
#[test]
fn expired_row_is_taken_over_atomically() {
    let server = MysqlServer::start();
    let rt = rt();
    rt.block_on(async {
        let backend = MysqlBackend::open_url(&server.url()).await.expect("open");
        let (t1, t2) = (OwnerToken::random(), OwnerToken::random());
        let key = LockKey::new("takeover").expect("key");
        let g1 = backend.try_acquire(&req("takeover", t1, Duration::from_millis(200))).await.expect("acquire");
        let f1 = g1.expect("granted").fence;
        assert!(backend.try_acquire(&req("takeover", t2, Duration::from_secs(10))).await.expect("busy").is_none());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(rows(&server, "holdfast_leases"), 1, "the expired row is still there until taken over");
        let f2 = backend.try_acquire(&req("takeover", t2, Duration::from_secs(10))).await.expect("acquire");
        let f2 = f2.expect("an expired row is taken over").fence;
        assert!(f2 > f1);
        assert_eq!(rows(&server, "holdfast_leases"), 1, "takeover reuses the row");
        let renew = holdfast::backend::RenewRequest { key: key.clone(), token: t1, ttl: Duration::from_secs(10) };
        assert_eq!(backend.renew(&[renew]).await.expect("renew"), vec![false]);
        assert!(!backend.release(&key, t1).await.expect("stale release"));
        // A retry with the same token (its first reply was lost) regains the grant.
        let again = backend.try_acquire(&req("takeover", t2, Duration::from_secs(10))).await.expect("retry");
        assert_eq!(again.expect("same token regains").fence, f2, "a retry keeps its fence");
        assert!(backend.release(&key, t2).await.expect("release"));
        assert!(!backend.release(&key, t2).await.expect("second release is a no-op"));
        assert_eq!(rows(&server, "holdfast_leases"), 0);

        // Rows of holders that vanished long ago are swept; recent ones stay
        // (the next acquirer of their key takes them over), as does the
        // marker of the release just now.
        server.sql(&format!(
            "INSERT INTO {DATABASE}.holdfast_leases VALUES \
             ('old', REPEAT('x', 16), 1, 'gone', UTC_TIMESTAMP(6) - INTERVAL 2 MINUTE, NULL), \
             ('recent', REPEAT('y', 16), 2, 'gone', UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, NULL)"
        ));
        assert_eq!(backend.sweep_expired().await.expect("sweep"), 1);
        let left = server.sql(&format!("SELECT lock_key FROM {DATABASE}.holdfast_leases ORDER BY lock_key"));
        assert_eq!(left.trim(), "recent\ntakeover");
    });
}

/// Batched renewal: one call renews many leases (one UPDATE), and reports
/// exactly which ones are gone.
#[test]
fn batched_renewal_reports_each_lease() {
    let server = MysqlServer::start();
    let rt = rt();
    rt.block_on(async {
        let backend = MysqlBackend::open_url(&server.url()).await.expect("open");
        let mut batch = Vec::new();
        for i in 0..300 {
            let token = OwnerToken::random();
            let key = format!("batch/{i}");
            let ttl = Duration::from_secs(if i % 3 == 0 { 5 } else { 10 });
            backend.try_acquire(&req(&key, token, ttl)).await.expect("acquire").expect("granted");
            batch.push(holdfast::backend::RenewRequest { key: LockKey::new(key).expect("key"), token, ttl });
        }
        // Two leases go away: one released, one replaced by a forged token.
        assert!(backend.release(&batch[7].key, batch[7].token).await.expect("release"));
        batch[11].token = OwnerToken::random();
        let held = backend.renew(&batch).await.expect("renew");
        for (i, h) in held.iter().enumerate() {
            assert_eq!(*h, i != 7 && i != 11, "lease {i}");
        }
    });
}

/// One release grants one waiter (no herd), across several clients, and
/// every waiter gets its turn.
#[test]
fn one_waiter_granted_per_release() {
    let server = MysqlServer::start();
    let rt = rt();
    rt.block_on(async {
        let mut clients = Vec::new();
        for i in 0..4 {
            clients.push(client(&server.url(), &format!("herd-{i}")).await);
        }
        let holder = clients[0].mutex("herd").acquire().await.expect("acquire");
        let granted = Arc::new(AtomicU32::new(0));
        let inside = Arc::new(AtomicU32::new(0));
        let mut waiters = Vec::new();
        for i in 0..8 {
            let (c, granted, inside) = (clients[i % 4].clone(), granted.clone(), inside.clone());
            waiters.push(tokio::spawn(async move {
                let g = c.mutex("herd").acquire_timeout(Duration::from_secs(60)).await.expect("waiter");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                granted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.expect("release");
            }));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(granted.load(Ordering::SeqCst), 0);
        holder.release().await.expect("release");
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(granted.load(Ordering::SeqCst), 1, "one release must grant exactly one waiter");
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(60), w).await.expect("waiter stuck").expect("task");
        }
        assert_eq!(granted.load(Ordering::SeqCst), 8);
    });
    assert_eq!(rows(&server, "holdfast_leases"), 0);
}

/// Namespaces are separate tables; TLS demanded of a server without it, a
/// wrong password and bad options are typed errors that never show the password.
#[test]
fn urls_namespaces_tls_and_secrets() {
    let server = MysqlServer::start();
    let rt = rt();
    rt.block_on(async {
        let a = client(&server.url(), "ns-a").await;
        let b = client(&server.url_with("namespace=jobs_2"), "ns-b").await;
        let ga = a.mutex("same").acquire().await.expect("default namespace");
        let gb = b.mutex("same").try_acquire().await.expect("try").expect("other namespace is separate");
        assert!(!format!("{a:?}").contains("secret"), "Debug shows the password: {a:?}");
        ga.release().await.expect("release");
        gb.release().await.expect("release");

        match Client::connect(&server.url_with("ssl-mode=required")).await {
            Err(Error::Backend { .. }) => {}
            other => panic!("TLS required against a plain server: expected a Backend error, got {other:?}"),
        }
        let wrong = server.url().replace("secret", "wrong-secret");
        match Client::connect(&wrong).await {
            Err(e @ Error::Backend { .. }) => {
                let text = format!("{e} {e:?}");
                assert!(!text.contains("secret"), "an error shows the password: {text}");
            }
            other => panic!("wrong password: expected a Backend error, got {other:?}"),
        }
        for bad in ["namespace=a;b", "namespace=x`y", "ssl-mode=sometimes", "pool_max=0", "bogus=1"] {
            assert!(
                matches!(Client::connect(&server.url_with(bad)).await, Err(Error::InvalidInput { what: "url", .. })),
                "{bad}"
            );
        }
    });
    assert_eq!(rows(&server, "jobs_2_leases"), 0);
    assert!(PASSWORD.contains("secret"));
}

/// TLS against a server with a certificate from a throwaway CA: `verify_ca`
/// and `verify_identity` with `ssl-ca`, and `required`, lock over an
/// encrypted connection; `verify_ca` without the CA file is refused.
#[test]
fn tls_modes() {
    let server = MysqlServer::start_tls();
    let ca = server.ca_file();
    let rt = rt();
    rt.block_on(async {
        for mode in ["verify_identity", "verify_ca", "required"] {
            let url = server.url_with(&format!("ssl-mode={mode}&ssl-ca={}", ca.display()));
            let c = Client::connect(&url).await.unwrap_or_else(|e| panic!("{mode}: {e}"));
            let g = c.mutex("tls").try_acquire().await.expect("acquire").expect("free");
            g.release().await.expect("release");
        }
        let c = Client::connect(&server.url_with("ssl-mode=required")).await.expect("required without a CA");
        drop(c);
        match Client::connect(&server.url_with("ssl-mode=verify_ca")).await {
            Err(Error::Backend { .. }) => {}
            other => panic!("verify_ca with an unknown CA must fail, got {other:?}"),
        }
    });
    let ssl = server.sql("SHOW GLOBAL STATUS LIKE 'Ssl_accepts'");
    let accepts: u64 = ssl.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("Ssl_accepts");
    assert!(accepts >= 4, "TLS handshakes: {ssl}");
}

/// `sslmode=require` (or `required`) with a CA file checks the server's
/// certificate against that CA, as libpq does for PostgreSQL's same URL: a
/// CA that did not sign it is refused; the right one connects. (Was: any
/// certificate was accepted.)
#[test]
fn require_with_a_ca_file_verifies_the_ca() {
    let server = MysqlServer::start_tls();
    let other = tempfile::tempdir().expect("temp dir");
    holdfast_testkit::servers::tls::make_ca(other.path(), "other");
    let wrong = other.path().join("other.pem");
    rt().block_on(async {
        for mode in ["require", "required"] {
            let url = server.url_with(&format!("sslmode={mode}&ca_file={}", wrong.display()));
            match Client::connect(&url).await {
                Err(Error::Backend { store: "mysql", .. }) => {}
                other => panic!("{mode} with a CA that did not sign the server's certificate: {other:?}"),
            }
            let url = server.url_with(&format!("sslmode={mode}&ca_file={}", server.ca_file().display()));
            let c = Client::connect(&url).await.unwrap_or_else(|e| panic!("{mode} with the right CA: {e}"));
            let g = c.mutex("tls/require").try_acquire().await.expect("acquire").expect("free");
            g.release().await.expect("release");
        }
    });
}

/// Many tasks acquiring and releasing their own keys at once (grants,
/// releases and renewals interleaving on neighbouring rows): no call fails
/// (deadlocks between neighbouring keys are avoided or retried), each key's
/// fences increase (fences are per key), and no lease is left.
#[test]
fn concurrent_distinct_keys_never_fail() {
    let server = MysqlServer::start();
    let rt = rt();
    rt.block_on(async {
        let clients = [client(&server.url(), "conc-a").await, client(&server.url(), "conc-b").await];
        let mut joins = Vec::new();
        for t in 0..16 {
            let c = clients[t % 2].clone();
            joins.push(tokio::spawn(async move {
                let mut fences = Vec::new();
                for i in 0..40 {
                    let key = format!("conc/{t}/{}", i % 3);
                    let m = c.mutex(key.clone()).ttl(Duration::from_millis(600)).renew_every(Duration::from_millis(50));
                    let g = m.acquire_timeout(Duration::from_secs(30)).await.expect("acquire");
                    fences.push((key, g.fence()));
                    if i % 8 == 0 {
                        tokio::time::sleep(Duration::from_millis(120)).await; // let renewals run
                    }
                    g.release().await.expect("release");
                }
                fences
            }));
        }
        let mut all = Vec::new();
        for j in joins {
            all.extend(j.await.expect("task"));
        }
        // Each task's grants of a key come in order: their fences increase.
        let mut last: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        for (key, fence) in all {
            let before = last.insert(key.clone(), fence).unwrap_or(0);
            assert!(fence > before, "{key}: fence {fence} after {before}");
        }
    });
    assert_eq!(rows(&server, "holdfast_leases"), 0);
}
