//! The distributed mutex: options, the handle, and the RAII guard.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{AcquireRequest, Backend};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::key::{LockKey, OwnerToken, check_ttl};
use crate::lease::LeaseState;

/// Default lease TTL.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// How a lock is taken and kept. Built with the methods on [`Mutex`] or
/// directly, for [`Client::with_lock`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockOptions {
    /// Lease TTL on the store; default 30 s. A holder that vanishes frees the
    /// key within this time.
    pub ttl: Duration,
    /// Grant in request order (stores that declare `fair`).
    pub fair: bool,
    /// Reentrancy: acquisitions with the same owner value through the same
    /// [`Client`] nest instead of waiting on each other. `None`: not reentrant.
    pub owner: Option<String>,
    /// Renew the lease while the guard lives (default `true`).
    pub auto_renew: bool,
    /// Renewal period; default `ttl / 3`.
    pub renew_every: Option<Duration>,
    /// Stop renewing once the lock has been held this long; the lease then
    /// runs out within one TTL and `lost()` fires. `None`: no cap.
    pub max_hold: Option<Duration>,
    /// Give up waiting after this long ([`Client::with_lock`]); `None`: wait forever.
    pub wait_timeout: Option<Duration>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: DEFAULT_TTL,
            fair: false,
            owner: None,
            auto_renew: true,
            renew_every: None,
            max_hold: None,
            wait_timeout: None,
        }
    }
}

impl LockOptions {
    /// Options with the given TTL.
    pub fn with_ttl(ttl: Duration) -> Self {
        LockOptions { ttl, ..Self::default() }
    }

    fn renew_interval(&self) -> Result<Duration> {
        let every = self.renew_every.unwrap_or(self.ttl / 3);
        if every.is_zero() || every >= self.ttl {
            return Err(Error::invalid(
                "renew_every",
                format!("the renewal period must be above zero and below the TTL ({:?}), got {every:?}", self.ttl),
            ));
        }
        Ok(every)
    }
}

/// A named distributed mutex. Cheap to clone; holds no lock by itself.
///
/// ```no_run
/// # async fn demo() -> holdfast::Result<()> {
/// use std::time::Duration;
/// let client = holdfast::Client::connect("sqlite:///tmp/holdfast-doc.db").await?;
/// let lock = client.mutex("reports/nightly").ttl(Duration::from_secs(10));
/// let guard = lock.acquire_timeout(Duration::from_secs(3)).await?;
/// println!("fence {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    client: Client,
    key: String,
    opts: LockOptions,
}

impl Mutex {
    pub(crate) fn new(client: Client, key: String) -> Self {
        Mutex { client, key, opts: LockOptions::default() }
    }

    /// Sets the lease TTL.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.opts.ttl = ttl;
        self
    }

    /// Asks for grants in request order; acquiring fails with
    /// [`Error::Unsupported`] on a store that cannot queue.
    pub fn fair(mut self, fair: bool) -> Self {
        self.opts.fair = fair;
        self
    }

    /// Makes the lock reentrant for `owner`: while a guard of this owner lives,
    /// further acquisitions by the same owner through the same client return
    /// at once with the same fence, and the key is freed only when every
    /// guard is gone. Async tasks have no thread identity, so the owner is an
    /// explicit value (a job id, a request id).
    pub fn reentrant(mut self, owner: impl Into<String>) -> Self {
        self.opts.owner = Some(owner.into());
        self
    }

    /// Sets the renewal period (default `ttl / 3`).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.opts.renew_every = Some(every);
        self
    }

    /// Caps the total hold time: renewal stops after `max_hold`.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.opts.max_hold = Some(max_hold);
        self
    }

    /// Turns automatic renewal off: the lease lasts one TTL.
    pub fn no_renew(mut self) -> Self {
        self.opts.auto_renew = false;
        self
    }

    /// Replaces all options.
    pub fn options(mut self, opts: LockOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// One attempt: the guard if the key was free, `None` if it is held.
    ///
    /// Cancel safety: dropping the future leaves no grant behind (see
    /// [`acquire`](Self::acquire)).
    pub async fn try_acquire(&self) -> Result<Option<MutexGuard>> {
        self.acquire_inner(false, None).await
    }

    /// Waits for the key without limit.
    ///
    /// # Cancel safety
    ///
    /// Dropping this future at any await point leaves no grant and no queue
    /// entry behind: if the store granted the key while the future was being
    /// dropped, the grant is released by its token in the background.
    pub async fn acquire(&self) -> Result<MutexGuard> {
        self.acquire_inner(true, None).await?.ok_or_else(|| unreachable_busy(&self.key))
    }

    /// Waits for the key at most `timeout`, then fails with [`Error::Timeout`].
    ///
    /// An attempt that was in flight at the deadline (its reply may have been
    /// lost) is released by its token before the error is returned.
    /// Cancel safety as for [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        self.acquire_inner(true, Some(timeout)).await?.ok_or_else(|| unreachable_busy(&self.key))
    }

    async fn acquire_inner(&self, wait: bool, timeout: Option<Duration>) -> Result<Option<MutexGuard>> {
        let key = LockKey::new(self.key.clone())?;
        let ttl = check_ttl(self.opts.ttl)?;
        let interval = self.opts.renew_interval()?;
        let inner = self.client.inner();
        let caps = inner.backend.capabilities();
        if self.opts.fair && !caps.fair {
            return Err(Error::Unsupported { store: inner.backend.name(), what: "fair locks" });
        }
        if let Some(owner) = &self.opts.owner {
            if let Some(held) = self.client.reenter(&key, owner) {
                return Ok(Some(MutexGuard { held, released: false }));
            }
        }
        let started = Instant::now();
        let req = AcquireRequest {
            key: key.clone(),
            token: OwnerToken::random(),
            ttl,
            label: inner.label.clone(),
            wait,
            fair: self.opts.fair || caps.always_fair,
        };
        let span = tracing::debug_span!("acquire", key = %key, wait);
        let mut cleanup = ReleaseOnDrop { backend: Some(inner.backend.clone()), key: key.clone(), token: req.token };
        let attempt = inner.backend.acquire(&req).instrument(span);
        let outcome = match timeout {
            Some(t) => match tokio::time::timeout(t, attempt).await {
                Ok(r) => r,
                Err(_) => {
                    cleanup.release_now().await;
                    return Err(Error::Timeout { key: self.key.clone(), waited: started.elapsed() });
                }
            },
            None => attempt.await,
        };
        let grant = match outcome {
            Ok(Some(grant)) => grant,
            Ok(None) => {
                cleanup.disarm();
                return Ok(None);
            }
            Err(e) => {
                // The request may have been applied before the error (a lost reply).
                cleanup.release_now().await;
                return Err(e);
            }
        };
        cleanup.disarm();
        tracing::debug!(key = %key, fence = grant.fence, "granted");
        let lease =
            Arc::new(LeaseState::new(key, req.token, grant.fence, ttl, grant.attempt_started, grant.session_lost));
        let renewal = self.opts.auto_renew.then(|| inner.renewer.register(lease.clone(), interval, self.opts.max_hold));
        let held = Arc::new(Held {
            client: self.client.clone(),
            lease,
            renewal,
            owner: self.opts.owner.clone(),
            holds: AtomicU32::new(1),
        });
        if let Some(owner) = &self.opts.owner {
            self.client.register_reentrant(owner, &held);
        }
        Ok(Some(MutexGuard { held, released: false }))
    }
}

fn unreachable_busy(key: &str) -> Error {
    // A waiting acquire only returns with a grant or an error; a backend that
    // breaks that contract gets a typed error rather than a panic.
    Error::backend("holdfast", false, format!("backend returned busy to a waiting acquire of {key:?}"))
}

/// Releases an in-flight attempt's token unless disarmed: the core of cancel safety.
struct ReleaseOnDrop {
    backend: Option<Arc<dyn Backend>>,
    key: LockKey,
    token: OwnerToken,
}

impl ReleaseOnDrop {
    fn disarm(&mut self) {
        self.backend = None;
    }

    async fn release_now(&mut self) {
        if let Some(backend) = self.backend.take() {
            if let Err(e) = backend.release(&self.key, self.token).await {
                tracing::warn!(key = %self.key, error = %e, "could not release an abandoned attempt; its lease will expire");
            }
        }
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let Some(backend) = self.backend.take() {
            let (key, token) = (self.key.clone(), self.token);
            spawn_release(backend, key, token);
        }
    }
}

/// Releases in the background when a runtime is there; otherwise the lease expires.
fn spawn_release(backend: Arc<dyn Backend>, key: LockKey, token: OwnerToken) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(async move {
                if let Err(e) = backend.release(&key, token).await {
                    tracing::warn!(key = %key, error = %e, "background release failed; the lease will expire");
                }
            });
        }
        Err(_) => tracing::debug!(key = %key, "no runtime to release in; the lease will expire"),
    }
}

/// What reentrant guards of one grant share.
#[derive(Debug)]
pub(crate) struct Held {
    client: Client,
    pub(crate) lease: Arc<LeaseState>,
    renewal: Option<u64>,
    pub(crate) owner: Option<String>,
    /// Live guards of this grant; only a reentrant lock has more than one.
    pub(crate) holds: AtomicU32,
}

impl Held {
    /// Drops one hold; true if it was the last, and the grant must go.
    fn drop_hold(&self) -> bool {
        let last = match &self.owner {
            Some(owner) => self.client.leave_reentrant(owner, self),
            None => self.holds.fetch_sub(1, Ordering::AcqRel) == 1,
        };
        if last {
            if let Some(id) = self.renewal {
                self.client.inner().renewer.deregister(id);
            }
        }
        last
    }
}

/// A held lock. Dropping it releases the lock.
///
/// # Drop
///
/// Prefer [`release`](Self::release), which reports whether the lease was
/// still held. A guard dropped without it stops renewal and releases in the
/// background when a tokio runtime is running; without a runtime (or if that
/// release fails) the lease simply expires after its TTL.
#[derive(Debug)]
#[must_use = "the lock is released when the guard is dropped"]
pub struct MutexGuard {
    held: Arc<Held>,
    released: bool,
}

impl MutexGuard {
    /// The fencing token of this grant: strictly greater than every fence the
    /// store issued before for this key. Pass it to whatever the lock
    /// protects, and have that reject writes with a lower fence than it saw.
    pub fn fence(&self) -> u64 {
        self.held.lease.fence
    }

    /// The key.
    pub fn key(&self) -> &str {
        self.held.lease.key.as_str()
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.held.lease.ttl
    }

    /// Guards alive for this grant (more than 1 only for reentrant locks).
    pub fn hold_count(&self) -> u32 {
        self.held.holds.load(Ordering::Acquire)
    }

    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.held.lease.is_lost()
    }

    /// Resolves when the lease is lost: renewal found the grant gone, the
    /// store's session ended, or the local lease deadline passed without a
    /// successful renewal. The local deadline is counted from before the
    /// request was sent, minus a drift margin (see
    /// [`drift_margin`](crate::lease_drift_margin)), so this fires before the
    /// store can grant the key to anyone else. Never resolves while the lease
    /// is held; may be awaited after the guard is gone (it is `'static`).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.held.lease.clone().lost()
    }

    /// Resolves when the lease can no longer be guaranteed to last another
    /// `within`: it is lost, or renewal has not succeeded and the time left
    /// on the local lease deadline has fallen to `within`. Use it to stop
    /// work that needs `within` to wind down (a child process that gets
    /// SIGTERM, then SIGKILL after a grace period) before the store can
    /// grant the key to anyone else. With `within` zero it is [`lost`](Self::lost).
    /// May be awaited after the guard is gone (it is `'static`).
    pub fn expiring(&self, within: Duration) -> impl Future<Output = ()> + Send + 'static {
        self.held.lease.clone().expiring(within)
    }

    /// Releases the lock, owner-checked. With reentrancy, only the last
    /// guard's release frees the key.
    ///
    /// Fails with [`Error::Lost`] if the lease had expired or been taken
    /// over before the release (the work done under it may have overlapped
    /// another holder), or a backend error; in both cases the lock is not
    /// held by this client afterwards (or expires).
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        if !self.held.drop_hold() {
            return Ok(());
        }
        let lease = &self.held.lease;
        let span = tracing::debug_span!("release", key = %lease.key, fence = lease.fence);
        let was_lost = lease.is_lost();
        let backend = self.held.client.inner().backend.clone();
        match backend.release(&lease.key, lease.token).instrument(span).await {
            Ok(true) if !was_lost => Ok(()),
            Ok(_) => {
                lease.mark_lost();
                Err(Error::Lost { key: lease.key.to_string() })
            }
            Err(e) => {
                lease.mark_lost();
                Err(e)
            }
        }
    }
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        if self.released || !self.held.drop_hold() {
            return;
        }
        let lease = &self.held.lease;
        spawn_release(self.held.client.inner().backend.clone(), lease.key.clone(), lease.token);
    }
}
