//! Behaviour of the client core that every store shares, on the embedded
//! SQLite store (a real database file, no mock).

use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use holdfast::backend::{AcquireRequest, Backend, Grant, LockStatus, RenewRequest};
use holdfast::stores::sqlite::SqliteBackend;
use holdfast::{Capabilities, Client, ClientOptions, Error, LockKey, LockOptions, OwnerToken};

/// A real SQLite store that counts the renew calls reaching it and, while
/// `down` is set, fails waiting acquires with a retryable store error: a
/// store outage as the client sees it.
#[derive(Debug)]
struct Instrumented {
    inner: SqliteBackend,
    calls: AtomicU64,
    leases: AtomicU64,
    /// The most leases one renew call carried.
    largest: AtomicU64,
    down: std::sync::atomic::AtomicBool,
    failed: AtomicU64,
    /// How long each renew call waits before it reaches the store (ms).
    renew_delay_ms: AtomicU64,
    /// Renew calls that have started.
    renews_started: AtomicU64,
    /// Renew calls in flight now, and the most at once.
    renews_in_flight: AtomicU64,
    most_in_flight: AtomicU64,
}

impl Instrumented {
    async fn open(dir: &tempfile::TempDir) -> Arc<Self> {
        Arc::new(Instrumented {
            inner: SqliteBackend::open_url(&sqlite_url(dir)).await.unwrap(),
            calls: AtomicU64::new(0),
            leases: AtomicU64::new(0),
            largest: AtomicU64::new(0),
            down: false.into(),
            failed: AtomicU64::new(0),
            renew_delay_ms: AtomicU64::new(0),
            renews_started: AtomicU64::new(0),
            renews_in_flight: AtomicU64::new(0),
            most_in_flight: AtomicU64::new(0),
        })
    }
}

#[async_trait]
impl Backend for Instrumented {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        // Slices as a network store asks for them (SQLite itself renews in
        // one transaction per tick), to test the client's slicing.
        caps.renew_slice = Some(256);
        caps
    }
    async fn try_acquire(&self, req: &AcquireRequest) -> holdfast::Result<Option<Grant>> {
        self.inner.try_acquire(req).await
    }
    async fn acquire(&self, req: &AcquireRequest) -> holdfast::Result<Grant> {
        if self.down.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            return Err(Error::backend("sqlite", true, "store unreachable (injected)"));
        }
        self.inner.acquire(req).await
    }
    async fn release(&self, key: &LockKey, token: OwnerToken) -> holdfast::Result<bool> {
        self.inner.release(key, token).await
    }
    async fn renew(&self, leases: &[RenewRequest]) -> holdfast::Result<Vec<bool>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.leases.fetch_add(leases.len() as u64, Ordering::SeqCst);
        self.largest.fetch_max(leases.len() as u64, Ordering::SeqCst);
        self.renews_started.fetch_add(1, Ordering::SeqCst);
        let now = self.renews_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(self.renew_delay_ms.load(Ordering::SeqCst))).await;
        let held = self.inner.renew(leases).await;
        self.renews_in_flight.fetch_sub(1, Ordering::SeqCst);
        held
    }
    async fn status(&self, key: &LockKey) -> holdfast::Result<LockStatus> {
        self.inner.status(key).await
    }
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}/locks.db", dir.path().display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_batched_per_client() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Instrumented::open(&dir).await;
    let client = Client::with_backend(backend.clone(), ClientOptions::default());
    let n = 300u64;
    let mut guards = Vec::new();
    for i in 0..n {
        guards.push(client.mutex(format!("batch/{i}")).ttl(Duration::from_millis(600)).acquire().await.unwrap());
    }
    assert_eq!(client.renewing_leases(), n as usize);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (calls, leases) = (backend.calls.load(Ordering::SeqCst), backend.leases.load(Ordering::SeqCst));
    // Every lease was renewed several times (1.5 s at a 200 ms period)...
    assert!(leases >= n * 3, "only {leases} lease renewals for {n} leases");
    // ...in a few batched calls, not one call per lease per tick.
    assert!(calls * 20 <= leases, "{calls} renew calls for {leases} lease renewals: not batched");
    for g in &guards {
        assert!(!g.is_lost());
    }
    for g in guards {
        g.release().await.unwrap();
    }
    assert_eq!(client.renewing_leases(), 0);
}

/// Acquires `n` keys `{prefix}/{i}` with `ttl`, 32 at a time.
async fn hold_many(client: &Client, prefix: &str, n: u64, ttl: Duration) -> Vec<holdfast::MutexGuard> {
    futures::stream::iter(0..n)
        .map(|i| {
            let mutex = client.mutex(format!("{prefix}/{i}")).ttl(ttl);
            async move { mutex.acquire().await.unwrap() }
        })
        .buffer_unordered(32)
        .collect()
        .await
}

/// Many leases due at once are renewed in the slices the store asks for, not
/// one call that holds the store (and the client's other calls) for its whole
/// length: at 100,000 leases on Redis that one tick took 370-490 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_go_in_bounded_slices() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Instrumented::open(&dir).await;
    let client = Client::with_backend(backend.clone(), ClientOptions::default());
    let n = 2_000u64;
    let guards = hold_many(&client, "slices", n, Duration::from_secs(6)).await;
    // Each call takes a little while, as over a network, so that slices due
    // together would overlap if the client sent them all at once.
    backend.renew_delay_ms.store(80, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let (calls, leases, largest) = (
        backend.calls.load(Ordering::SeqCst),
        backend.leases.load(Ordering::SeqCst),
        backend.largest.load(Ordering::SeqCst),
    );
    assert!(leases >= n, "only {leases} lease renewals for {n} leases");
    assert!(largest <= 256, "one renew call carried {largest} leases");
    assert!(calls * 100 <= leases, "{calls} renew calls for {leases} lease renewals: not batched");
    // A renewal that keeps up sends its slices one after another: each call
    // in flight is one more that the client's other calls find ahead of them.
    let most = backend.most_in_flight.load(Ordering::SeqCst);
    assert_eq!(most, 1, "{most} renew calls were in flight at once while renewal kept up");
    assert!(guards.iter().all(|g| !g.is_lost()), "a lease was lost");
    for g in guards {
        g.release().await.unwrap();
    }
}

/// A store slow enough that one renew call at a time cannot keep up (2,000
/// leases in 8 slices of 400 ms each: 3.2 s a round, against a 3 s TTL)
/// makes the client overlap its calls once renewal falls a quarter interval
/// behind, and no lease is lost; one call at a time lost them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_that_falls_behind_overlaps_its_calls() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Instrumented::open(&dir).await;
    let client = Client::with_backend(backend.clone(), ClientOptions::default());
    let n = 2_000u64;
    let guards = hold_many(&client, "behind", n, Duration::from_secs(3)).await;
    backend.renew_delay_ms.store(400, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(6500)).await;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    assert_eq!(lost, 0, "{lost} of {n} leases lost behind a slow store");
    let most = backend.most_in_flight.load(Ordering::SeqCst);
    assert!(most > 1, "renewal never overlapped its calls ({most} at most)");
    backend.renew_delay_ms.store(0, Ordering::SeqCst);
    for g in guards {
        g.release().await.unwrap();
    }
}

#[tokio::test]
async fn with_lock_runs_and_releases() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::connect(&sqlite_url(&dir)).await.unwrap();
    let fence = client.with_lock("job", LockOptions::default(), async |g| g.fence()).await.unwrap();
    assert!(fence > 0);
    // Released afterwards.
    assert!(client.mutex("job").try_acquire().await.unwrap().is_some());
}

#[tokio::test]
async fn with_lock_stops_work_when_the_lease_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::connect(&sqlite_url(&dir)).await.unwrap();
    let mut opts = LockOptions::with_ttl(Duration::from_millis(300));
    opts.max_hold = Some(Duration::from_millis(100));
    let finished = Arc::new(AtomicU64::new(0));
    let f = finished.clone();
    let outcome = client
        .with_lock("long-job", opts, async move |_g| {
            tokio::time::sleep(Duration::from_secs(5)).await;
            f.store(1, Ordering::SeqCst);
        })
        .await;
    assert!(matches!(outcome, Err(Error::Lost { .. })), "got {outcome:?}");
    assert_eq!(finished.load(Ordering::SeqCst), 0, "work kept running after the lease was lost");
}

#[tokio::test]
async fn with_lock_wait_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::connect(&sqlite_url(&dir)).await.unwrap();
    let _held = client.mutex("busy").acquire().await.unwrap();
    let mut opts = LockOptions::default();
    opts.wait_timeout = Some(Duration::from_millis(100));
    let outcome = client.with_lock("busy", opts, async |_| ()).await;
    assert!(matches!(outcome, Err(Error::Timeout { .. })), "got {outcome:?}");
}

#[tokio::test]
async fn status_shows_holder_label_fence_and_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let client =
        Client::connect_with(&sqlite_url(&dir), ClientOptions::default().with_label("worker-7")).await.unwrap();
    assert!(client.status("s").await.unwrap().holder.is_none());
    let g = client.mutex("s").ttl(Duration::from_secs(10)).acquire().await.unwrap();
    let holder = client.status("s").await.unwrap().holder.expect("a holder");
    assert_eq!(holder.label, "worker-7");
    assert_eq!(holder.fence, g.fence());
    let left = holder.ttl_left.expect("ttl");
    assert!(left > Duration::from_secs(5) && left <= Duration::from_secs(10), "{left:?}");
}

#[tokio::test]
async fn fences_survive_reopening_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let first = {
        let client = Client::connect(&sqlite_url(&dir)).await.unwrap();
        let g = client.mutex("k").acquire().await.unwrap();
        let f = g.fence();
        g.release().await.unwrap();
        f
    };
    let client = Client::connect(&sqlite_url(&dir)).await.unwrap();
    let g = client.mutex("k").acquire().await.unwrap();
    assert!(g.fence() > first);
}

async fn outage_client(dir: &tempfile::TempDir, store_retry: Duration) -> (Arc<Instrumented>, Client) {
    let backend = Instrumented::open(dir).await;
    let client = Client::with_backend(backend.clone(), ClientOptions::default().with_store_retry(store_retry));
    (backend, client)
}

/// The one waiting policy: a short outage is ridden out with the same
/// token; a store failing at the deadline is a store error, not `Timeout`;
/// one failing for longer than `store_retry` ends the wait with its error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_policy_rides_out_short_outages_and_reports_long_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (store, client) = outage_client(&dir, Duration::from_secs(2)).await;

    // A short outage: the waiter keeps waiting and is granted afterwards.
    store.down.store(true, Ordering::SeqCst);
    let waiter = tokio::spawn({
        let c = client.clone();
        async move { c.mutex("k").acquire_timeout(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(store.failed.load(Ordering::SeqCst) >= 2, "the waiter did not retry");
    store.down.store(false, Ordering::SeqCst);
    let g = waiter.await.unwrap().expect("granted after a short outage");
    g.release().await.unwrap();

    // The deadline passes while the store fails: the store's error.
    store.down.store(true, Ordering::SeqCst);
    let t = std::time::Instant::now();
    match client.mutex("k").acquire_timeout(Duration::from_millis(600)).await {
        Err(Error::Backend { retryable: true, .. }) => {}
        other => panic!("a store failing at the deadline must be a store error, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());

    // An outage longer than store_retry ends an unbounded wait.
    let t = std::time::Instant::now();
    match tokio::time::timeout(Duration::from_secs(10), client.mutex("k").acquire()).await {
        Ok(Err(Error::Backend { .. })) => {}
        other => panic!("an unbounded wait on a dead store must end with its error, got {other:?}"),
    }
    let took = t.elapsed();
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(4), "gave up after {took:?}");

    // A busy key at the deadline, on a healthy store, is `Timeout`.
    store.down.store(false, Ordering::SeqCst);
    let _held = client.mutex("k").acquire().await.unwrap();
    match client.mutex("k").acquire_timeout(Duration::from_millis(200)).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("busy must be Timeout, got {other:?}"),
    }
}

/// `LockOptions::wait_timeout` bounds `acquire()` (it was ignored).
#[tokio::test]
async fn acquire_honours_wait_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::connect(&sqlite_url(&dir)).await.unwrap();
    let _held = client.mutex("busy").acquire().await.unwrap();
    let mut opts = LockOptions::default();
    opts.wait_timeout = Some(Duration::from_millis(200));
    let outcome = tokio::time::timeout(Duration::from_secs(5), client.mutex_with_options("busy", opts).acquire()).await;
    assert!(matches!(outcome, Ok(Err(Error::Timeout { .. }))), "got {outcome:?}");
    let outcome = tokio::time::timeout(
        Duration::from_secs(5),
        client.mutex("busy").wait_timeout(Duration::from_millis(200)).acquire(),
    )
    .await;
    assert!(matches!(outcome, Ok(Err(Error::Timeout { .. }))), "got {outcome:?}");
}

/// Renewal periods that guarantee loss or hammer the store are refused
/// before any I/O.
#[tokio::test]
async fn renewal_periods_that_cannot_work_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::connect(&sqlite_url(&dir)).await.unwrap();
    let ttl = Duration::from_secs(3);
    for every in [Duration::from_millis(1), Duration::from_millis(2900), Duration::from_secs(3)] {
        match client.mutex("r").ttl(ttl).renew_every(every).try_acquire().await {
            Err(Error::InvalidInput { what: "renew_every", .. }) => {}
            other => panic!("renew_every {every:?} with ttl {ttl:?} must be refused, got {other:?}"),
        }
    }
    assert!(client.mutex("r").ttl(ttl).try_acquire().await.unwrap().is_some(), "nothing was written");
}

/// A client made in one runtime keeps renewing in the next one: the renewal
/// task is started again when the runtime that ran it has shut down.
#[test]
fn renewal_outlives_the_first_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let rt = || tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let first = rt();
    let client = first.block_on(async {
        let client = Client::connect(&sqlite_url(&dir)).await.unwrap();
        client.mutex("warm-up").acquire().await.unwrap().release().await.unwrap();
        client
    });
    drop(first);
    rt().block_on(async {
        let g = client.mutex("k").ttl(Duration::from_millis(300)).acquire().await.unwrap();
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(!g.is_lost(), "the lease was not renewed in the second runtime");
        let other = Client::connect(&sqlite_url(&dir)).await.unwrap();
        assert!(other.mutex("k").try_acquire().await.unwrap().is_none(), "the key expired: renewal is dead");
        g.release().await.unwrap();
    });
}

/// `leak()` keeps the lock, unrenewed, until its TTL runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leak_keeps_the_lock_until_its_lease_runs_out() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::connect(&sqlite_url(&dir)).await.unwrap();
    let g = client.mutex("leaked").ttl(Duration::from_millis(500)).acquire().await.unwrap();
    let leaked_at = std::time::Instant::now();
    g.leak();
    assert_eq!(client.renewing_leases(), 0, "a leaked lease is still renewed");
    assert!(client.mutex("leaked").try_acquire().await.unwrap().is_none(), "leak released the lock");
    let g = client.mutex("leaked").acquire_timeout(Duration::from_secs(3)).await.unwrap();
    let took = leaked_at.elapsed();
    assert!(took >= Duration::from_millis(400) && took < Duration::from_millis(1500), "free after {took:?}");
    g.release().await.unwrap();
}

/// `expiring(d)` fires `d` before the local deadline when renewal stops;
/// `lost()` at the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_fires_ahead_of_lost() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::connect(&sqlite_url(&dir)).await.unwrap();
    let t = std::time::Instant::now();
    let g = client.mutex("e").ttl(Duration::from_millis(800)).no_renew().acquire().await.unwrap();
    g.expiring(Duration::from_millis(400)).await;
    let expiring_at = t.elapsed();
    assert!(!g.is_lost());
    g.lost().await;
    let lost_at = t.elapsed();
    assert!(expiring_at >= Duration::from_millis(350) && expiring_at < Duration::from_millis(450), "{expiring_at:?}");
    assert!(lost_at >= Duration::from_millis(750) && lost_at < Duration::from_millis(850), "{lost_at:?}");
}

/// Guards move between tasks and threads.
#[test]
fn guard_and_handles_are_send_sync_static() {
    fn check<T: Send + Sync + 'static>() {}
    check::<holdfast::MutexGuard>();
    check::<holdfast::Mutex>();
    check::<holdfast::Permit>();
    check::<holdfast::Semaphore>();
    check::<holdfast::ReadGuard>();
    check::<holdfast::WriteGuard>();
    check::<holdfast::RwLock>();
    check::<holdfast::Election>();
    check::<holdfast::Leadership>();
    check::<Client>();
    check::<Error>();
}

/// Log lines, captured from the current thread.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Leases released while a renewal of them is in flight are not reported as
/// lost: the renewal finds them gone in the store, and that is the release,
/// not a loss (it logged hundreds of "lease gone at renewal" warnings).
#[test]
fn releasing_during_a_renewal_logs_no_lease_loss() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    // Installed so that a "never" another test cached cannot hide a warning.
    let _installed = crate::observability::spans::install(subscriber);
    // One thread: the renewal task logs where the subscriber is.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let backend = Instrumented::open(&dir).await;
        let client = Client::with_backend(backend.clone(), ClientOptions::default());
        let mut guards = Vec::new();
        for i in 0..500 {
            guards.push(client.mutex(format!("gone/{i}")).ttl(Duration::from_millis(900)).acquire().await.unwrap());
        }
        backend.renew_delay_ms.store(150, Ordering::SeqCst);
        let started = backend.renews_started.load(Ordering::SeqCst);
        while backend.renews_started.load(Ordering::SeqCst) == started {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // Renewal slices are in flight (each waits 150 ms): release them all now.
        for g in guards {
            g.release().await.expect("release");
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(client.renewing_leases(), 0);
    });
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(!text.contains("lease gone"), "released leases reported lost:\n{text}");
}

/// `Guard::valid_until`: the local deadline lies within one TTL of the
/// acquire, before the store's own expiry by the drift margin; renewal
/// moves it later; `is_lost()` turns true once it has passed unrenewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_until_is_the_local_deadline_renewal_moves() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Instrumented::open(&dir).await;
    let client = Client::with_backend(backend, ClientOptions::default());
    let ttl = Duration::from_millis(600);
    let before = std::time::Instant::now();
    let guard = client.mutex("valid-until").ttl(ttl).acquire().await.unwrap();
    let after = std::time::Instant::now();
    let first = guard.valid_until();
    let margin = holdfast::LockOptions::drift_margin(ttl);
    // Counted from when the request was sent (between `before` and `after`), minus the margin.
    assert!(
        first >= before + ttl - margin && first <= after + ttl - margin,
        "{first:?} not within [{before:?}, {after:?}] + ttl - margin"
    );
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(guard.valid_until() > first, "renewal (every ttl/3) moved the deadline later");
    assert!(!guard.is_lost());
    // Stop renewing: the deadline stays put and then passes.
    let last = guard.valid_until();
    let lost = guard.lost();
    guard.leak();
    lost.await;
    assert!(std::time::Instant::now() >= last);
}
