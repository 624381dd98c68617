//! Segmented locks on real servers (a SQLite file, a redis-server, a
//! PostgreSQL server): routing the same in another process as in the
//! reference vectors, fall-over selling an exact stock (tasks and OS
//! processes; a witness per segment outside the store), totals and
//! rebalances under `lock_all` exact while buyers run, cancellation of a
//! fall-over acquire at every suspension point, and bad input refused with
//! a typed error.
#![cfg(all(feature = "sqlite", feature = "redis", feature = "postgres"))]

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error, SegmentGuard, Segmented};
use holdfast_testkit::faults::cancel_at_each_suspension;
use holdfast_testkit::servers::{postgres::PostgresServer, redis::RedisServer};
use holdfast_testkit::witness::Witness;
use tokio::task::JoinHandle;

/// Leases that only a release can end within a test.
const LONG_TTL: Duration = Duration::from_secs(60);
/// How soon a segment must be free for another client after a drop.
const FREED_WITHIN: Duration = Duration::from_secs(3);

const CHILD_ROLE: &str = "HOLDFAST_SEG_CHILD";
const CHILD_URL: &str = "HOLDFAST_SEG_URL";
const CHILD_DIR: &str = "HOLDFAST_SEG_DIR";
const CHILD_KEY: &str = "HOLDFAST_SEG_KEY";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}/segmented.db", dir.path().display())
}

/// Re-runs this test binary as a child for `test`, in `role`.
fn child(test: &str, role: &str, url: &str, dir: &std::path::Path, key: &str) -> std::process::Child {
    Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", &test_name(test), "--nocapture"])
        .env(CHILD_ROLE, role)
        .env(CHILD_URL, url)
        .env(CHILD_DIR, dir)
        .env(CHILD_KEY, key)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn child")
}

fn wait_all(children: Vec<std::process::Child>, within: Duration) {
    let started = Instant::now();
    for mut c in children {
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                assert!(status.success(), "a child process failed: {status}");
                break;
            }
            assert!(started.elapsed() < within, "child processes did not finish in {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

// -- Routing -------------------------------------------------------------------

/// Ids and their segments among 16 and 100, from the xxHash project's C
/// library (`XXH3_64bits`, seed 0), computed outside Rust.
const VECTORS: &[(&str, usize, usize)] =
    &[("", 2, 38), ("a", 15, 19), ("buyer-1", 7, 43), ("buyer-1017", 10, 22), ("user:42", 10, 26), ("12345", 1, 81)];

fn routes(client: &Client) -> String {
    let (s16, s100) = (client.segmented("r", 16).expect("16"), client.segmented("r", 100).expect("100"));
    (0..500).map(|i| format!("{} {}\n", s16.route(format!("buyer-{i}")), s100.route(format!("buyer-{i}")))).collect()
}

/// The reference vectors hold through `Segmented::route`, and another OS
/// process (its own hasher state, its own address space) routes 500 ids
/// exactly as this one does.
#[test]
fn routing_is_the_same_in_every_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    if std::env::var(CHILD_ROLE).as_deref() == Ok("route") {
        let out = std::env::var(CHILD_DIR).expect(CHILD_DIR);
        let routes = rt().block_on(async { routes(&client(&std::env::var(CHILD_URL).expect("url"), "child").await) });
        std::fs::write(format!("{out}/routes"), routes).expect("write routes");
        return;
    }
    let url = sqlite_url(&dir);
    let mine = rt().block_on(async {
        let c = client(&url, "parent").await;
        let (s16, s100) = (c.segmented("r", 16).expect("16"), c.segmented("r", 100).expect("100"));
        for &(id, m16, m100) in VECTORS {
            assert_eq!((s16.route(id), s100.route(id)), (m16, m100), "{id:?}");
            assert_eq!(s16.route(id.as_bytes()), m16);
        }
        assert_eq!(s16.route(42u64.to_be_bytes()), 12);
        routes(&c)
    });
    wait_all(
        vec![child("routing_is_the_same_in_every_process", "route", &url, dir.path(), "r")],
        Duration::from_secs(30),
    );
    let theirs = std::fs::read_to_string(dir.path().join("routes")).expect("child's routes");
    assert_eq!(mine, theirs, "another process routed differently");
}

// -- Fall-over with an exact stock --------------------------------------------------

/// The stock of segment `i`: uneven on purpose (segment 1 starts empty,
/// others hold 1 to 20), so buyers fall over from the first purchases on.
fn stock_of(i: usize) -> i64 {
    if i == 1 { 0 } else { 1 + (i as i64 * 7) % 20 }
}

fn witnesses(dir: &std::path::Path, n: usize) -> Vec<Witness> {
    (0..n).map(|i| Witness::new(dir.join(format!("seg-{i}"))).expect("witness")).collect()
}

/// One purchase under `guard`: enter the segment's witness with the fence,
/// take one item, leave. The check under the lock said there was stock.
async fn buy(w: &[Witness], guard: &SegmentGuard, sold: &AtomicU64) {
    let w = &w[guard.segment()];
    let inside = w.enter(guard.fence()).expect("enter");
    let left = w.counter().expect("counter");
    assert!(left > 0, "the check under the lock said segment {} had stock", guard.segment());
    tokio::task::yield_now().await;
    w.set_counter(left - 1).expect("set counter");
    sold.fetch_add(1, Ordering::SeqCst);
    w.exit(inside).expect("exit");
}

/// Buys with fresh buyer ids until `acquire_available` says sold out.
async fn buyer(seg: Segmented, w: Arc<Vec<Witness>>, sold: Arc<AtomicU64>, who: String) -> u64 {
    let mut mine = 0;
    for n in 0.. {
        let id = format!("{who}-buyer-{n}");
        let got = seg.acquire_available(&id, |segment| {
            let w = w.clone();
            async move { Ok::<_, holdfast::BoxError>(w[segment].counter()? > 0) }
        });
        let Some(guard) = got.await.expect("acquire_available") else { break };
        buy(&w, &guard, &sold).await;
        guard.release().await.expect("release");
        mine += 1;
        // A breath between buyers, as between real requests.
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    mine
}

fn check_witnesses(w: &[Witness], store: &str) {
    for (i, w) in w.iter().enumerate() {
        let r = w.report().expect("report");
        assert_eq!(r.counter, 0, "{store}: segment {i} not sold out: {r:?}");
        assert_eq!(r.overlaps, 0, "{store}: segment {i}: two holders inside: {r:?}");
        assert!(r.fences_increasing, "{store}: segment {i}: fences not increasing");
        assert_eq!(r.entries as i64, stock_of(i), "{store}: segment {i}: one entry per item sold");
    }
}

/// On SQLite, Redis and PostgreSQL: 8 segments of uneven stock (one empty),
/// 12 tasks over 2 clients buying with fresh ids until sold out: every item
/// sold exactly once (each segment's witness: counter 0, one entry per item,
/// no overlap, fences increasing), and every task ends with `None`.
#[test]
fn fall_over_sells_the_exact_stock_on_every_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (redis, postgres) = (RedisServer::start(), PostgresServer::start());
    const N: usize = 8;
    let total: i64 = (0..N).map(stock_of).sum();
    for (store, url) in [("sqlite", sqlite_url(&dir)), ("redis", redis.url()), ("postgres", postgres.url())] {
        let wdir = dir.path().join(store);
        let w = Arc::new(witnesses(&wdir, N));
        for (i, w) in w.iter().enumerate() {
            w.reset(stock_of(i)).expect("reset");
        }
        let sold = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        rt().block_on(async {
            let clients = [client(&url, "a").await, client(&url, "b").await];
            let tasks: Vec<JoinHandle<u64>> = (0..12)
                .map(|t| {
                    let seg = clients[t % 2].segmented("sale", N).expect("segmented").ttl(Duration::from_secs(10));
                    tokio::spawn(buyer(seg, w.clone(), sold.clone(), format!("t{t}")))
                })
                .collect();
            let mut per_task = Vec::new();
            for t in tasks {
                per_task.push(t.await.expect("task"));
            }
            eprintln!("{store}: {total} items over {N} segments in {:?}: {per_task:?}", started.elapsed());
            assert_eq!(per_task.iter().sum::<u64>() as i64, total);
        });
        assert_eq!(sold.load(Ordering::SeqCst) as i64, total, "{store}");
        check_witnesses(&w, store);
    }
}

/// A child process: 4 buyer tasks on one client until sold out; writes how
/// many it sold.
fn child_buyer() {
    let var = |name| std::env::var(name).expect(name);
    let dir = std::path::PathBuf::from(var(CHILD_DIR));
    let sold = rt().block_on(async {
        let c = client(&var(CHILD_URL), "child").await;
        let seg = c.segmented(var(CHILD_KEY), 8).expect("segmented").ttl(Duration::from_secs(10));
        let (w, sold) = (Arc::new(witnesses(&dir, 8)), Arc::new(AtomicU64::new(0)));
        let tasks: Vec<_> = (0..4)
            .map(|t| tokio::spawn(buyer(seg.clone(), w.clone(), sold.clone(), format!("{}-{t}", std::process::id()))))
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        sold.load(Ordering::SeqCst)
    });
    std::fs::write(dir.join(format!("sold-{}", std::process::id())), sold.to_string()).expect("write sold");
}

/// Across OS processes, on SQLite and Redis: 3 processes of 4 buyer tasks
/// each (their marks their own) sell the same uneven stock exactly.
#[test]
fn processes_sell_the_exact_stock() {
    if std::env::var(CHILD_ROLE).as_deref() == Ok("buyer") {
        return child_buyer();
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = RedisServer::start();
    let total: i64 = (0..8).map(stock_of).sum();
    for (store, url) in [("sqlite", sqlite_url(&dir)), ("redis", redis.url())] {
        let wdir = dir.path().join(store);
        for (i, w) in witnesses(&wdir, 8).iter().enumerate() {
            w.reset(stock_of(i)).expect("reset");
        }
        let started = Instant::now();
        let children = (0..3).map(|_| child("processes_sell_the_exact_stock", "buyer", &url, &wdir, "psale")).collect();
        wait_all(children, Duration::from_secs(60));
        let per_process: Vec<i64> = std::fs::read_dir(&wdir)
            .expect("dir")
            .filter_map(|e| {
                let e = e.expect("entry");
                e.file_name()
                    .to_string_lossy()
                    .starts_with("sold-")
                    .then(|| std::fs::read_to_string(e.path()).expect("read").trim().parse::<i64>().expect("a number"))
            })
            .collect();
        eprintln!("{store}: 3 processes sold {per_process:?} of {total} in {:?}", started.elapsed());
        assert_eq!(per_process.len(), 3);
        assert_eq!(per_process.iter().sum::<i64>(), total, "{store}");
        check_witnesses(&witnesses(&wdir, 8), store);
    }
}

// -- Totals under lock_all ------------------------------------------------------------

/// On PostgreSQL and Redis: 8 buyer tasks sell 16 segments' stock while a
/// ninth task takes `lock_all` every few ms: under it, stock left plus
/// items sold is exactly the stock every time, and every other time it
/// moves half of the fullest segment's stock to the emptiest (a rebalance)
/// and restocks the buyers' handle. At the end everything is sold, the
/// witnesses are clean, and the totals task ran many times.
#[test]
fn totals_and_rebalances_under_lock_all_are_exact_while_buyers_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (redis, postgres) = (RedisServer::start(), PostgresServer::start());
    const N: usize = 16;
    const STOCK: i64 = 240;
    for (store, url) in [("redis", redis.url()), ("postgres", postgres.url())] {
        let w = Arc::new(witnesses(&dir.path().join(store), N));
        for w in w.iter() {
            w.reset(STOCK / N as i64).expect("reset");
        }
        let sold = Arc::new(AtomicU64::new(0));
        rt().block_on(async {
            let c = client(&url, "totals").await;
            let seg = c.segmented("tot", N).expect("segmented").ttl(Duration::from_secs(10));
            let buyers: Vec<JoinHandle<u64>> =
                (0..8).map(|t| tokio::spawn(buyer(seg.clone(), w.clone(), sold.clone(), format!("t{t}")))).collect();
            let (mut reads, mut moves) = (0u32, 0u32);
            while !buyers.iter().all(|b| b.is_finished()) {
                let all = seg.lock_all().await.expect("lock_all");
                assert_eq!(all.segments(), N);
                let left: Vec<i64> = w.iter().map(|w| w.counter().expect("counter")).collect();
                let total = left.iter().sum::<i64>() + sold.load(Ordering::SeqCst) as i64;
                assert_eq!(total, STOCK, "{store}: a total under lock_all was not exact: {left:?}");
                reads += 1;
                let (max, min) = (argmax(&left), argmin(&left));
                if reads % 2 == 0 && left[max] >= 2 {
                    let moved = left[max] / 2;
                    w[max].set_counter(left[max] - moved).expect("set");
                    w[min].set_counter(left[min] + moved).expect("set");
                    seg.restock(min).expect("restock");
                    moves += 1;
                }
                all.release().await.expect("release all");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            for b in buyers {
                b.await.expect("buyer");
            }
            eprintln!("{store}: {reads} exact totals and {moves} rebalances while buyers ran");
            assert!(reads >= 3, "{store}: lock_all ran only {reads} times while buyers ran");
        });
        assert_eq!(sold.load(Ordering::SeqCst) as i64, STOCK, "{store}");
        for (i, w) in w.iter().enumerate() {
            let r = w.report().expect("report");
            assert_eq!((r.counter, r.overlaps), (0, 0), "{store}: segment {i}: {r:?}");
            assert!(r.fences_increasing, "{store}: segment {i}");
        }
    }
}

fn argmax(v: &[i64]) -> usize {
    (0..v.len()).max_by_key(|&i| v[i]).unwrap_or(0)
}

fn argmin(v: &[i64]) -> usize {
    (0..v.len()).min_by_key(|&i| v[i]).unwrap_or(0)
}

// -- Cancellation ---------------------------------------------------------------------

/// Whether `by` gets `key` at once (and lets it go again).
async fn is_free(by: &Client, key: &str) -> bool {
    match by.mutex(key).ttl(LONG_TTL).try_acquire().await.expect("probe") {
        Some(g) => {
            g.release().await.expect("probe release");
            true
        }
        None => false,
    }
}

async fn freed(by: &Client, key: &str, what: &str) {
    let start = Instant::now();
    while !is_free(by, key).await {
        assert!(start.elapsed() < FREED_WITHIN, "{what}: {key:?} still held after {FREED_WITHIN:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// On Redis, 3 segments: the id routes to segment 0, whose check (which
/// itself awaits) says empty, then segment 1, held by another client that
/// lets go 100 ms into each run and also empty, then segment 2, which has
/// stock. The fall-over acquire is dropped at each of its suspension points
/// in turn (waiting, checking, releasing an empty segment): after every
/// drop all three segments are free for another client within 3 s though
/// leases last 60 s. A failing check comes back as the caller's error, the
/// segment released and not marked.
#[test]
#[expect(
    clippy::async_yields_async,
    reason = "each sweep's setup closure returns the operation's future, unpolled, for the harness to count"
)]
fn cancelled_fall_over_leaves_nothing_held() {
    let redis = RedisServer::start();
    rt().block_on(async {
        let (c, checker, holder) = (
            client(&redis.url(), "buyer").await,
            client(&redis.url(), "checker").await,
            client(&redis.url(), "holder").await,
        );
        let id = (0..).map(|i| format!("id-{i}")).find(|id| c.segmented("cx", 3).expect("3").route(id) == 0);
        let id = id.expect("an id of segment 0");
        let seg = c.segmented("cx", 3).expect("3");
        let keys: Vec<String> = (0..3).map(|i| seg.segment_key(i).expect("in range").to_owned()).collect();
        let holding: std::sync::Mutex<Option<JoinHandle<holdfast::Result<()>>>> = std::sync::Mutex::new(None);
        let started = Instant::now();
        let sweep = cancel_at_each_suspension(
            400,
            async |_| {
                let held = holder.mutex(&keys[1]).ttl(LONG_TTL).acquire_timeout(Duration::from_secs(5)).await;
                let held = held.expect("holder");
                *holding.lock().expect("slot") = Some(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    held.release().await
                }));
                // A fresh handle each run: no marks from the run before.
                let seg = c.segmented("cx", 3).expect("3").ttl(LONG_TTL);
                let id = id.clone();
                async move {
                    let got = seg
                        .acquire_available(&id, |segment| async move {
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            Ok::<_, Error>(segment == 2)
                        })
                        .await;
                    (seg.marked_empty(), got)
                }
            },
            async |n| {
                let task = holding.lock().expect("slot").take().expect("a holder task");
                task.await.expect("holder task").expect("holder release");
                for key in &keys {
                    freed(&checker, key, &format!("fall-over dropped at suspension {n}")).await;
                }
            },
        )
        .await;
        eprintln!("fall-over: dropped at each of {} suspension points in {:?}", sweep.drops, started.elapsed());
        assert!(sweep.drops >= 4, "only {} suspension points", sweep.drops);
        let (marks, got) = sweep.output.expect("completed");
        let guard = got.expect("acquire_available").expect("segment 2 has stock");
        assert_eq!((guard.segment(), marks), (2, vec![0, 1]));
        guard.release().await.expect("release");
        let task = holding.lock().expect("slot").take().expect("a holder task");
        task.await.expect("holder task").expect("holder release");

        #[derive(Debug, PartialEq)]
        enum AppError {
            Db,
            Lock,
        }
        impl From<Error> for AppError {
            fn from(_: Error) -> Self {
                AppError::Lock
            }
        }
        let seg = c.segmented("cx", 3).expect("3").ttl(LONG_TTL);
        let failed = seg.acquire_available(&id, |_| async { Err::<bool, _>(AppError::Db) }).await;
        assert_eq!(failed.err(), Some(AppError::Db));
        assert!(seg.marked_empty().is_empty(), "a failed check marks nothing");
        assert!(is_free(&checker, &keys[0]).await, "the segment of a failed check was released");
    });
}

// -- Bad input ------------------------------------------------------------------------

/// With the Redis server already killed (any I/O would be a store error or
/// a wait): 0 segments, too many, an empty key, a key too long for its last
/// segment's suffix, a segment out of range, a bad TTL: `InvalidInput` at
/// once, from every method.
#[test]
fn bad_input_is_a_typed_error_before_any_io() {
    let mut redis = RedisServer::start();
    rt().block_on(async {
        let c = client(&redis.url(), "bad").await;
        tokio::task::block_in_place(|| redis.kill());
        let what = |r: holdfast::Result<Segmented>| match r {
            Err(Error::InvalidInput { what, .. }) => what,
            other => panic!("expected InvalidInput, got {other:?}"),
        };
        assert_eq!(what(c.segmented("k", 0)), "segments");
        assert_eq!(what(c.segmented("k", holdfast::Segmented::MAX_SEGMENTS + 1)), "segments");
        assert_eq!(what(c.segmented("", 3)), "key");
        let long = "k".repeat(holdfast::LockKey::MAX_BYTES - "/seg-99".len() + 1);
        assert_eq!(what(c.segmented(long.as_str(), 100)), "key");
        assert!(c.segmented(&long[1..], 100).is_ok());

        let seg = c.segmented("k", 3).expect("valid");
        let bad_ttl = seg.clone().ttl(Duration::from_millis(1));
        tokio::time::timeout(Duration::from_secs(1), async {
            assert!(matches!(seg.acquire_segment(3).await, Err(Error::InvalidInput { what: "segment", .. })));
            assert!(matches!(bad_ttl.acquire("x").await, Err(Error::InvalidInput { what: "ttl", .. })));
            assert!(matches!(bad_ttl.try_acquire("x").await, Err(Error::InvalidInput { what: "ttl", .. })));
            assert!(matches!(bad_ttl.lock_all().await, Err(Error::InvalidInput { what: "ttl", .. })));
            assert!(matches!(bad_ttl.try_lock_all().await, Err(Error::InvalidInput { what: "ttl", .. })));
            let r = bad_ttl.acquire_available("x", |_| async { Ok::<_, Error>(true) }).await;
            assert!(matches!(r, Err(Error::InvalidInput { what: "ttl", .. })), "{r:?}");
        })
        .await
        .expect("refused at once");
        assert!(matches!(seg.mark_empty(7), Err(Error::InvalidInput { what: "segment", .. })));
    });
}

/// The full name of test `name` of this module, for `--exact` when the
/// binary re-runs itself: `module::name` (the crate's name left off).
fn test_name(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_owned(),
    }
}
