//! The all-or-nothing multi-lock on real servers, with parts on a SQLite
//! file and a redis-server at once: all or nothing, no deadlock between
//! multi-locks that list their parts in opposite orders (across tasks and
//! across OS processes), cancellation at every suspension point, `lost()`
//! when one part is lost, fences per part, and bad input refused before any
//! I/O.
#![cfg(all(feature = "sqlite", feature = "redis"))]

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error, MultiGuard, MultiLock};
use holdfast_testkit::faults::{cancel_at, cancel_at_each_suspension};
use holdfast_testkit::servers::redis::RedisServer;
use holdfast_testkit::witness::Witness;
use tokio::task::JoinHandle;

/// Leases that only a release can end within a test.
const LONG_TTL: Duration = Duration::from_secs(60);
/// How soon a part must be free for another client after a drop.
const FREED_WITHIN: Duration = Duration::from_secs(3);

/// A SQLite file and a redis-server, both fresh.
struct Stores {
    dir: tempfile::TempDir,
    redis: RedisServer,
}

impl Stores {
    fn start() -> Self {
        Stores { dir: tempfile::tempdir().expect("tempdir"), redis: RedisServer::start() }
    }

    fn sqlite_url(&self) -> String {
        format!("sqlite://{}/multi.db", self.dir.path().display())
    }

    /// One "process": a client of each store.
    async fn clients(&self, label: &str) -> (Client, Client) {
        (client(&self.sqlite_url(), label).await, client(&self.redis.url(), label).await)
    }
}

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

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

/// Panics unless `by` gets `key` within [`FREED_WITHIN`].
async fn freed(by: &Client, key: &str, what: &str) {
    let start = Instant::now();
    while !is_free(by, key).await {
        if start.elapsed() >= FREED_WITHIN {
            let holder = by.status(key).await.map(|s| s.holder);
            panic!("{what}: {key:?} still held after {FREED_WITHIN:?}, by {holder:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Part B held elsewhere: `try_acquire` gives `None` and part A is free for
/// another client at once; `acquire_timeout` fails with `Timeout` after its
/// one deadline and leaves nothing; once B is free the whole is granted.
#[test]
fn all_or_nothing() {
    let stores = Stores::start();
    rt().block_on(async {
        let (sq, rd) = stores.clients("multi").await;
        let (other_sq, other_rd) = stores.clients("other").await;
        // "aon/a" comes first in the canonical order: it is taken, then B is busy.
        let both = MultiLock::new().with(&rd, "aon/b").with(&sq, "aon/a").ttl(LONG_TTL);
        let b = other_rd.mutex("aon/b").ttl(LONG_TTL).acquire().await.expect("B held elsewhere");

        assert!(both.try_acquire().await.expect("try_acquire").is_none());
        let a = other_sq.mutex("aon/a").ttl(LONG_TTL).try_acquire().await.expect("probe A");
        a.expect("A is free right after the failed try_acquire").release().await.expect("release A");

        let started = Instant::now();
        match both.acquire_timeout(Duration::from_millis(400)).await {
            Err(Error::Timeout { key, waited }) => {
                assert_eq!(key, "aon/b");
                assert!(waited >= Duration::from_millis(400) && waited < Duration::from_secs(2), "{waited:?}");
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(is_free(&other_sq, "aon/a").await, "A left held by a multi-lock that timed out");
        assert!(!b.is_lost(), "the other holder's B was disturbed");

        b.release().await.expect("release B");
        let guard = both.try_acquire().await.expect("try_acquire").expect("both free: granted");
        assert_eq!(guard.fences().iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["aon/a", "aon/b"]);
        assert!(!is_free(&other_sq, "aon/a").await && !is_free(&other_rd, "aon/b").await);
        guard.release().await.expect("release");
        assert!(is_free(&other_sq, "aon/a").await && is_free(&other_rd, "aon/b").await);
    });
}

/// The parts of the contention tests: "a" on SQLite, "b" on Redis, and "a"
/// on Redis too (the same key on two stores, ordered by store identity).
fn contended(sq: &Client, rd: &Client, prefix: &str, reversed: bool) -> MultiLock {
    let mut parts = vec![(sq, format!("{prefix}/a")), (rd, format!("{prefix}/b")), (rd, format!("{prefix}/a"))];
    if reversed {
        parts.reverse();
    }
    parts.into_iter().fold(MultiLock::new(), |m, (c, k)| m.with(c, k))
}

/// 8 tasks in 2 groups (each group a client per store, as two processes
/// would have), half listing the parts forward and half reversed, for 3 s:
/// every task keeps getting the whole, never two holders of a part at once,
/// each part's fences increase.
#[test]
fn opposite_orders_never_deadlock() {
    let stores = Stores::start();
    rt().block_on(async {
        let groups = [stores.clients("group-0").await, stores.clients("group-1").await];
        let inside: Arc<[AtomicU32; 3]> = Arc::default();
        let last_fence: Arc<[AtomicU64; 3]> = Arc::default();
        let overlaps = Arc::new(AtomicU32::new(0));
        let run_for = Duration::from_secs(3);
        let started = Instant::now();
        let tasks: Vec<JoinHandle<u32>> = (0..8usize)
            .map(|i| {
                let (sq, rd) = &groups[i % 2];
                let multi = contended(sq, rd, "dl", (i / 2) % 2 == 1).ttl(Duration::from_secs(10));
                let (inside, last_fence, overlaps) = (inside.clone(), last_fence.clone(), overlaps.clone());
                tokio::spawn(async move {
                    let mut count = 0;
                    while started.elapsed() < run_for {
                        let guard = match multi.acquire_timeout(Duration::from_secs(5)).await {
                            Ok(g) => g,
                            Err(e) => panic!("task {i}: {e} (a deadlock?)"),
                        };
                        // Canonical order: ("dl/a", redis), ("dl/a", sqlite), ("dl/b", redis).
                        let fences = guard.fences();
                        for (p, (_, fence)) in fences.iter().enumerate() {
                            if inside[p].fetch_add(1, Ordering::SeqCst) != 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            let before = last_fence[p].swap(*fence, Ordering::SeqCst);
                            assert!(*fence > before, "task {i}: part {p} fence {fence} after {before}");
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        for counter in inside.iter() {
                            counter.fetch_sub(1, Ordering::SeqCst);
                        }
                        guard.release().await.expect("release");
                        count += 1;
                    }
                    count
                })
            })
            .collect();
        let mut counts = Vec::new();
        for t in tasks {
            counts.push(t.await.expect("task"));
        }
        eprintln!("grants per task over {:?}: {counts:?}", started.elapsed());
        assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders of a part at once");
        assert!(counts.iter().all(|&c| c > 0), "a task never got the whole: {counts:?}");
        assert!(started.elapsed() < Duration::from_secs(9));
    });
}

/// `try_acquire`, `acquire` (one part held by another client that releases
/// after 200 ms) and `release()` dropped at each of their suspension points
/// in turn: after every drop, every part is free for another client within
/// 3 s, although leases last 60 s.
#[test]
#[expect(
    clippy::async_yields_async,
    reason = "each sweep's setup closure returns the operation's future, unpolled, for the harness to count"
)]
fn cancel_at_every_suspension_leaves_nothing() {
    const MAX_SUSPENSIONS: u32 = 400;
    let stores = Stores::start();
    rt().block_on(async {
        let (sq, rd) = stores.clients("multi").await;
        let (c_sq, c_rd) = stores.clients("checker").await;
        let (_, h_rd) = stores.clients("holder").await;
        let multi = MultiLock::new().with(&sq, "cx/a").with(&rd, "cx/b").ttl(LONG_TTL);
        let all_free = async |what: String| {
            freed(&c_sq, "cx/a", &what).await;
            freed(&c_rd, "cx/b", &what).await;
        };

        let sweep = cancel_at_each_suspension(
            MAX_SUSPENSIONS,
            async |_| {
                let multi = multi.clone();
                async move { multi.try_acquire().await }
            },
            async |n| all_free(format!("try_acquire dropped at suspension {n}")).await,
        )
        .await;
        eprintln!("try_acquire: dropped at each of {} suspension points", sweep.drops);
        let guard = sweep.output.expect("completed").expect("try_acquire").expect("free parts are granted");
        guard.release().await.expect("release");

        // The second part (in canonical order) is held and released 200 ms
        // into each run: drops land while the first is taken, while the
        // second is waited for, when it is woken and while it is taken.
        let releasing: StdMutex<Option<JoinHandle<holdfast::Result<()>>>> = StdMutex::new(None);
        let holder_done = async || {
            let task = releasing.lock().expect("slot").take().expect("a holder task");
            task.await.expect("holder task").expect("holder release");
        };
        let started = Instant::now();
        let sweep = cancel_at_each_suspension(
            MAX_SUSPENSIONS,
            async |_| {
                let held = h_rd.mutex("cx/b").ttl(LONG_TTL).acquire_timeout(Duration::from_secs(5)).await;
                let held = held.expect("holder");
                *releasing.lock().expect("slot") = Some(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    held.release().await
                }));
                let multi = multi.clone();
                async move { multi.acquire().await }
            },
            async |n| {
                holder_done().await;
                all_free(format!("acquire dropped at suspension {n}")).await
            },
        )
        .await;
        eprintln!("acquire: dropped at each of {} suspension points in {:?}", sweep.drops, started.elapsed());
        assert!(sweep.drops > 0, "acquire of a held part never suspended");
        let guard = sweep.output.expect("acquire completed").expect("acquire");
        holder_done().await;
        guard.release().await.expect("release");
        all_free("after the sweep".into()).await;

        for _ in 0..3 {
            let sweep = cancel_at_each_suspension(
                MAX_SUSPENSIONS,
                async |_| {
                    let guard = multi.acquire_timeout(Duration::from_secs(5)).await.expect("acquire");
                    async move { guard.release().await }
                },
                async |n| all_free(format!("release dropped at suspension {n}")).await,
            )
            .await;
            sweep.output.expect("release completed").expect("release");
        }
        // Dropped after its first poll, however far that got.
        let guard = multi.acquire().await.expect("acquire");
        if let Some(outcome) = cancel_at(guard.release(), 1).await {
            outcome.expect("release");
        }
        all_free("release dropped after its first poll".into()).await;
    });
}

/// A multi-lock over a SQLite key and a Redis key with a 2 s TTL, renewed;
/// the Redis grant deleted behind its back: `lost()` fires within the TTL,
/// `is_lost()` is true, the SQLite part is still held, and `release()`
/// reports the loss and frees the SQLite part all the same.
#[test]
fn one_lost_part_fires_lost() {
    let stores = Stores::start();
    rt().block_on(async {
        let (sq, rd) = stores.clients("multi").await;
        let (other_sq, _) = stores.clients("other").await;
        let guard = sq.multi(["lost/a"]).with(&rd, "lost/b").ttl(Duration::from_secs(2)).acquire().await;
        let guard = guard.expect("acquire");
        let lost = guard.lost();
        assert!(!guard.is_lost());

        let raw = redis::Client::open(stores.redis.url()).expect("redis client");
        let mut conn = raw.get_multiplexed_async_connection().await.expect("raw connection");
        let deleted_at = Instant::now();
        let n: u32 = redis::cmd("DEL").arg("{holdfast:lost/b}").query_async(&mut conn).await.expect("del");
        assert_eq!(n, 1, "the Redis part's grant was not where expected");
        tokio::time::timeout(Duration::from_secs(2), lost).await.expect("lost() within the TTL");
        eprintln!("lost() fired {:?} after the Redis grant was deleted", deleted_at.elapsed());
        assert!(guard.is_lost());
        let states: Vec<(&str, bool)> = guard.parts().map(|(_, g)| (g.key(), g.is_lost())).collect();
        assert_eq!(states, [("lost/a", false), ("lost/b", true)]);
        assert!(!is_free(&other_sq, "lost/a").await, "the SQLite part is still held");

        match guard.release().await {
            Err(Error::Lost { key }) => assert_eq!(key, "lost/b"),
            other => panic!("release of a lost part: {other:?}"),
        }
        assert!(is_free(&other_sq, "lost/a").await, "the SQLite part was released with the rest");
    });
}

/// A part granted first and lost (its renewal capped by `max_hold`) while
/// the next part is awaited: the acquire fails with `Lost` naming it, at the
/// loss rather than never, and takes nothing.
#[test]
fn a_part_lost_while_waiting_fails_the_whole() {
    let stores = Stores::start();
    rt().block_on(async {
        let (sq, rd) = stores.clients("multi").await;
        let (other_sq, other_rd) = stores.clients("other").await;
        let b = other_rd.mutex("wl/b").ttl(LONG_TTL).acquire().await.expect("B held elsewhere");
        let multi =
            sq.multi(["wl/a"]).with(&rd, "wl/b").ttl(Duration::from_secs(1)).max_hold(Duration::from_millis(100));
        let started = Instant::now();
        match tokio::time::timeout(Duration::from_secs(5), multi.acquire()).await {
            Ok(Err(Error::Lost { key })) => assert_eq!(key, "wl/a"),
            other => panic!("expected Lost for the first part, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        assert!(!b.is_lost(), "the other holder's B was disturbed");
        b.release().await.expect("release B");
        assert!(is_free(&other_rd, "wl/b").await && is_free(&other_sq, "wl/a").await);
    });
}

/// `fences()` gives each part's own fence, in the canonical order (by key,
/// then store identity); a second grant after release has every part's
/// fence higher.
#[test]
fn fences_per_part_increase() {
    let stores = Stores::start();
    rt().block_on(async {
        let (sq, rd) = stores.clients("multi").await;
        let multi = contended(&sq, &rd, "f", false).ttl(Duration::from_secs(10));
        let first: MultiGuard = multi.acquire().await.expect("acquire");
        let fences: Vec<(String, u64)> = first.fences().into_iter().map(|(k, f)| (k.to_owned(), f)).collect();
        let stores_in_order: Vec<&str> = first.parts().map(|(s, _)| s).collect();
        assert_eq!(stores_in_order, [rd.store_id(), sq.store_id(), rd.store_id()]);
        assert_eq!(fences.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["f/a", "f/a", "f/b"]);
        for ((_, g), (_, f)) in first.parts().zip(&fences) {
            assert_eq!(g.fence(), *f);
        }
        first.release().await.expect("release");

        let second = multi.acquire().await.expect("acquire again");
        for ((key, before), (k, after)) in fences.iter().zip(second.fences()) {
            assert_eq!(key, k);
            assert!(after > *before, "{key}: fence {after} after {before}");
        }
        second.release().await.expect("release");
    });
}

/// Empty, a duplicate key on one client, a duplicate on two hand-built
/// clients of one kind without store ids, a TTL below the minimum, a bad
/// renewal period, a bad key: `InvalidInput`, at once, from each acquire,
/// with the Redis server already killed (any I/O would be a store error or
/// a wait) and the SQLite part left free.
#[test]
fn bad_input_is_refused_before_any_io() {
    let mut stores = Stores::start();
    rt().block_on(async {
        let (sq, rd) = stores.clients("multi").await;
        tokio::task::block_in_place(|| stores.redis.kill());
        let dir = tempfile::tempdir().expect("tempdir");
        let hand_built = async |file: &str, id: Option<&str>| {
            let url = format!("sqlite://{}/{file}", dir.path().display());
            let backend = holdfast::stores::connect(&url).await.expect("open");
            let options = ClientOptions::default();
            Client::with_backend(backend, id.map_or(options.clone(), |id| options.with_store_id(id)))
        };
        let (h1, h2) = (hand_built("one.db", None).await, hand_built("two.db", None).await);
        assert_eq!((h1.store_id(), h2.store_id()), ("sqlite", "sqlite"));

        let cases: Vec<(&str, MultiLock, &str)> = vec![
            ("no parts", MultiLock::new(), "multi-lock"),
            ("no keys", rd.multi(Vec::<String>::new()), "multi-lock"),
            ("a key twice on one client", rd.multi(["x", "y", "x"]), "multi-lock"),
            ("a key twice on clones of one client", sq.multi(["x"]).with(&sq.clone(), "x"), "multi-lock"),
            ("two hand-built stores without ids", MultiLock::new().with(&h1, "x").with(&h2, "x"), "multi-lock"),
            ("a TTL below the minimum", sq.multi(["x"]).with(&rd, "y").ttl(Duration::from_millis(10)), "ttl"),
            (
                "a bad renewal period",
                sq.multi(["x"]).with(&rd, "y").renew_every(Duration::from_secs(60)),
                "renew_every",
            ),
            ("an empty key", sq.multi(["x"]).with(&rd, ""), "key"),
            ("a key with a newline", sq.multi(["x"]).with(&rd, "y\n"), "key"),
        ];
        for (case, multi, expected) in cases {
            let outcomes = tokio::time::timeout(Duration::from_secs(1), async {
                [
                    multi.try_acquire().await.map(|_| ()),
                    multi.acquire().await.map(|_| ()),
                    multi.acquire_timeout(Duration::from_secs(5)).await.map(|_| ()),
                ]
            })
            .await
            .unwrap_or_else(|_| panic!("{case}: not refused at once"));
            for outcome in outcomes {
                match outcome {
                    Err(Error::InvalidInput { what, .. }) if what == expected => {}
                    other => panic!("{case}: expected InvalidInput {{ what: {expected:?} }}, got {other:?}"),
                }
            }
        }
        assert!(is_free(&sq, "x").await, "a refused multi-lock took its SQLite part");

        // Hand-built stores told apart by their ids: one grant of each.
        let (h1, h2) = (hand_built("one.db", Some("one")).await, hand_built("two.db", Some("two")).await);
        let guard = MultiLock::new().with(&h1, "x").with(&h2, "x").try_acquire().await.expect("distinct ids");
        let guard = guard.expect("granted");
        assert_eq!(guard.parts().map(|(s, _)| s).collect::<Vec<_>>(), ["one", "two"]);
        guard.release().await.expect("release");
    });
}

// -- Across OS processes -----------------------------------------------------

const CHILD_ROLE: &str = "HOLDFAST_MULTI_CHILD";
const CHILD_SQLITE: &str = "HOLDFAST_MULTI_SQLITE";
const CHILD_REDIS: &str = "HOLDFAST_MULTI_REDIS";
const CHILD_DIR: &str = "HOLDFAST_MULTI_DIR";
const PROCESSES: u64 = 4;
const CYCLES: u64 = 15;

/// A worker process: `CYCLES` grants of the contended parts, each part's
/// witness entered, its counter incremented, and left.
fn child_worker(reversed: bool) {
    let var = |name| std::env::var(name).expect(name);
    rt().block_on(async {
        let (sq, rd) = (client(&var(CHILD_SQLITE), "child").await, client(&var(CHILD_REDIS), "child").await);
        let multi = contended(&sq, &rd, "px", reversed).ttl(Duration::from_secs(10));
        let witnesses: Vec<Witness> =
            (0..3).map(|p| Witness::new(format!("{}/part-{p}", var(CHILD_DIR))).expect("witness")).collect();
        for _ in 0..CYCLES {
            let guard = multi.acquire_timeout(Duration::from_secs(20)).await.expect("worker acquire");
            let mut inside = Vec::new();
            for (w, (_, fence)) in witnesses.iter().zip(guard.fences()) {
                let entered = w.enter(fence).expect("enter");
                let n = w.counter().expect("read counter");
                tokio::task::yield_now().await;
                w.set_counter(n + 1).expect("write counter");
                inside.push(entered);
            }
            for (w, entered) in witnesses.iter().zip(inside) {
                w.exit(entered).expect("exit");
            }
            guard.release().await.expect("worker release");
        }
    });
}

/// Exclusion across processes: 4 OS processes (2 listing the parts forward,
/// 2 reversed), 15 grants each of the three parts on SQLite and Redis; a
/// witness per part outside the stores sees no overlap, no lost update and
/// fences increasing, and every process finishes (no deadlock).
#[test]
fn processes_exclude_each_other_across_mixed_stores() {
    if let Ok(role) = std::env::var(CHILD_ROLE) {
        return child_worker(role == "reversed");
    }
    let stores = Stores::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let witnesses: Vec<Witness> =
        (0..3).map(|p| Witness::new(dir.path().join(format!("part-{p}"))).expect("witness")).collect();
    for w in &witnesses {
        w.reset(0).expect("reset");
    }
    let started = Instant::now();
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            Command::new(std::env::current_exe().expect("current_exe"))
                .args(["--exact", &test_name("processes_exclude_each_other_across_mixed_stores"), "--nocapture"])
                .env(CHILD_ROLE, if i % 2 == 1 { "reversed" } else { "forward" })
                .env(CHILD_SQLITE, stores.sqlite_url())
                .env(CHILD_REDIS, stores.redis.url())
                .env(CHILD_DIR, dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    for c in &mut children {
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                assert!(status.success(), "a worker process failed: {status}");
                break;
            }
            if started.elapsed() > Duration::from_secs(60) {
                children.iter_mut().for_each(|c| drop(c.kill()));
                panic!("worker processes did not finish in 60 s (a deadlock?)");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    eprintln!("{PROCESSES} processes x {CYCLES} grants in {:?}", started.elapsed());
    for (p, w) in witnesses.iter().enumerate() {
        let report = w.report().expect("report");
        assert_eq!(report.overlaps, 0, "part {p}: two holders inside at once: {report:?}");
        assert_eq!(report.entries, PROCESSES * CYCLES, "part {p}: {report:?}");
        assert_eq!(report.counter, (PROCESSES * CYCLES) as i64, "part {p}: lost updates: {report:?}");
        assert!(report.fences_increasing, "part {p}: fences did not increase in grant order");
    }
}

/// The full name of test `name` of this module, for `--exact` when the
/// binary re-runs itself: `module::name` (the crate's name left off).
fn test_name(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_owned(),
    }
}
