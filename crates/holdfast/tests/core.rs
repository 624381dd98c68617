//! Behaviour of the client core that every store shares, on the embedded
//! SQLite store (a real database file, no mock).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use holdfast::backend::sqlite::SqliteBackend;
use holdfast::backend::{AcquireRequest, Backend, Grant, LockStatus, RenewRequest};
use holdfast::{Capabilities, Client, ClientOptions, Error, LockKey, LockOptions, OwnerToken};

/// A real SQLite store that counts the renew calls reaching it.
#[derive(Debug)]
struct CountingRenewals {
    inner: SqliteBackend,
    calls: AtomicU64,
    leases: AtomicU64,
}

#[async_trait]
impl Backend for CountingRenewals {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> holdfast::Result<Option<Grant>> {
        self.inner.acquire(req).await
    }
    async fn release(&self, key: &LockKey, token: OwnerToken) -> holdfast::Result<bool> {
        self.inner.release(key, token).await
    }
    async fn renew(&self, leases: &[RenewRequest]) -> holdfast::Result<Vec<bool>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.leases.fetch_add(leases.len() as u64, Ordering::SeqCst);
        self.inner.renew(leases).await
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
    let backend = Arc::new(CountingRenewals {
        inner: SqliteBackend::open_url(&sqlite_url(&dir)).await.unwrap(),
        calls: AtomicU64::new(0),
        leases: AtomicU64::new(0),
    });
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
