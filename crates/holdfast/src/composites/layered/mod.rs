//! The layered hybrid lock: a fast store filters, a consistent store
//! arbitrates.
//!
//! [`Layered`] is a [`Backend`] over two others: a *fast* store (Redis,
//! usually) in front of an *authoritative* one (PostgreSQL, ZooKeeper,
//! etcd). Every acquisition takes the key on the fast store first, waiting
//! there, and only then on the authoritative store. Contenders queue on the
//! fast store, so the authoritative store sees about one contender per key
//! at a time instead of all of them: the fast store only cuts the contention
//! that reaches the authoritative one. Because it is a `Backend`, every
//! primitive of [`Client`](crate::Client) works over it (mutex, semaphore,
//! read-write lock, election), with renewal, `lost()`, cancel cleanup and
//! the waiting policy. Open it with `layered://FAST_URL|AUTH_URL`, or build
//! it with [`Layered::new`] over any two stores.
//!
//! # Guarantees and where they end
//!
//! - **Exclusion, fences and `lost()` are exactly the authoritative
//!   store's.** No grant is made without the authoritative store's grant;
//!   the [`Grant`] (fence, validity, session signal) is the one the
//!   authoritative store returned; renewal succeeds or fails by the
//!   authoritative store's answer alone, and [`status`](Backend::status) is
//!   its view. The fence durability, fence floors and session-bound leases
//!   declared are the authoritative store's.
//! - **The fast store is never trusted for safety.** A fast store that
//!   restarts without its data, loses a lease, fails over to a replica that
//!   missed a write or lets two clients in at once only lets more contention
//!   through to the authoritative store, which still grants one holder: never
//!   two holders, never a lower fence.
//! - **The fast store is not a single point of failure.** When a call to it
//!   fails with a retryable error (down, unreachable, timing out), the
//!   acquisition goes on on the authoritative store alone, which keeps
//!   exclusion by itself; the client then skips the fast store for
//!   [`FAST_RETRY_AFTER`] before it tries it again, so an outage costs one
//!   failed call per second, not one per acquisition. Any other refusal of
//!   the fast store (a semaphore limit it recorded before a resize the fast
//!   store missed, an unsupported request) also sends that request to the
//!   authoritative store alone, whose answer is the one returned.
//! - **What the filter does not give:** while the fast store is skipped,
//!   every contender reaches the authoritative store (it is then as loaded as
//!   without the filter). Fair ordering, where declared, is the fast store's
//!   queue order, kept by the authoritative store for those who reach it;
//!   requests that bypassed a failing fast store are not in that order.
//!
//! # A store down at start
//!
//! [`open_url`](Layered::open_url) (and `layered://` in
//! [`Client::connect`](crate::Client::connect)) builds the lock while
//! either store is down: a store that cannot be reached is a
//! deferred ([`connect_or_defer`](crate::stores::connect_or_defer)) store, connected in the background
//! with backoff, that fails every call retryably until it answers. A fast
//! store down at start is therefore a failing fast store as above
//! (acquisitions go to the authoritative store alone, which is tried again
//! every [`FAST_RETRY_AFTER`]); an authoritative store down at start fails
//! every acquisition with a retryable store error naming it, and the
//! client's waiting policy rides it out until it answers. A malformed URL
//! fails at once.
//!
//! # How each call is layered
//!
//! - `acquire`: the fast store's `acquire` (waiting there, woken by its
//!   notification), then the authoritative store's `acquire`. While it waits
//!   on the authoritative store (held there by a client that bypassed the
//!   fast store, or by a late renewal) the fast lease is kept alive every
//!   third of the TTL, so that the waiter keeps its place as the filter's
//!   holder.
//! - `try_acquire`: one try on the fast store (busy there: busy, without
//!   touching the authoritative store), then one on the authoritative store;
//!   busy there, the fast lease is released before `Ok(None)` is returned.
//! - `renew`: both stores at once; the authoritative store's result is the
//!   result. A slow fast store is given [`FAST_RENEW_GRACE`] after the
//!   authoritative store answered and then dropped: a fast lease that runs
//!   out only lets more contention through.
//! - `release`: the authoritative store first, then the fast one (so the next
//!   fast waiter reaches an authoritative store that is free), whatever the
//!   first answered; the authoritative store's answer (or error) is the
//!   result. Both stores are always asked, so the client's release after a
//!   dropped or failed acquire removes every grant and queue entry left on
//!   either store.
//! - `resize` goes to both (the fast store's answer ignored), `relabel` and
//!   `raise_fence` to the authoritative store only.
//!
//! The same owner token is used on both stores, and the same key: the two
//! stores must not share a key space (two databases of one Redis server do
//! not, two clients of one database do).

mod calls;

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::backend::{AcquireRequest, Backend, Grant, LeaseMode, LockStatus, RenewRequest};
use crate::vocabulary::capability::Capabilities;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};
use crate::vocabulary::url_options::Opt;

/// How long a client skips the fast store after a call to it failed with a
/// retryable error, sending acquisitions to the authoritative store alone.
pub const FAST_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long a renewal waits for the fast store once the authoritative store
/// has answered.
pub const FAST_RENEW_GRACE: Duration = Duration::from_millis(50);

/// The options of `layered://` URLs: none of its own.
const KNOWN_OPTS: &[Opt] = &[];

/// A fast store in front of an authoritative one. See the [module docs](self).
#[derive(Debug)]
pub struct Layered {
    fast: Arc<dyn Backend>,
    authoritative: Arc<dyn Backend>,
    /// Until when the fast store is skipped after a failure.
    fast_skipped_until: Mutex<Option<Instant>>,
}

impl Layered {
    /// The fast store `fast` in front of the authoritative store
    /// `authoritative`. Any two stores qualify; the guarantees are the
    /// authoritative store's (choose a consistent one), the fast store only
    /// filters contention.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] if both are the same backend object (a store
    /// cannot filter for itself: the same token on the same key would just be
    /// granted twice over).
    pub fn new(fast: Arc<dyn Backend>, authoritative: Arc<dyn Backend>) -> Result<Self> {
        if Arc::ptr_eq(&fast, &authoritative) {
            return Err(Error::invalid(
                "layered",
                "the fast and the authoritative store are the same backend; give two different stores",
            ));
        }
        Ok(Layered { fast, authoritative, fast_skipped_until: Mutex::new(None) })
    }

    /// [`open_url`](Self::open_url), its members opened with `connect`.
    pub(crate) async fn open_url_with(url: &str, connect: crate::backend::ConnectFn) -> Result<Self> {
        let parsed = crate::composites::url::parse(url, "layered", KNOWN_OPTS, 2..=2)?;
        let mut stores = parsed.connect(connect).await?.into_iter();
        match (stores.next(), stores.next()) {
            (Some(fast), Some(authoritative)) => Layered::new(fast, authoritative),
            _ => Err(Error::invalid(
                "url",
                format!("{}: expected two store URLs", crate::vocabulary::url_text::redact_url(url)),
            )),
        }
    }

    /// The fast store.
    pub fn fast(&self) -> &Arc<dyn Backend> {
        &self.fast
    }

    /// The authoritative store.
    pub fn authoritative(&self) -> &Arc<dyn Backend> {
        &self.authoritative
    }
}

#[async_trait]
impl Backend for Layered {
    fn name(&self) -> &'static str {
        "layered"
    }

    /// The authoritative store's capabilities, except where a request also
    /// goes through the fast store: fairness, notification, waiter counts and
    /// shared leases need both; a renewal slice fits both; leases are
    /// session-bound if either store binds them (the client must then release
    /// an unrenewed lease itself on both).
    fn capabilities(&self) -> Capabilities {
        let (f, a) = (self.fast.capabilities(), self.authoritative.capabilities());
        let mut caps = a;
        caps.fair = f.fair && (a.fair || a.always_fair);
        caps.always_fair = f.always_fair && a.always_fair;
        caps.store_notification = f.store_notification && a.store_notification;
        caps.counts_waiters = f.counts_waiters && a.counts_waiters;
        caps.session_bound = f.session_bound || a.session_bound;
        caps.shared_leases = f.shared_leases && a.shared_leases;
        caps.shrink = caps.shared_leases && a.shrink;
        caps.renew_slice = match (f.renew_slice, a.renew_slice) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        // fence_durability, fence_floor and records: the authoritative store's.
        // The admin calls are not implemented over two stores.
        caps.admin = false;
        caps
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        if self.fast_in_use() {
            match self.fast.try_acquire(req).await {
                Ok(Some(_)) => return self.try_authoritative_holding_fast(req).await,
                Ok(None) => return Ok(None),
                Err(e) => self.fast_refused("try_acquire", &e),
            }
        }
        self.authoritative.try_acquire(req).await
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        if self.fast_in_use() {
            match self.fast.acquire(req).await {
                Ok(_) => return self.acquire_authoritative_holding_fast(req).await,
                Err(e) => self.fast_refused("acquire", &e),
            }
        }
        self.authoritative.acquire(req).await
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        let authoritative = self.authoritative.release(key, token).await;
        if let Err(e) = self.fast.release(key, token).await {
            // The fast lease runs out by its TTL; a retry of this release
            // (after an authoritative error) asks again.
            tracing::debug!(key = %key, error = %e, "layered: fast store release failed");
        }
        authoritative
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        self.renew_both(leases).await
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        self.status_both(key).await
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        let held = self.authoritative.resize(key, limit).await?;
        // The fast store's limit follows; if it misses this, its refusal of a
        // later request sends that request to the authoritative store alone.
        if let Err(e) = self.fast.resize(key, limit).await {
            tracing::debug!(key = %key, error = %e, "layered: fast store resize failed");
        }
        Ok(held)
    }

    async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        self.shrink_both(key, token, to).await // calls.rs
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        self.authoritative.relabel(key, token, label).await
    }

    async fn raise_fence(&self, key: &LockKey, token: OwnerToken, floor: u64) -> Result<bool> {
        self.authoritative.raise_fence(key, token, floor).await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<u64>> {
        self.authoritative.read_record(key).await
    }

    async fn write_record(&self, key: &LockKey, token: OwnerToken, value: u64) -> Result<bool> {
        // A grant holds on the authoritative store under the client's token.
        self.authoritative.write_record(key, token, value).await
    }
}

#[cfg(test)]
mod tests;
