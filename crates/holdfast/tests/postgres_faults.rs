//! PostgreSQL faults beyond the conformance suite. Behind a
//! transaction-pooling PgBouncer without prepared statement support (1.18,
//! as the testkit runs it), with the default URL: named prepared statements
//! are session state, and a pooler that moves a client between server
//! sessions can make it run a statement that another session prepared under
//! the same name. Also the cost of each statement mode, and waiters on a
//! server that dies.
#![cfg(feature = "postgres")]

use std::time::{Duration, Instant};

use holdfast::backend::{AcquireRequest, Backend};
use holdfast::{Client, Error, LockKey, OwnerToken};
use holdfast_testkit::servers::postgres::{PgBouncer, PostgresServer};
use tokio::task::block_in_place;
use tokio_postgres::NoTls;

use crate::postgres_common::psql;

/// Statement names tokio-postgres gives the statements it prepares ("s0",
/// "s1", ... from a counter per process) that a foreign session claims: far
/// more than this test binary prepares.
const FOREIGN_NAMES: usize = 2000;

fn request(key: &str) -> AcquireRequest {
    AcquireRequest::new(LockKey::new(key).expect("key"), OwnerToken::random(), Duration::from_secs(30))
        .with_label("pooled")
}

/// A plain session through the pooler, to pin one of its two server
/// connections inside an open transaction.
async fn session(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect through the pooler");
    tokio::spawn(connection);
    client
}

/// Another application's session on the pooler's first server connection
/// has prepared statements under the names tokio-postgres uses, with the
/// parameter types of holdfast's acquire. The holdfast client (default URL)
/// first runs while that connection is pinned, so it prepares its acquire
/// on the second one; then the second is pinned and the first is free, so
/// its next acquire lands where the name means the other application's
/// statement. With named statements it runs that statement (here: an insert
/// into another table); the default must never send a named statement
/// through a pooler it cannot trust with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_url_never_runs_another_sessions_statement_behind_a_pooler() {
    let server = PostgresServer::start();
    let bouncer = PgBouncer::start(&server);
    psql(&server, "CREATE TABLE foreign_writes (key text)");
    let plain = bouncer.url();
    let first = session(&plain).await;
    let mut plant = String::from("BEGIN;");
    for n in 0..FOREIGN_NAMES {
        plant.push_str(&format!(
            "PREPARE s{n}(text, bytea, int8, text, bool, bool) AS INSERT INTO foreign_writes VALUES ($1);"
        ));
    }
    first.batch_execute(&plant).await.expect("prepare the other application's statements");
    // The first server connection stays pinned by the open transaction.
    let store = holdfast::stores::connect(&format!("{}&schema=pooled", bouncer.url())).await.expect("open");
    let req = request("pooled/k");
    let grant = store.try_acquire(&req).await.expect("acquire on the second server connection");
    assert!(grant.is_some());
    assert!(store.release(&req.key, req.token).await.expect("release"));
    // Pin the second server connection, free the first.
    let second = session(&plain).await;
    second.batch_execute("BEGIN; SELECT 1").await.expect("pin the second server connection");
    first.batch_execute("COMMIT").await.expect("commit");
    let req = request("pooled/k");
    let outcome = store.try_acquire(&req).await;
    second.batch_execute("COMMIT").await.expect("commit");
    let foreign: i64 = psql(&server, "SELECT count(*) FROM foreign_writes").parse().expect("count");
    assert_eq!(foreign, 0, "holdfast ran another session's prepared statement ({foreign} rows written)");
    assert!(outcome.expect("acquire on the first server connection").is_some(), "the key was free");
    assert!(store.release(&req.key, req.token).await.expect("release"));
}

/// Acquires and releases `key` `cycles` times, one attempt each (the key is
/// always free); returns the mean time of one cycle.
async fn cycles(store: &dyn Backend, key: &str, cycles: u32) -> Duration {
    let started = Instant::now();
    for _ in 0..cycles {
        let req = request(key);
        assert!(store.try_acquire(&req).await.expect("acquire").is_some(), "{key} was busy");
        assert!(store.release(&req.key, req.token).await.expect("release"));
    }
    started.elapsed() / cycles
}

/// The default keeps the fast path where it is safe: on a direct connection
/// the server log shows holdfast's acquire executed as a named statement;
/// through the pooler only as the unnamed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_url_names_statements_only_on_direct_connections() {
    let server = PostgresServer::start_with_settings(&[("log_statement", "all")]);
    let bouncer = PgBouncer::start(&server);
    for (url, schema) in [(server.url(), "direct"), (bouncer.url(), "pooled")] {
        let store = holdfast::stores::connect(&format!("{url}&schema={schema}")).await.expect("open");
        cycles(store.as_ref(), "named/k", 5).await;
    }
    let log = std::fs::read_to_string(server.dir().join(format!("pg-{}.log", std::process::id()))).expect("log");
    // One entry per logged statement; an acquire names its table on its second line.
    let acquires = |schema: &str, named: bool| {
        let prefix = if named { "execute s" } else { "execute <unnamed>" };
        log.split("LOG:  ")
            .filter(|e| {
                e.starts_with(prefix) && e.split_once(": ").is_some_and(|(_, sql)| sql.starts_with("WITH cur AS"))
            })
            .filter(|e| e.contains(&format!("FROM \"{schema}\".\"holdfast_leases\"")))
            .count()
    };
    assert_eq!(acquires("direct", true), 5, "direct acquires by name");
    assert_eq!(acquires("direct", false), 0, "direct acquires unnamed");
    assert_eq!(acquires("pooled", true), 0, "named acquires through the pooler");
    assert_eq!(acquires("pooled", false), 5, "unnamed acquires through the pooler");
}

/// The cost of each statement mode: an uncontended one-attempt acquire and
/// its release, 2000 cycles, on a direct connection and through the pooler,
/// with the default (named statements direct, the unnamed statement through
/// the pooler) and with the mode forced. Prints the figures; run with
/// `--nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_cycle_time_by_statement_mode() {
    let server = PostgresServer::start();
    let bouncer = PgBouncer::start(&server);
    let mut figures = Vec::new();
    for (mode, url) in [
        ("direct, default", server.url()),
        ("direct, prepared=false", format!("{}&prepared=false", server.url())),
        ("pooler, default", bouncer.url()),
        ("pooler, prepared=true", format!("{}&prepared=true", bouncer.url())),
    ] {
        let store = holdfast::stores::connect(&url).await.expect("open");
        cycles(store.as_ref(), "cycle/k", 200).await; // warm-up
        figures.push((mode, cycles(store.as_ref(), "cycle/k", 2000).await));
    }
    for (mode, per) in &figures {
        eprintln!("try_acquire+release, {mode}: {:.0} µs per cycle", per.as_secs_f64() * 1e6);
    }
}

/// Waiters on a held key while the server dies (SIGKILL of every server
/// process), woken by the listener's loss or by their poll: `acquire_timeout`
/// fails with the store's error (`Error::Backend`, exit 69 in the CLI) soon
/// after, not with `Error::Timeout` ("busy", exit 75) at its deadline, and a
/// waiting `acquire` does not wait forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiter_on_a_dying_server_gets_the_store_error() {
    for (label, options) in [("listening", "&op_timeout_ms=1000"), ("polling", "&op_timeout_ms=1000&listen=off")] {
        let mut server = PostgresServer::start();
        let url = format!("{}{options}", server.url());
        let a = Client::connect(&url).await.expect("connect");
        let b = Client::connect(&url).await.expect("connect");
        let guard = a.mutex("dying/key").ttl(Duration::from_secs(60)).acquire().await.expect("hold");
        let (b1, b2) = (b.clone(), b.clone());
        let bounded = tokio::spawn(async move { b1.mutex("dying/key").acquire_timeout(Duration::from_secs(8)).await });
        let unbounded = tokio::spawn(async move { b2.mutex("dying/key").acquire().await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !bounded.is_finished() && !unbounded.is_finished(),
            "{label}: a waiter returned while the key was held"
        );
        block_in_place(|| server.kill9());
        let killed = Instant::now();
        for (what, waiter) in [("acquire_timeout", bounded), ("acquire", unbounded)] {
            let outcome = tokio::time::timeout(Duration::from_secs(15), waiter)
                .await
                .unwrap_or_else(|_| panic!("{label}: {what} still waits {:?} after the server died", killed.elapsed()))
                .expect("task");
            match outcome {
                Err(Error::Backend { .. }) => {}
                Err(e) => panic!("{label}: {what} on a dead server: {e:?}, not the store's error"),
                Ok(_) => panic!("{label}: {what} granted by a dead server"),
            }
        }
        drop(guard);
    }
}

/// A dropped acquire cancels nothing else. Statements of other keys share
/// its connection, and the release that cleans up after it runs right
/// behind it there; a cancel request sent to the server for the dropped
/// statement cancelled whatever the connection ran when it arrived: another
/// key's acquire or release (an error for a call that had nothing to do with
/// it), or that very release (which then left the key held until its TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_acquire_cancels_nothing_else() {
    let server = PostgresServer::start();
    let url = server.url();
    let client = Client::connect(&url).await.expect("connect");
    let stop = Instant::now() + Duration::from_secs(3);
    let mut busy = Vec::new();
    for t in 0..16 {
        let c = client.clone();
        busy.push(tokio::spawn(async move {
            let mut cycles = 0u32;
            while Instant::now() < stop {
                let g = c.mutex(format!("busy/{t}")).try_acquire().await?.expect("its own key is free");
                g.release().await?;
                cycles += 1;
            }
            Ok::<_, Error>(cycles)
        }));
    }
    // Meanwhile, acquires of fresh keys dropped after 0.1 to 1 ms: some
    // before their statement was sent, some while it ran, some after.
    let mut dropped = 0u32;
    while Instant::now() < stop {
        let after = Duration::from_micros(100 + u64::from(dropped % 10) * 100);
        let _ = tokio::time::timeout(after, client.mutex(format!("dropped/{dropped}")).try_acquire()).await;
        dropped += 1;
    }
    for b in busy {
        let cycles = b.await.expect("task").expect("a call on another key failed");
        assert!(cycles > 0);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let other = Client::connect(&url).await.expect("connect");
    let mut held = Vec::new();
    for i in 0..dropped {
        match other.mutex(format!("dropped/{i}")).try_acquire().await.expect("try_acquire") {
            Some(g) => g.release().await.expect("release"),
            None => held.push(i),
        }
    }
    assert!(held.is_empty(), "{} of {dropped} dropped acquires left their key held: {held:?}", held.len());
}
