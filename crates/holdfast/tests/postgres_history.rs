//! PostgreSQL on a database with a history: what must stay true once the
//! lease tables have served other lock work and autovacuum has analysed
//! them (issue 34). The rest of the store's own tests are in `postgres.rs`,
//! `postgres_connections.rs`, `postgres_faults.rs` and `postgres_fences.rs`.
#![cfg(feature = "postgres")]

use std::time::{Duration, Instant};

use futures::StreamExt;
use holdfast::{Client, MutexGuard};
use holdfast_testkit::servers::postgres::PostgresServer;
use tokio::task::block_in_place;

use crate::postgres_common::connect;

/// Mutex, semaphore and read-write lock cycles on one client, 8 tasks of
/// each at once: every cycle inserts and deletes rows of the lease and shares
/// tables, as a database serving other locks all day does. Leaves the tables
/// many pages long with (almost) no live rows.
async fn churn(client: &Client, cycles: usize) {
    let limit = Duration::from_secs(30);
    let mut tasks = Vec::new();
    for t in 0..8 {
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..cycles {
                let g = c.mutex(format!("churn/mutex/{t}/{i}")).acquire_timeout(limit).await.expect("mutex");
                g.release().await.expect("mutex release");
            }
        }));
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..cycles / 4 {
                let p = c.semaphore("churn/semaphore", 3).acquire_timeout(limit).await.expect("permit");
                p.release().await.expect("permit release");
            }
        }));
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..cycles / 4 {
                let lock = c.rwlock("churn/rwlock");
                if i % 5 == 0 {
                    lock.write().acquire_timeout(limit).await.expect("write").release().await.expect("write release");
                } else {
                    lock.read().acquire_timeout(limit).await.expect("read").release().await.expect("read release");
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("churn task");
    }
}

/// Issue 34: on a database whose lease tables other lock work had churned
/// and autovacuum had then analysed (1 live row in thousands of pages), the
/// planner took the lease table for a one-row table. Each renew statement
/// then read the whole table (a hash of every row, or, once the named
/// statement went to its generic plan, every row against every key of the
/// batch: 10 s per call at 100k rows), renewal fell behind its deadlines and
/// every held lease was lost on a healthy, idle server. Renewal must find its
/// rows by key whatever the statistics say: 10,000 leases with a 6 s TTL
/// (renewed every 2 s) held for three renewal periods on such a database,
/// none lost, every release finds its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewal_keeps_every_lease_after_mutex_semaphore_and_rwlock_churn() {
    const LEASES: usize = 10_000;
    let server = PostgresServer::start();
    let url = server.url();
    let started = Instant::now();
    let churner = connect(&url, "churn").await;
    churn(&churner, 400).await;
    drop(churner);
    // What the next minute does (done here at once): a client's sweep
    // deletes the expired gate rows the shares left, and autovacuum analyses
    // the churned tables, now empty in many pages.
    block_in_place(|| {
        server.psql(
            "DELETE FROM holdfast_leases WHERE expires_at < clock_timestamp();
             ANALYZE holdfast_leases; ANALYZE holdfast_leases_shares",
        )
    });
    let stats = block_in_place(|| {
        server.psql("SELECT reltuples::int8, relpages FROM pg_class WHERE relname = 'holdfast_leases'")
    });
    eprintln!("after {:?} of churn: holdfast_leases reltuples|relpages = {stats}", started.elapsed());

    let ttl = Duration::from_secs(6);
    let holder = connect(&url, "holder").await;
    let acquired = Instant::now();
    let guards: Vec<MutexGuard> = futures::stream::iter(0..LEASES)
        .map(|i| {
            let lock = holder.mutex(format!("held/{i}")).ttl(ttl);
            async move { lock.acquire_timeout(Duration::from_secs(30)).await.expect("acquire a fresh key") }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    eprintln!("{LEASES} leases acquired in {:?}", acquired.elapsed());
    // The hold itself: three renewal periods, every lease renewed three times.
    tokio::time::sleep(ttl).await;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let released = Instant::now();
    let failed: Vec<String> = futures::stream::iter(guards)
        .map(|g| async move { g.release().await.err().map(|e| e.to_string()) })
        .buffer_unordered(64)
        .filter_map(|e| async move { e })
        .collect()
        .await;
    eprintln!("released in {:?}; {lost} lost, {} releases failed", released.elapsed(), failed.len());
    assert_eq!(lost, 0, "{lost} of {LEASES} held leases lost on a churned, analysed database");
    assert!(failed.is_empty(), "{} of {LEASES} releases failed, e.g. {}", failed.len(), failed[0]);
}

/// A new namespace, before its shares table is first analysed (its first
/// minute, or longer until autovacuum comes): the functions of shared
/// leases must read a key's shares without walking the ones released
/// before. Their plan made without statistics was a bitmap scan, which
/// never marks a released share's index entry dead, so each call read
/// every share the key ever had (1,350 permits a second against 3,800 once
/// analysed); a plain index scan marks them as it passes. 2,000 permit
/// cycles on one key, then one call of the gate function (which reads the
/// key's held shares), alone on the server: it reads a few index entries or
/// heap rows of the shares table, not about 2,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_namespace_reads_a_keys_shares_without_walking_its_released_ones() {
    const CYCLES: usize = 2_000;
    let server = PostgresServer::start();
    let url = server.url();
    let psql = |sql: &str| block_in_place(|| server.psql(sql));
    let c = connect(&url, "cycles").await;
    // Kept as autovacuum leaves it for a minute or so: never analysed.
    psql("ALTER TABLE holdfast_leases_shares SET (autovacuum_enabled = false)");
    let semaphore = c.semaphore("fresh/permits", 1);
    for _ in 0..CYCLES {
        semaphore.acquire().await.expect("permit").release().await.expect("release");
    }
    assert_eq!(psql("SELECT reltuples::int8 FROM pg_class WHERE relname = 'holdfast_leases_shares'"), "-1");
    drop((semaphore, c));
    alone(&server).await;
    let read = "SELECT (SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'holdfast_leases_shares_pkey')
                     + (SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables WHERE relname = 'holdfast_leases_shares')";
    let before: i64 = psql(read).parse().expect("a count");
    psql("SELECT holdfast_leases_gate('fresh/permits', 'none'); SELECT pg_stat_force_next_flush()");
    let after: i64 = psql(read).parse().expect("a count");
    eprintln!("one call of the gate function after {CYCLES} permits read {} entries or rows", after - before);
    assert!(
        after - before < 100,
        "one call read {} entries or rows of the key's {CYCLES} released shares",
        after - before
    );
}

/// Functions of shared leases made by an earlier version (without the
/// setting above): a `create=false` client uses them as they are, and the
/// next client with `create` (the default) replaces them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_functions_of_an_earlier_version_are_replaced_by_the_next_client_with_create() {
    let server = PostgresServer::start();
    let url = server.url();
    let psql = |sql: &str| block_in_place(|| server.psql(sql));
    drop(connect(&url, "setup").await);
    let set = "SELECT count(*) FROM pg_proc WHERE proname IN ('holdfast_leases_gate', 'holdfast_leases_share')
               AND 'enable_bitmapscan=off' = ANY(proconfig)";
    assert_eq!(psql(set), "2", "a new namespace's functions");
    psql(
        "ALTER FUNCTION holdfast_leases_gate RESET ALL; ALTER FUNCTION holdfast_leases_share RESET ALL;
         ALTER DATABASE postgres SET track_functions = 'pl'",
    );
    let old = connect(&format!("{url}&create=false"), "old").await;
    assert_eq!(psql(set), "0", "create=false changes nothing");
    let p = old.semaphore("earlier/permits", 2).acquire().await.expect("a permit with the earlier functions");
    p.release().await.expect("release");
    drop(old);
    alone(&server).await;
    let calls = "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = 'holdfast_leases_share'";
    assert_ne!(psql(calls), "0", "the create=false client did not use the functions it found");
    let new = connect(&url, "new").await;
    assert_eq!(psql(set), "2", "the next client with create replaced them");
    let p = new.semaphore("earlier/permits", 2).acquire().await.expect("a permit");
    p.release().await.expect("release");
}

/// Waits until no other client is connected to `server` (their statistics
/// flushed as their backends exit).
async fn alone(server: &PostgresServer) {
    let others =
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()";
    let deadline = Instant::now() + Duration::from_secs(10);
    while block_in_place(|| server.psql(others)) != "0" {
        assert!(Instant::now() < deadline, "the clients' connections did not close");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
