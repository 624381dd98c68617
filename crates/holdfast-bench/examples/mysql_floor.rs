//! MySQL/MariaDB: holdfast against the raw floor (the same statements issued
//! by a plain `mysql_async` client), and the two ways of waiting measured.
//!
//! ```text
//! cargo run --release -p holdfast-bench --features mysql --example mysql_floor [-- mysql://user:pw@host:port/db]
//! ```
//!
//! Without a URL it starts a throwaway MariaDB with the testkit. Prints:
//! uncontended acquire+release cycles/s for holdfast and for the raw floor
//! (and their ratio); the raw cycle plus a `GET_LOCK`/`RELEASE_LOCK` pair on a
//! dedicated session (what a GET_LOCK wake-up scheme adds to every cycle); the
//! wake-up latency of a waiter blocked in `GET_LOCK`; and the hand-off latency
//! of holdfast's waiting (in-process wake-up, and the cross-client poll).
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use holdfast::backend::{AcquireRequest, Backend};
use holdfast::stores::mysql::MysqlBackend;
use holdfast::{Client, LockKey, OwnerToken};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder, Pool, PoolOpts, TxOpts};

/// How long the three uncontended loops run together.
const RUN: Duration = Duration::from_secs(9);

fn raw_pool(url: &str) -> Pool {
    let c = holdfast::stores::mysql::MysqlConfig::from_url(url).expect("url");
    let pass = c.password().map(str::to_owned);
    Pool::new(
        OptsBuilder::default()
            .ip_or_hostname(c.host.clone())
            .tcp_port(c.port)
            .user(Some(c.user.clone()))
            .pass(pass)
            .db_name(Some(c.database.clone()))
            .stmt_cache_size(64)
            .init(vec!["SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"])
            .pool_opts(
                PoolOpts::default()
                    .with_reset_connection(false)
                    .with_constraints(mysql_async::PoolConstraints::new(0, 16).expect("constraints"))
                    .with_inactive_connection_ttl(Duration::from_secs(60)),
            ),
    )
}

const FENCE: &str = "UPDATE `holdfast_fence` SET value = LAST_INSERT_ID(value + 1) WHERE id = 0";
const TAKE_OVER: &str = "UPDATE `holdfast_leases` SET
   fence = IF(live_until <= UTC_TIMESTAMP(6), LAST_INSERT_ID(fence + 1), fence),
   label = IF(live_until <= UTC_TIMESTAMP(6), ?, label),
   token = IF(live_until <= UTC_TIMESTAMP(6), ?, token),
   live_until = IF(live_until <= UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, live_until)
 WHERE lock_key = ?";
const INSERT: &str = "INSERT INTO `holdfast_leases` (lock_key, token, fence, label, live_until)
 VALUES (?, ?, LAST_INSERT_ID(), ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
 ON DUPLICATE KEY UPDATE lock_key = lock_key";
const RELEASE: &str = "UPDATE `holdfast_leases` SET token = X'FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF', label = '',
   live_until = UTC_TIMESTAMP(6) WHERE lock_key = ? AND token = ?";

const MIN_ACQUIRE: &str = "INSERT INTO `holdfast_leases` (lock_key, token, fence, label, live_until)
 VALUES (?, ?, 0, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
 ON DUPLICATE KEY UPDATE
   token = IF(live_until <= UTC_TIMESTAMP(6), VALUES(token), token),
   live_until = IF(live_until <= UTC_TIMESTAMP(6), VALUES(live_until), live_until)";

/// The least a lock needs, without a fence: one upsert, one delete.
async fn minimal_cycle(pool: &Pool, key: &[u8]) {
    let token = rand::random::<[u8; 16]>();
    let mut conn = pool.get_conn().await.expect("conn");
    conn.exec_drop(MIN_ACQUIRE, (key, &token[..], "bench", 30_000_000i64)).await.expect("acquire");
    assert_eq!(conn.affected_rows(), 1, "minimal floor: key busy");
    drop(conn);
    let mut conn = pool.get_conn().await.expect("conn");
    conn.exec_drop(RELEASE, (key, &token[..])).await.expect("release");
}

/// Cycles/s of `tasks` tasks, each on its own key, for `RUN / 3`.
async fn concurrent<F, Fut>(tasks: usize, f: F) -> f64
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let start = Instant::now();
    let mut joins = Vec::new();
    for t in 0..tasks {
        let f = f.clone();
        joins.push(tokio::spawn(async move {
            let key = format!("floor/concurrent/{t}");
            let mut n = 0u64;
            while start.elapsed() < RUN / 3 {
                f(key.clone()).await;
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for j in joins {
        total += j.await.expect("task");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// The raw cycle: the statements holdfast sends, nothing else.
async fn raw_cycle(pool: &Pool, key: &[u8]) -> u64 {
    let token = rand::random::<[u8; 16]>();
    let mut conn = pool.get_conn().await.expect("conn");
    conn.exec_drop(TAKE_OVER, ("bench", &token[..], 30_000_000i64, key)).await.expect("take over");
    let fence = match conn.last_insert_id() {
        Some(fence) => fence,
        None => {
            // The key's first grant: no row yet.
            let mut tx = conn.start_transaction(TxOpts::default()).await.expect("begin");
            tx.exec_drop(FENCE, ()).await.expect("fence");
            let fence = tx.last_insert_id().expect("fence value");
            tx.exec_drop(INSERT, (key, &token[..], "bench", 30_000_000i64)).await.expect("grant");
            assert_eq!(tx.affected_rows(), 1, "raw floor: key busy");
            tx.commit().await.expect("commit");
            fence
        }
    };
    drop(conn);
    let mut conn = pool.get_conn().await.expect("conn");
    conn.exec_drop(RELEASE, (key, &token[..])).await.expect("release");
    fence
}

async fn connections(pool: &Pool) -> i64 {
    let mut c = pool.get_conn().await.expect("conn");
    let row: Option<(String, i64)> = c.query_first("SHOW GLOBAL STATUS LIKE 'Connections'").await.expect("status");
    row.map(|r| r.1).unwrap_or(0)
}

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p) as usize]
}

fn req(key: &str) -> AcquireRequest {
    AcquireRequest::new(LockKey::new(key).expect("key"), OwnerToken::random(), Duration::from_secs(30))
        .with_label("bench")
}

/// Hand-off latency: release by `a`, grant to a waiter in `b`.
async fn handoff(a: &MysqlBackend, b: &MysqlBackend, key: &str, rounds: usize) -> Vec<Duration> {
    let mut out = Vec::new();
    for _ in 0..rounds {
        let hold = req(key);
        a.try_acquire(&hold).await.expect("acquire").expect("free");
        let (b2, k) = (b.clone(), key.to_owned());
        let waiter = tokio::spawn(async move {
            let r = req(&k);
            b2.acquire(&r).await.expect("wait");
            (Instant::now(), r.token)
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let released = Instant::now();
        a.release(&hold.key, hold.token).await.expect("release");
        let (granted, token) = waiter.await.expect("task");
        out.push(granted - released);
        b.release(&hold.key, token).await.expect("release");
    }
    out
}

#[tokio::main]
async fn main() {
    let arg = std::env::args().nth(1);
    let server = arg.is_none().then(holdfast_testkit::servers::mysql::MysqlServer::start);
    let url = arg.unwrap_or_else(|| server.as_ref().map(|s| s.url()).expect("url"));
    let client = Client::connect(&url).await.expect("connect");
    let pool = raw_pool(&url);

    let holdfast_cycle = async || {
        let g = client.mutex("floor/holdfast").ttl(Duration::from_secs(30)).try_acquire().await.expect("acquire");
        g.expect("free").release().await.expect("release");
    };
    let raw = async || {
        raw_cycle(&pool, b"floor/raw").await;
    };
    // What a GET_LOCK wake-up scheme adds: the holder takes the wake name on
    // a dedicated session at grant and gives it up at release.
    let mut dedicated: Conn = pool.get_conn().await.expect("conn");
    let mut with_getlock = async || {
        let got: Option<i64> = dedicated.exec_first("SELECT GET_LOCK(?, 0)", ("wake/floor",)).await.expect("get_lock");
        assert_eq!(got, Some(1));
        raw_cycle(&pool, b"floor/getlock").await;
        let _: Option<i64> = dedicated.exec_first("SELECT RELEASE_LOCK(?)", ("wake/floor",)).await.expect("release");
    };
    for _ in 0..100 {
        holdfast_cycle().await;
        raw().await;
        with_getlock().await;
    }
    // Cycles alternate one by one, each timed, so that load from other
    // processes (and fsync latency) hits all three alike.
    let (mut h, mut r, mut g) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut n = 0u32;
    let c0 = connections(&pool).await;
    let start = Instant::now();
    while start.elapsed() < RUN {
        let t = Instant::now();
        holdfast_cycle().await;
        h += t.elapsed();
        let t = Instant::now();
        raw().await;
        r += t.elapsed();
        let t = Instant::now();
        with_getlock().await;
        g += t.elapsed();
        n += 1;
    }
    let c1 = connections(&pool).await;
    println!("{n} cycles each; {} connections opened meanwhile", c1 - c0);
    let per_s = |d: Duration| f64::from(n) / d.as_secs_f64();
    let (holdfast_rate, raw_rate, getlock_rate) = (per_s(h), per_s(r), per_s(g));
    println!(
        "uncontended cycles/s: holdfast {holdfast_rate:.0}, raw floor {raw_rate:.0}, ratio {:.2}",
        holdfast_rate / raw_rate
    );
    println!(
        "raw floor + GET_LOCK/RELEASE_LOCK on a dedicated session: {getlock_rate:.0}/s ({:.2}x the raw floor)",
        getlock_rate / raw_rate
    );

    // Many tasks, each on its own key: grants in one namespace share the
    // fence counter row.
    let tasks = 16;
    let c = client.clone();
    let h = concurrent(tasks, move |k| {
        let c = c.clone();
        async move {
            let g = c.mutex(k).ttl(Duration::from_secs(30)).try_acquire().await.expect("acquire");
            g.expect("free").release().await.expect("release");
        }
    })
    .await;
    let p = pool.clone();
    let r = concurrent(tasks, move |k| {
        let p = p.clone();
        async move {
            raw_cycle(&p, format!("raw/{k}").as_bytes()).await;
        }
    })
    .await;
    let p = pool.clone();
    let m = concurrent(tasks, move |k| {
        let p = p.clone();
        async move { minimal_cycle(&p, format!("min/{k}").as_bytes()).await }
    })
    .await;
    println!(
        "{tasks} tasks on own keys, cycles/s: holdfast {h:.0}, raw floor {r:.0} (ratio {:.2}), \
         fence-less upsert+delete {m:.0} (ratio {:.2})",
        h / r,
        h / m
    );

    // Wake-up latency of a session blocked in GET_LOCK when the holder releases.
    let mut holder: Conn = pool.get_conn().await.expect("conn");
    let mut lat = Vec::new();
    for _ in 0..100 {
        let _: Option<i64> = holder.exec_first("SELECT GET_LOCK('wake/lat', 10)", ()).await.expect("get");
        let p = pool.clone();
        let w = tokio::spawn(async move {
            let mut c = p.get_conn().await.expect("conn");
            let _: Option<i64> = c.exec_first("SELECT GET_LOCK('wake/lat', 10)", ()).await.expect("wait");
            let at = Instant::now();
            let _: Option<i64> = c.exec_first("SELECT RELEASE_LOCK('wake/lat')", ()).await.expect("rel");
            at
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t0 = Instant::now();
        let _: Option<i64> = holder.exec_first("SELECT RELEASE_LOCK('wake/lat')", ()).await.expect("rel");
        lat.push(w.await.expect("task") - t0);
    }
    println!("GET_LOCK wake-up after RELEASE_LOCK: p50 {:?}, p99 {:?}", pct(lat.clone(), 0.5), pct(lat, 0.99));

    // holdfast's waiting: a waiter in the same process and namespace is woken
    // by the releasing client; one in another process (here: a backend whose
    // host spelling keeps it out of the in-process registry) polls.
    let a = MysqlBackend::open_url(&url).await.expect("open");
    // Same registry entry (host, port, database, namespace); a 1 s poll, so
    // only the in-process wake-up can make this fast.
    let same = MysqlBackend::open_url(&format!("{url}?poll_min_ms=1000&poll_max_ms=1000")).await.expect("open");
    let other = MysqlBackend::open_url(&url.replace("@127.0.0.1:", "@localhost:")).await.expect("open");
    let local = handoff(&a, &same, "floor/handoff-local", 100).await;
    println!(
        "hand-off, waiter in the same process (woken; its poll is 1 s): p50 {:?}, p99 {:?}",
        pct(local.clone(), 0.5),
        pct(local, 0.99)
    );
    let polled = handoff(&a, &other, "floor/handoff-poll", 100).await;
    println!(
        "hand-off, waiter in another process (poll {:?}): p50 {:?}, p99 {:?}",
        other.config().poll,
        pct(polled.clone(), 0.5),
        pct(polled, 0.99)
    );
    drop(server);
}
