//! Per-key fences on PostgreSQL (issue 33 item 4; model `pg_fence`): a
//! key's fence lives in its lease row, which a release keeps; only a key
//! without a row draws from the namespace counter (row 1 of
//! `<table>_fence`), and the sweep raises that counter to what it deletes.
//! Fences of a key increase across release, expiry, the sweep, and shares
//! after an exclusive grant and back; the old layout's statements, run by
//! hand as an earlier client would send them, are refused where they would
//! draw from the old counter, and their deletes keep the fence.
#![cfg(feature = "postgres")]

use std::cell::Cell;
use std::process::Command;
use std::time::Duration;

use holdfast::backend::AcquireRequest;
use holdfast::{Client, Error, LockKey, OwnerToken};
use holdfast_testkit::servers::postgres::PostgresServer;
use tokio::task::block_in_place;

use crate::postgres_common::{connect, psql};

/// `sql` run by psql: its output, or its error text.
fn psql_result(server: &PostgresServer, sql: &str) -> Result<String, String> {
    let out = block_in_place(|| {
        Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &server.port().to_string(), "-U", "postgres", "-d", "postgres"])
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .expect("run psql")
    });
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn counter(server: &PostgresServer) -> u64 {
    psql(server, "SELECT value FROM holdfast_leases_fence WHERE id = 1").parse().expect("counter")
}

fn row_fence(server: &PostgresServer, key: &str) -> Option<u64> {
    let out = psql(server, &format!("SELECT fence FROM holdfast_leases WHERE key = '{key}'"));
    (!out.is_empty()).then(|| out.parse().expect("fence"))
}

/// Makes every row of `key` look released or expired two minutes ago, so
/// that the next sweep deletes it.
fn age(server: &PostgresServer, key: &str) {
    psql(
        server,
        &format!(
            "UPDATE holdfast_leases SET expires_at = clock_timestamp() - interval '2 minutes' WHERE key = '{key}'"
        ),
    );
}

/// A new client's first release sweeps (then at most once a minute).
async fn sweep(server: &PostgresServer) {
    let c = connect(&server.url(), "sweeper").await;
    c.mutex("sweep/trigger").acquire().await.expect("acquire").release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fences_increase_across_release_expiry_sweep_and_shares() {
    let server = PostgresServer::start();
    let a = connect(&server.url(), "a").await;
    let key = "fences/k";
    let last = Cell::new(0);
    let check = |what: &str, fence: u64| {
        assert!(fence > last.get(), "{what}: fence {fence} after {}", last.get());
        last.set(fence);
    };
    // Release keeps the row: a reused key never touches the counter.
    let g = a.mutex(key).acquire().await.expect("acquire");
    check("first grant", g.fence());
    g.release().await.expect("release");
    let before = counter(&server);
    for i in 0..5 {
        let g = a.mutex(key).acquire().await.expect("acquire");
        check(&format!("reuse {i}"), g.fence());
        g.release().await.expect("release");
    }
    assert_eq!(counter(&server), before, "grants of a key with a row drew from the counter");
    assert_eq!(row_fence(&server, key), Some(last.get()), "the released row keeps the fence");
    // Expiry: a lease left to run out is taken over above it.
    let raw = holdfast::stores::connect(&server.url()).await.expect("raw store");
    let req = AcquireRequest::new(LockKey::new(key).expect("key"), OwnerToken::random(), Duration::from_millis(300));
    let expired = raw.try_acquire(&req).await.expect("acquire").expect("granted");
    check("grant left to expire", expired.fence);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let g = a.mutex(key).try_acquire().await.expect("try").expect("expired, so free");
    check("after expiry", g.fence());
    g.release().await.expect("release");
    // The sweep deletes the row and raises the counter to its fence; the
    // key seen again draws from the counter, above it.
    age(&server, key);
    sweep(&server).await;
    assert_eq!(row_fence(&server, key), None, "the sweep did not delete the aged row");
    assert!(counter(&server) >= last.get(), "the sweep left the counter {} below {}", counter(&server), last.get());
    let g = a.mutex(key).acquire().await.expect("acquire");
    check("after the sweep", g.fence());
    g.release().await.expect("release");
    // Shares after an exclusive grant, an exclusive after shares, and a
    // writer: each above everything before.
    let rw = a.rwlock(key);
    let r1 = rw.read().acquire().await.expect("read");
    check("a read share", r1.fence());
    let r2 = rw.read().acquire().await.expect("read");
    check("a second read share", r2.fence());
    r1.release().await.expect("release");
    r2.release().await.expect("release");
    let w = rw.write().acquire().await.expect("write");
    check("a writer", w.fence());
    w.release().await.expect("release");
    let g = a.mutex(key).acquire().await.expect("acquire");
    check("exclusive after shares", g.fence());
    g.release().await.expect("release");
    let p = a.semaphore("fences/sem", 2).acquire_many(1).await.expect("permit");
    let sem_first = p.fence();
    p.release().await.expect("release");
    // The gate row deleted (as the sweep or an old client would): the next
    // share's gate row draws from the counter, which the delete raised.
    psql(&server, "DELETE FROM holdfast_leases WHERE key = 'fences/sem'");
    let p = a.semaphore("fences/sem", 2).acquire_many(1).await.expect("permit");
    assert!(p.fence() > sem_first, "a share after its gate row went: {} after {sem_first}", p.fence());
    p.release().await.expect("release");
    // A force release keeps the row too.
    let g = a.mutex(key).acquire().await.expect("acquire");
    check("before force release", g.fence());
    a.force_release(key).await.expect("force");
    assert_eq!(row_fence(&server, key), Some(last.get()));
    let b = connect(&server.url(), "b").await;
    let g2 = b.mutex(key).acquire().await.expect("acquire");
    check("after force release", g2.fence());
    g2.release().await.expect("release");
    drop(g);
}

/// Today's statements as an earlier client sends them (`statements.rs` and
/// `shares.rs` before per-key fences), with literals for the parameters.
const OLD_ACQUIRE: &str = "WITH cur AS (
         SELECT token, fence, expires_at, wanted FROM holdfast_leases
         WHERE key = 'old/k' AND expires_at > clock_timestamp()
     ), f AS (
         UPDATE holdfast_leases_fence SET value = greatest(value + 1, 0::int8)
         WHERE id = 0 AND NOT EXISTS (SELECT 1 FROM cur)
         RETURNING value
     ), ins AS (
         INSERT INTO holdfast_leases AS l (key, token, fence, label, acquired_at, expires_at, wanted)
         SELECT 'old/k', '\\x0101'::bytea, f.value, 'old', clock_timestamp(),
                clock_timestamp() + interval '10 seconds', false
         FROM f
         ON CONFLICT (key) DO UPDATE
             SET token = excluded.token, fence = excluded.fence, label = excluded.label,
                 acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, wanted = excluded.wanted
             WHERE l.expires_at <= clock_timestamp()
         RETURNING l.fence
     )
     SELECT (SELECT fence FROM ins)";
const OLD_FENCE_NEXT: &str = "UPDATE holdfast_leases_fence SET value = value + 1 WHERE id = 0 RETURNING value";
const OLD_RELEASE: &str = "DELETE FROM holdfast_leases WHERE key = 'old/k' AND token = '\\x0101'::bytea";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_old_layout_client_is_refused_and_its_deletes_keep_fences() {
    let server = PostgresServer::start();
    let a = connect(&server.url(), "a").await;
    let key = "old/k";
    // The key's row runs ahead of the counter.
    let mut last = 0;
    for _ in 0..4 {
        let g = a.mutex(key).acquire().await.expect("acquire");
        assert!(g.fence() > last);
        last = g.fence();
        g.release().await.expect("release");
    }
    assert!(counter(&server) < last, "the row's fence did not run ahead of the counter");
    // The old acquire finds the key free and draws from the old counter:
    // refused, loudly, and nothing changed.
    let err = psql_result(&server, OLD_ACQUIRE).expect_err("the old acquire ran");
    assert!(err.contains("per-key fences") && err.contains("upgrade"), "{err}");
    assert_eq!(row_fence(&server, key), Some(last));
    let err = psql_result(&server, OLD_FENCE_NEXT).expect_err("the old shares' fence_next ran");
    assert!(err.contains("per-key fences"), "{err}");
    // An old client that held the key from before (its row written as the
    // old layout wrote it) releases with DELETE: the counter rises to the
    // row's fence, and the next grant is above it.
    let g = a.mutex(key).acquire().await.expect("acquire");
    last = g.fence();
    psql(&server, &format!("UPDATE holdfast_leases SET token = '\\x0101'::bytea WHERE key = '{key}'"));
    psql(&server, OLD_RELEASE);
    assert_eq!(row_fence(&server, key), None);
    assert!(counter(&server) >= last, "the old release left the counter {} below {last}", counter(&server));
    drop(g);
    let g = a.mutex(key).acquire().await.expect("acquire after the old release");
    assert!(g.fence() > last, "fence {} after {last}", g.fence());
    g.release().await.expect("release");
    // A new client interleaved with old statements on a busy key: the old
    // acquire sees a live holder and draws nothing (no error, no grant).
    let g = a.mutex(key).acquire().await.expect("acquire");
    assert_eq!(psql_result(&server, OLD_ACQUIRE).expect("busy: nothing drawn"), "");
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_of_the_old_layout_is_migrated_or_named() {
    let server = PostgresServer::start();
    // The old layout, as an earlier version created it, with a held row.
    psql(
        &server,
        "CREATE SCHEMA old;
         CREATE TABLE old.holdfast_leases (
             key text PRIMARY KEY, token bytea NOT NULL, fence bigint NOT NULL, label text NOT NULL,
             acquired_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
             wanted boolean NOT NULL DEFAULT false) WITH (fillfactor = 80);
         CREATE TABLE old.holdfast_leases_fence (id integer PRIMARY KEY CHECK (id = 0), value bigint NOT NULL);
         INSERT INTO old.holdfast_leases_fence VALUES (0, 41);
         CREATE TABLE old.holdfast_leases_shares (
             key text NOT NULL, token bytea NOT NULL, mode smallint NOT NULL, weight bigint NOT NULL,
             limit_n bigint NOT NULL, held boolean NOT NULL, fence bigint NOT NULL, label text NOT NULL,
             acquired_at timestamptz NOT NULL, expires_at timestamptz NOT NULL, PRIMARY KEY (key, token));
         CREATE TABLE old.holdfast_leases_records (key text PRIMARY KEY, value bigint NOT NULL);
         INSERT INTO old.holdfast_leases VALUES
             ('m/k', '\\x0202'::bytea, 41, 'old', clock_timestamp(), clock_timestamp() - interval '1 second', false);",
    );
    let base = format!("{}&schema=old", server.url());
    match Client::connect(&format!("{base}&create=false")).await {
        Err(e @ Error::Backend { retryable: false, .. }) => {
            let text = e.to_string();
            assert!(text.contains("per-key fences") && text.contains("Migration"), "{text}");
        }
        other => panic!("create=false on the old layout: expected a Backend error, got {:?}", other.map(|_| ())),
    }
    let c = connect(&base, "new").await;
    assert_eq!(psql(&server, "SELECT value FROM old.holdfast_leases_fence WHERE id = 1"), "41");
    let g = c.mutex("m/k").acquire().await.expect("acquire the expired row");
    assert!(g.fence() > 41, "fence {} on a row of fence 41", g.fence());
    g.release().await.expect("release");
    let g = c.mutex("m/other").acquire().await.expect("a key without a row");
    assert!(g.fence() > 41, "fence {} from a counter at 41", g.fence());
    g.release().await.expect("release");
    // The migration ran once: a second client finds it done (create=false works).
    let d = connect(&format!("{base}&create=false"), "d").await;
    d.mutex("m/k").acquire().await.expect("acquire").release().await.expect("release");
}

/// A namespace in use that lacks only its records table (made before
/// records existed) gets it, and the functions of shared leases, from the
/// first client with `create` (the default) without a lock on the tables
/// in use: the whole DDL's `ALTER TABLE` waited for every open transaction
/// on the lease table, and every other client's statement queued behind it
/// (with live traffic, the whole DDL deadlocked with other clients'
/// statements, SQLSTATE 40P01). Here another session keeps a transaction
/// open on the lease table while the new client connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_in_use_gets_its_records_table_without_a_table_lock() {
    let server = PostgresServer::start();
    let url = server.url();
    let a = connect(&url, "a").await;
    let held = a.mutex("in-use/held").acquire().await.expect("a held lease");
    psql(&server, "DROP TABLE holdfast_leases_records; DROP FUNCTION holdfast_leases_share");
    let (open, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("a plain session");
    tokio::spawn(connection);
    open.batch_execute("BEGIN; SELECT 1 FROM holdfast_leases WHERE key = 'in-use/held' FOR UPDATE")
        .await
        .expect("an open transaction on the lease table");
    let connecting = tokio::time::timeout(Duration::from_secs(3), Client::connect(&url)).await;
    let b = connecting
        .expect("the connect waited for a transaction open on the lease table")
        .unwrap_or_else(|e| panic!("connect to a namespace in use without its records table: {e}"));
    let count = "SELECT count(*) FROM pg_proc WHERE proname IN ('holdfast_leases_gate', 'holdfast_leases_share')";
    assert_eq!(psql(&server, count), "2", "the functions of shared leases were added");
    assert_eq!(psql(&server, "SELECT to_regclass('holdfast_leases_records') IS NOT NULL"), "t");
    // Other clients' statements went on meanwhile: a's lock work is not stalled.
    let g = tokio::time::timeout(Duration::from_secs(3), a.mutex("in-use/other").acquire())
        .await
        .expect("a's acquire waited behind the connect")
        .expect("acquire");
    g.release().await.expect("release");
    open.batch_execute("COMMIT").await.expect("commit");
    let p = b.semaphore("in-use/permits", 2).acquire().await.expect("a permit through the functions");
    p.release().await.expect("release");
    held.release().await.expect("release");
}
