//! PostgreSQL-specific behaviour against real servers: restarts and crashes
//! while locks are held, hostile keys, LISTEN/NOTIFY wake-ups and their cost,
//! expired-row takeover, listener reconnects, concurrent first use, plans
//! on an analysed table. TLS, poolers and server-side cancels are in
//! `postgres_connections.rs`.
#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use holdfast::backend::AcquireRequest;
use holdfast::{Client, Error, FenceDurability, LockKey, OwnerToken};
use holdfast_testkit::servers::postgres::PostgresServer;
use tokio::task::block_in_place;

use crate::postgres_common::{connect, psql};

/// A restart (fast shutdown + start) shorter than the TTL: the lease row
/// survives, renewal resumes after the reconnect, the holder never notices,
/// and fences keep increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_shorter_than_ttl_keeps_the_lease() {
    let mut server = PostgresServer::start_durable();
    let (a, b) = (connect(&server.url(), "a").await, connect(&server.url(), "b").await);
    let key = "restart/short";
    let ttl = Duration::from_secs(6);
    let g = a.mutex(key).ttl(ttl).acquire().await.expect("acquire");
    let fence = g.fence();
    let lost = g.lost();
    tokio::pin!(lost);
    let t = Instant::now();
    block_in_place(|| server.restart());
    let outage = t.elapsed();
    assert!(outage < ttl / 2, "restart took {outage:?}; the test needs it well inside the TTL");
    // Hold for more than a whole TTL after the restart: only resumed renewals keep it.
    tokio::select! {
        _ = &mut lost => panic!("lost() fired although the restart was shorter than the TTL"),
        _ = tokio::time::sleep(ttl + Duration::from_secs(1)) => {}
    }
    assert!(!g.is_lost());
    assert!(b.mutex(key).try_acquire().await.expect("try").is_none(), "key free while its holder renewed");
    let st = b.status(key).await.expect("status");
    assert_eq!(st.holder.map(|h| (h.fence, h.label)), Some((fence, "a".to_owned())));
    g.release().await.expect("release after the restart");
    let g2 = b.mutex(key).acquire_timeout(Duration::from_secs(5)).await.expect("acquire after release");
    assert!(g2.fence() > fence, "fence {} after {fence} across a restart", g2.fence());
    g2.release().await.expect("release");
}

/// An outage longer than the TTL: `lost()` fires on the client's own deadline
/// during the outage, before anyone can be granted the key; after the
/// restart the expired row is taken over with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outage_longer_than_ttl_fires_lost_before_regrant() {
    let mut server = PostgresServer::start_durable();
    let (a, b) = (connect(&server.url(), "a").await, connect(&server.url(), "b").await);
    let key = "restart/long";
    let ttl = Duration::from_millis(1500);
    let g = a.mutex(key).ttl(ttl).acquire().await.expect("acquire");
    let fence = g.fence();
    block_in_place(|| server.stop());
    let stopped = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), g.lost()).await.expect("lost() did not fire during the outage");
    let lost_at = Instant::now();
    assert!(lost_at - stopped <= ttl + Duration::from_secs(1), "lost() only after {:?}", lost_at - stopped);
    tokio::time::sleep((stopped + ttl * 2).saturating_duration_since(Instant::now())).await;
    block_in_place(|| server.start_again());
    let g2 = b.mutex(key).acquire_timeout(Duration::from_secs(10)).await.expect("take over after restart");
    assert!(lost_at < Instant::now());
    assert!(g2.fence() > fence, "fence {} after {fence}", g2.fence());
    assert!(matches!(g.release().await, Err(Error::Lost { .. })), "release of a lost lease must say Lost");
    assert!(b.mutex(key).try_acquire().await.expect("try").is_none(), "the stale release freed the new holder");
    g2.release().await.expect("release");
}

/// A crash (SIGKILL of the postmaster and its backends) with `fsync=on`:
/// committed lease rows and the fence counter come back by WAL recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_keeps_rows_and_fences() {
    let mut server = PostgresServer::start_durable();
    let (a, b) = (connect(&server.url(), "a").await, connect(&server.url(), "b").await);
    let key = "crash/k";
    // fsync=on and synchronous_commit=on: the store declares durable fences.
    assert_eq!(a.capabilities().fence_durability, FenceDurability::Durable);
    let mut last = 0;
    for _ in 0..5 {
        let g = a.mutex(key).acquire().await.expect("acquire");
        assert!(g.fence() > last);
        last = g.fence();
        g.release().await.expect("release");
    }
    let g = a.mutex(key).ttl(Duration::from_secs(20)).acquire().await.expect("hold");
    let held = g.fence();
    block_in_place(|| {
        server.kill9();
        server.start_again();
    });
    let st = b.status(key).await.expect("status after crash");
    assert_eq!(st.holder.map(|h| h.fence), Some(held), "the committed lease row did not survive the crash");
    assert!(b.mutex(key).try_acquire().await.expect("try").is_none());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!g.is_lost());
    g.release().await.expect("release after crash");
    let g2 = b.mutex(key).acquire().await.expect("acquire after crash");
    assert!(g2.fence() > held, "fence {} after {held} across a crash", g2.fence());
    g2.release().await.expect("release");
}

/// Keys with quotes, backslashes, LIKE wildcards, SQL and 256 bytes of text
/// are plain data; NUL and 257 bytes are rejected before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_keys_are_data() {
    let server = PostgresServer::start();
    let (a, b) = (connect(&server.url(), "a").await, connect(&server.url(), "b").await);
    // The fast test server has fsync=off: fences survive a server crash, not an OS crash.
    assert_eq!(a.capabilities().fence_durability, FenceDurability::ProcessCrash);
    let long_mixed: String = "'\"\\%_;".chars().cycle().take(256).collect();
    let long_multibyte: String = "é".repeat(128);
    let keys = [
        "it's".to_owned(),
        "\"double\"".to_owned(),
        "back\\slash\\".to_owned(),
        "100%".to_owned(),
        "_".to_owned(),
        "%".to_owned(),
        "'; DROP TABLE holdfast_leases; --".to_owned(),
        "$1".to_owned(),
        "E'\\x00'".to_owned(),
        "ünïcødé 🔒".to_owned(),
        "k".repeat(256),
        long_mixed,
        long_multibyte,
    ];
    let mut guards = Vec::new();
    for k in &keys {
        assert_eq!(k.len().min(256), k.len());
        let g = a.mutex(k.clone()).try_acquire().await.unwrap_or_else(|e| panic!("{k:?}: {e}"));
        guards.push(g.unwrap_or_else(|| panic!("{k:?} was busy: a wildcard or escape matched another key")));
    }
    for k in &keys {
        assert!(b.mutex(k.clone()).try_acquire().await.expect("try").is_none(), "{k:?} granted twice");
        let st = b.status(k).await.expect("status");
        assert_eq!(st.holder.map(|h| h.label), Some("a".to_owned()), "{k:?}");
    }
    // Wildcard neighbours are different keys.
    for other in ["1000", "x", "back\\slash", "100"] {
        let g = b.mutex(other).try_acquire().await.expect("try").expect("a neighbour of a wildcard key");
        g.release().await.expect("release");
    }
    // A release keeps the key's row (its fence), expired: count live rows.
    let live = "SELECT count(*) FROM holdfast_leases WHERE expires_at > clock_timestamp()";
    assert_eq!(psql(&server, live), keys.len().to_string());
    for g in guards {
        g.release().await.expect("release");
    }
    assert_eq!(psql(&server, live), "0", "release leaves no live rows");
    for bad in ["nul\0".to_owned(), "k".repeat(257), "é".repeat(129)] {
        assert!(matches!(a.mutex(bad).try_acquire().await, Err(Error::InvalidInput { what: "key", .. })));
    }
    // Hostile namespace names are refused, never quoted into SQL.
    for bad in ["schema=a%22b", "schema=x%3Bdrop", "table=Leases", "table=a.b", "schema=pg%20catalog"] {
        let url = format!("{}&{bad}", server.url());
        assert!(matches!(Client::connect(&url).await, Err(Error::InvalidInput { what: "url", .. })), "{bad}");
    }
}

fn acquire_calls(server: &PostgresServer) -> u64 {
    psql(server, "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE 'WITH cur AS%'")
        .parse()
        .expect("calls")
}

/// One release wakes one waiter through NOTIFY (the fallback poll is set to
/// 20 s, so only notifications can explain the hand-offs), and the number of
/// acquire statements per acquisition stays flat from 4 to 64 waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn notify_hands_off_one_waiter_per_release_with_flat_statements() {
    let server = PostgresServer::start_with_settings(&[("shared_preload_libraries", "pg_stat_statements")]);
    psql(&server, "CREATE EXTENSION pg_stat_statements");
    let url = format!("{}&poll_min_ms=20000&poll_max_ms=30000", server.url());
    let holder = connect(&url, "holder").await;
    let mut per_acquisition = Vec::new();
    for n in [4u32, 16, 64] {
        let waiters = connect(&url, "waiters").await;
        let key = format!("herd/{n}");
        let hold = holder.mutex(&key).ttl(Duration::from_secs(60)).acquire().await.expect("hold");
        let inside = Arc::new(AtomicU32::new(0));
        let granted = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::new();
        for _ in 0..n {
            let (c, key, inside, granted) = (waiters.clone(), key.clone(), inside.clone(), granted.clone());
            tasks.push(tokio::spawn(async move {
                let g = c.mutex(&key).ttl(Duration::from_secs(60)).acquire().await.expect("waiter");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                granted.fetch_add(1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.expect("waiter release");
            }));
        }
        // Every waiter has made its first (busy) attempt and parked.
        tokio::time::sleep(Duration::from_millis(500 + 10 * u64::from(n))).await;
        assert_eq!(granted.load(Ordering::SeqCst), 0);
        psql(&server, "SELECT pg_stat_statements_reset()");
        let released = Instant::now();
        hold.release().await.expect("release");
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(15), t)
                .await
                .expect("hand-off stalled: no wake-up")
                .expect("task");
        }
        let took = released.elapsed();
        assert_eq!(granted.load(Ordering::SeqCst), n);
        let calls = acquire_calls(&server);
        let per = calls as f64 / f64::from(n);
        eprintln!("{n} waiters: {calls} acquire statements for {n} hand-offs ({per:.2} each) in {took:?}");
        assert!(took < Duration::from_secs(15), "{n} hand-offs took {took:?}");
        per_acquisition.push(per);
    }
    let (first, last) = (per_acquisition[0], per_acquisition[per_acquisition.len() - 1]);
    assert!(last <= 2.0, "acquire statements per hand-off at 64 waiters: {last:.2}");
    assert!(last <= first * 1.5 + 0.25, "statements per acquisition grew with waiters: {per_acquisition:?}");
}

/// An uncontended acquire and release is two statements, and the acquire
/// is the short one: a task that has not met its key busy marks nothing
/// wanted, so the statement that plans and runs the marking (`w`, an index
/// scan and an update) is not sent. Counted by the server, like the Redis
/// store's command count per uncontended cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uncontended_acquire_and_release_statements() {
    let server = PostgresServer::start_with_settings(&[("shared_preload_libraries", "pg_stat_statements")]);
    psql(&server, "CREATE EXTENSION pg_stat_statements");
    let client = connect(&server.url(), "count").await;
    // Warm up: connections opened, statements prepared, the first sweep done.
    client.mutex("count").acquire().await.expect("acquire").release().await.expect("release");
    psql(&server, "SELECT pg_stat_statements_reset()");
    let n = 200u32;
    for i in 0..n {
        let key = if i % 2 == 0 { "count".to_owned() } else { format!("count/{i}") };
        let guard = client.mutex(key).acquire().await.expect("acquire");
        guard.release().await.expect("release");
    }
    let per = |filter: &str| -> f64 {
        let calls: f64 =
            psql(&server, &format!("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE {filter}"))
                .parse()
                .expect("calls");
        calls / f64::from(n)
    };
    // Renewals ("WITH r AS") run on their own schedule; none is due here.
    let lock = per("query LIKE '%holdfast_leases%' AND query NOT LIKE 'WITH r AS%'");
    let acquires = per("query LIKE 'WITH cur AS%'");
    let full = per("query LIKE 'WITH cur AS%' AND query LIKE '%), w AS (%'");
    eprintln!("per uncontended cycle: {lock} lock statements, {acquires} acquires, {full} of them the full statement");
    assert_eq!(lock, 2.0, "statements per uncontended acquire+release");
    assert_eq!(acquires, 1.0, "acquire statements per uncontended acquire");
    assert_eq!(full, 0.0, "an uncontended first attempt sent the statement that registers waiters");
}

/// An expired row is taken over atomically by the next acquirer (higher
/// fence, the same single row); the stale token can neither release nor
/// renew it; release leaves the row expired, keeping its fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_row_is_taken_over() {
    let server = PostgresServer::start();
    let (a, b) = (connect(&server.url(), "a").await, connect(&server.url(), "b").await);
    let key = LockKey::new("takeover/k").expect("key");
    let stale = OwnerToken::random();
    let req = AcquireRequest::new(key.clone(), stale, Duration::from_millis(300)).with_label("a");
    let raw = holdfast::stores::connect(&server.url()).await.expect("raw store connection");
    let first = raw.try_acquire(&req).await.expect("acquire").expect("granted");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // A mutex lease lives with its client's session row (see the store
    // page): the row is held until that row's expiry, or its own without one
    // or once released.
    let row = "SELECT count(*), bool_and(CASE WHEN session IS NULL OR token = '\\x' THEN expires_at ELSE coalesce(
                   (SELECT s.expires_at FROM holdfast_leases_sess s WHERE s.id = session), '-infinity') END
                   < clock_timestamp()) FROM holdfast_leases WHERE key = 'takeover/k'";
    assert_eq!(psql(&server, row), "1|t", "the expired row stays until taken over");
    let g = b.mutex(key.as_str()).try_acquire().await.expect("try").expect("expired key granted");
    assert!(g.fence() > first.fence);
    assert_eq!(psql(&server, row), "1|f", "takeover reuses the one row");
    assert_eq!(psql(&server, "SELECT fence FROM holdfast_leases WHERE key = 'takeover/k'"), g.fence().to_string());
    assert!(!raw.release(&key, stale).await.expect("stale release"));
    let renewed = raw
        .renew(&[holdfast::backend::RenewRequest { key: key.clone(), token: stale, ttl: Duration::from_secs(60) }])
        .await
        .expect("stale renew");
    assert_eq!(renewed, vec![false]);
    assert!(a.mutex(key.as_str()).try_acquire().await.expect("try").is_none(), "the stale token freed the key");
    let fence = g.fence();
    g.release().await.expect("release");
    assert_eq!(psql(&server, row), "1|t", "release keeps the row, expired");
    assert_eq!(psql(&server, "SELECT fence FROM holdfast_leases WHERE key = 'takeover/k'"), fence.to_string());
}

/// The listener's connection is killed and the key released while it is
/// down: the notification is lost, but the reconnected listener makes every
/// waiter look again, so the waiter is granted long before its 20 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listener_reconnects_and_rechecks() {
    let server = PostgresServer::start();
    let url = format!("{}&poll_min_ms=20000&poll_max_ms=30000", server.url());
    let a = connect(&url, "a").await;
    let b = connect(&format!("{url}&application_name=wb"), "b").await;
    let key = "listener/k";
    let g = a.mutex(key).ttl(Duration::from_secs(60)).acquire().await.expect("hold");
    let b2 = b.clone();
    let waiter = tokio::spawn(async move {
        let w = b2.mutex(key).ttl(Duration::from_secs(60)).acquire().await.expect("waiter");
        let at = Instant::now();
        w.release().await.expect("release");
        at
    });
    let listeners = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'wb-listener'";
    let deadline = Instant::now() + Duration::from_secs(10);
    while psql(&server, listeners) != "1" {
        assert!(Instant::now() < deadline, "the waiter's listener never connected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed = psql(
        &server,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'wb-listener'",
    );
    assert_eq!(killed, "1");
    let released = Instant::now();
    g.release().await.expect("release");
    let at = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("waiter stuck").expect("task");
    assert!(at - released < Duration::from_secs(5), "waiter granted {:?} after release", at - released);
    // And the listener is back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while psql(&server, listeners) != "1" {
        assert!(Instant::now() < deadline, "the listener did not reconnect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(b);
}

/// Many clients using a fresh namespace at once: table creation is
/// serialised by a transaction-scoped advisory lock, none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_use_creates_tables_once() {
    let server = PostgresServer::start();
    let url = format!("{}&schema=fresh_ns&table=jobs", server.url());
    let mut joins = Vec::new();
    for i in 0..8 {
        let url = url.clone();
        joins.push(tokio::spawn(async move { Client::connect(&url).await.map(|c| (i, c)) }));
    }
    let mut clients = Vec::new();
    for j in joins {
        clients.push(j.await.expect("task").expect("concurrent first use failed"));
    }
    let (_, c) = &clients[0];
    let g = c.mutex("k").acquire().await.expect("acquire");
    assert_eq!(psql(&server, "SELECT count(*) FROM fresh_ns.jobs"), "1");
    assert_eq!(psql(&server, "SELECT value FROM fresh_ns.jobs_fence WHERE id = 1"), g.fence().to_string());
    g.release().await.expect("release");
    // Another namespace on the same database has its own rows and counter.
    let other = connect(&format!("{}&schema=fresh_ns&table=other", server.url()), "o").await;
    let g = other.mutex("k").acquire().await.expect("same key, other namespace");
    assert_eq!(g.fence(), 1);
    g.release().await.expect("release");
    // create=false on a missing namespace: a clear, non-retryable error.
    match Client::connect(&format!("{}&table=missing&create=false", server.url())).await {
        Err(Error::Backend { retryable: false, .. }) => {}
        other => panic!("expected a Backend error, got {:?}", other.map(|_| ())),
    }
}

/// A lease table emptied and analysed (what autovacuum does after a burst)
/// must not leave named statements with a cached sequential-scan plan: on
/// main each of 5,000 acquisitions then scanned the whole table (issue 15:
/// O(N^2) acquisition, leases lost at 100k). Counted from
/// `pg_stat_user_tables`, which a server process flushes when it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statements_keep_the_index_after_the_table_was_analysed_empty() {
    let server = PostgresServer::start();
    let url = format!("{}&prepared=true&pool_size=2", server.url());
    let setup = connect(&url, "setup").await;
    setup.mutex("setup").try_acquire().await.unwrap().unwrap().release().await.unwrap();
    drop(setup);
    psql(&server, "DELETE FROM holdfast_leases; ANALYZE holdfast_leases;");
    let scans = |server: &PostgresServer| -> u64 {
        let out = psql(server, "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'holdfast_leases'");
        out.trim().parse().unwrap_or_else(|_| panic!("seq_scan: {out:?}"))
    };
    let before = scans(&server);
    let client = connect(&url, "many").await;
    let n = 5_000;
    let mut guards = Vec::with_capacity(n);
    for i in 0..n {
        guards.push(client.mutex(format!("k/{i}")).try_acquire().await.unwrap().expect("a fresh key is free"));
    }
    for g in guards {
        g.release().await.unwrap();
    }
    drop(client);
    // Server processes flush their counters as they exit: wait until only
    // this psql session is left.
    for _ in 0..100 {
        let sessions = psql(&server, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'");
        if sessions == "1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = scans(&server);
    let scanned = after - before;
    eprintln!("{scanned} sequential scans for {n} acquisitions and releases");
    // A cached generic sequential-scan plan scans on every statement (10,000).
    assert!(scanned < 100, "{scanned} sequential scans for {n} acquisitions and releases");
}
