//! Faults of the embedded SQLite store that the conformance suite does not
//! reach: clients that meet at the same instant on a file nobody created
//! yet, waiters on a file that another process keeps locked, and rows that
//! crashed holders leave behind.
#![cfg(feature = "sqlite")]

use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use holdfast::backend::{AcquireRequest, Backend};
use holdfast::stores::sqlite::SqliteBackend;
use holdfast::{Client, Error, LockKey, OwnerToken};

/// Opens the store at `url` and makes one non-waiting acquire and, if
/// granted, a release: what a cron job does first.
async fn open_and_use(url: &str) -> holdfast::Result<()> {
    let store = SqliteBackend::open_url(url).await?;
    let req =
        AcquireRequest::new(LockKey::new("nightly")?, OwnerToken::random(), Duration::from_secs(5)).with_label("test");
    if store.try_acquire(&req).await?.is_some() {
        store.release(&req.key, req.token).await?;
    }
    Ok(())
}

/// Runs [`open_and_use`] on its own current-thread runtime, as a separate
/// program would.
fn open_and_use_blocking(url: &str) -> holdfast::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(open_and_use(url))
}

/// Many fresh files, each opened by several threads released by one barrier:
/// not one open or first acquire may fail, however the first-use steps
/// (creating the file, switching to WAL, creating the tables) interleave.
#[test]
fn concurrent_first_open_of_a_new_file_never_fails() {
    const FILES: usize = 150;
    const CLIENTS: usize = 4;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut failures = Vec::new();
    for f in 0..FILES {
        let url = format!("sqlite://{}/fresh-{f}.db", dir.path().display());
        let barrier = Arc::new(Barrier::new(CLIENTS));
        let threads: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let (url, barrier) = (url.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    open_and_use_blocking(&url)
                })
            })
            .collect();
        for t in threads {
            if let Err(e) = t.join().expect("client thread panicked") {
                failures.push(format!("file {f}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} first opens failed: {failures:#?}", failures.len(), FILES * CLIENTS);
}

const CHILD_URL: &str = "HOLDFAST_SQLITE_CHILD_URL";
const CHILD_START_NS: &str = "HOLDFAST_SQLITE_CHILD_START_NS";

fn unix_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// The same across OS processes: each process (this test binary run again
/// as a child) waits for a shared start instant on the wall clock, then opens
/// the fresh file. A child reports failure through its exit status.
#[test]
fn concurrent_first_open_across_processes_never_fails() {
    if let Ok(url) = std::env::var(CHILD_URL) {
        let start: u128 = std::env::var(CHILD_START_NS).expect("start instant").parse().expect("start ns");
        // Sleep most of the way, then spin, so the processes start together.
        while unix_ns() + 2_000_000 < start {
            std::thread::sleep(Duration::from_micros(500));
        }
        while unix_ns() < start {
            std::hint::spin_loop();
        }
        if let Err(e) = open_and_use_blocking(&url) {
            eprintln!("HOLDFAST_CHILD_ERROR {e}");
            std::process::exit(3);
        }
        std::process::exit(0);
    }
    const FILES: usize = 40;
    const CLIENTS: usize = 3;
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("current_exe");
    let mut failures = Vec::new();
    for f in 0..FILES {
        let url = format!("sqlite://{}/fresh-{f}.db", dir.path().display());
        // Far enough ahead for every child to have started and loaded.
        let start = unix_ns() + 150_000_000;
        let children: Vec<_> = (0..CLIENTS)
            .map(|_| {
                Command::new(&exe)
                    .args(["--exact", &test_name("concurrent_first_open_across_processes_never_fails"), "--nocapture"])
                    .env(CHILD_URL, &url)
                    .env(CHILD_START_NS, start.to_string())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn child")
            })
            .collect();
        for c in children {
            let out = c.wait_with_output().expect("child output");
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                let line = err.lines().find(|l| l.contains("HOLDFAST_CHILD_ERROR")).unwrap_or(&err);
                failures.push(format!("file {f}: {}: {line}", out.status));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} first opens failed: {failures:#?}", failures.len(), FILES * CLIENTS);
}

/// The embedded store's "server is gone": another process keeps the file's
/// write lock (an open `BEGIN IMMEDIATE`) for longer than the busy timeout
/// while clients wait on a key. When the holder's lease runs out, their
/// attempts cannot write: `acquire_timeout` fails with the store's error
/// (`Error::Backend`, exit 69 in the CLI), not `Error::Timeout` ("busy",
/// exit 75) at its deadline, and a waiting `acquire` does not wait forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_on_a_write_locked_file_gets_the_store_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("locks.db");
    let url = format!("sqlite://{}?busy_timeout_ms=300", path.display());
    // A holder whose lease is not renewed: it runs out in a second.
    let holder = holdfast::stores::connect(&url).await.expect("open");
    let mut req =
        AcquireRequest::new(LockKey::new("locked/key").expect("key"), OwnerToken::random(), Duration::from_secs(1))
            .with_label("holder");
    assert!(holder.try_acquire(&req).await.expect("hold").is_some());
    let b = Client::connect(&url).await.expect("connect");
    let (b1, b2) = (b.clone(), b.clone());
    let bounded = tokio::spawn(async move { b1.mutex("locked/key").acquire_timeout(Duration::from_secs(8)).await });
    let unbounded = tokio::spawn(async move { b2.mutex("locked/key").acquire().await });
    let other = rusqlite::Connection::open(&path).expect("open");
    other.execute_batch("BEGIN IMMEDIATE").expect("take the write lock");
    let locked = std::time::Instant::now();
    for (what, waiter) in [("acquire_timeout", bounded), ("acquire", unbounded)] {
        let outcome = tokio::time::timeout(Duration::from_secs(15), waiter)
            .await
            .unwrap_or_else(|_| panic!("{what} still waits {:?} after the file was locked", locked.elapsed()))
            .expect("task");
        match outcome {
            Err(Error::Backend { .. }) => {}
            Err(e) => panic!("{what} on a write-locked file: {e:?}, not the store's error"),
            Ok(_) => panic!("{what} granted on a write-locked file"),
        }
    }
    drop(other);
    // The file is free again: the key can be taken.
    req.token = OwnerToken::random();
    assert!(holder.try_acquire(&req).await.expect("acquire once the file is free").is_some());
}

/// The write-ahead log stays small however many transactions the client
/// makes back to back: a checkpoint that never lets the log start over (a
/// passive one on a connection of its own, tried for the fsync stalls a
/// checkpoint puts in front of lock calls) grew it to 60 MB here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_stays_small_under_back_to_back_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("locks.db");
    let client = Client::connect(&format!("sqlite://{}", path.display())).await.expect("connect");
    for i in 0..3000 {
        let guard = client.mutex(format!("wal/{}", i % 50)).try_acquire().await.expect("try_acquire").expect("free");
        guard.release().await.expect("release");
    }
    let wal = std::fs::metadata(dir.path().join("locks.db-wal")).map(|m| m.len()).unwrap_or(0);
    assert!(wal < 8 << 20, "the write-ahead log grew to {wal} bytes over 6,000 transactions");
}

/// Rows of holders that died long ago (a crashed process never releases)
/// are swept by a later release of any key, about once a second per client,
/// and a holder that died recently keeps its row (and its fence's place).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_long_dead_holders_are_swept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("locks.db");
    let client = Client::connect(&format!("sqlite://{}", path.display())).await.expect("connect");
    client.mutex("sweep/warm").try_acquire().await.expect("try").expect("free").release().await.expect("release");
    let other = rusqlite::Connection::open(&path).expect("open");
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as i64;
    let insert = "INSERT INTO holdfast_grants
        (key, token, mode, weight, limit_n, held, fence, label, acquired_at_ms, until_ms)
        VALUES (?1, randomblob(16), 0, 1, 0, 1, 1, 'crashed', ?2, ?2)";
    for i in 0..300 {
        other.execute(insert, rusqlite::params![format!("sweep/dead/{i}"), now_ms - 120_000]).expect("dead row");
    }
    other.execute(insert, rusqlite::params!["sweep/recent", now_ms - 1_000]).expect("recent row");
    let count = |like: &str| -> i64 {
        other.query_row("SELECT count(*) FROM holdfast_grants WHERE key LIKE ?1", [like], |r| r.get(0)).expect("count")
    };
    // Two sweeps of at most 256 rows, a second or more apart.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        client.mutex("sweep/other").try_acquire().await.expect("try").expect("free").release().await.expect("release");
    }
    assert_eq!(count("sweep/dead/%"), 0, "rows of holders dead for two minutes were not swept");
    assert_eq!(count("sweep/recent"), 1, "the row of a holder dead for a second was swept");
}

/// The full name of test `name` of this module, for `--exact` when the
/// binary re-runs itself: `module::name` (the crate's name left off).
fn test_name(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_owned(),
    }
}

/// A mistyped path is an error naming what is missing, not a new store:
/// the directory is never created, and under `mode=rw` neither is the file.
#[tokio::test]
async fn a_missing_directory_or_file_is_an_error_naming_it_and_nothing_is_created() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing_dir = dir.path().join("no-such-dir");
    let url = format!("sqlite://{}/locks.db", missing_dir.display());
    let err = SqliteBackend::open_url(&url).await.expect_err("a missing directory must fail");
    let text = err.to_string();
    assert!(matches!(err, Error::Backend { store: "sqlite", retryable: false, .. }), "{err:?}");
    assert!(text.contains(&format!("directory {} does not exist", missing_dir.display())), "{text}");
    assert!(!missing_dir.exists(), "the directory was created");

    let file = dir.path().join("typo.db");
    let err = SqliteBackend::open_url(&format!("sqlite://{}?mode=rw", file.display()))
        .await
        .expect_err("mode=rw on a missing file must fail");
    assert!(err.to_string().contains("no such database file"), "{err}");
    assert!(!file.exists(), "mode=rw created the file");

    // The default mode creates the file; mode=rw then opens it.
    open_and_use(&format!("sqlite://{}", file.display())).await.expect("default mode creates the file");
    open_and_use(&format!("sqlite://{}?mode=rw", file.display())).await.expect("mode=rw opens an existing file");
}

/// The holder is told why its lease was lost: a forced release is
/// `Removed` (found at the next renewal), a lease left to run out `Expired`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_is_told_why_its_lease_was_lost() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    let (holder, admin) =
        (Client::connect(&url).await.expect("connect"), Client::connect(&url).await.expect("connect"));

    let guard = holder.mutex("forced").ttl(Duration::from_secs(3)).acquire().await.expect("acquire");
    assert_eq!(guard.lost_reason(), None);
    assert!(!admin.force_release("forced").await.expect("force release").was_free());
    // Renewal runs every second: the loss is found well before the 3 s deadline.
    tokio::time::timeout(Duration::from_secs(20), guard.lost()).await.expect("lost() after a forced release");
    assert_eq!(guard.lost_reason(), Some(holdfast::LostReason::Removed));
    assert!(guard.lost_reason().unwrap().to_string().contains("forced release"));

    let guard = holder.mutex("expired").ttl(Duration::from_millis(300)).no_renew().acquire().await.expect("acquire");
    tokio::time::timeout(Duration::from_secs(20), guard.lost()).await.expect("lost() at the deadline");
    assert_eq!(guard.lost_reason(), Some(holdfast::LostReason::Expired));
}
