//! The [`Backend`] trait that every store implements, and the types it speaks.
//!
//! This module is written for implementers. Users lock through
//! [`Client`](crate::Client); the client does everything that is the same for
//! every store (input checks, deadlines, cancel cleanup, renewal scheduling,
//! reentrancy, `lost()`) so that a backend is only the store calls.
//!
//! # Contract
//!
//! A backend must pass the conformance suite in `holdfast-testkit`
//! (clauses C1..C11). In terms of this trait:
//!
//! - [`acquire`](Backend::acquire) grants `req.key` to `req.token` only when no
//!   unexpired grant of another token exists, with a lease of `req.ttl`
//!   measured by the **store's** clock, and a fence strictly greater than every
//!   fence the store issued before for that key. With `req.wait == false` it
//!   makes one attempt and returns `Ok(None)` if the key is busy, leaving
//!   nothing behind. With `req.wait == true` it waits for the key, woken by the
//!   store's notification where it has one, with a bounded fallback poll, and
//!   only returns with a grant or an error: the client enforces deadlines by
//!   dropping the future.
//! - The acquire future may be dropped at any await point. After a drop, or an
//!   error, the client calls [`release`](Backend::release) with the same token;
//!   that call must remove any grant **and any queue entry** the attempt left.
//! - [`release`](Backend::release) deletes the grant only if `token` owns it
//!   (and wakes one waiter); otherwise it returns `Ok(false)` and changes
//!   nothing. It is idempotent.
//! - [`renew`](Backend::renew) extends every listed lease that its token still
//!   owns to its TTL from now (store clock), in as few round trips as the
//!   store allows (one script, one statement, one keep-alive), and reports per
//!   lease whether it was still held.
//! - [`Grant::attempt_started`] must be taken **before** the request that
//!   produced the grant was sent, so that the client's view of the lease
//!   (`attempt_started + ttl - drift margin`) ends before the store's.
//! - No method may block the async runtime; no method may panic on any input.

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::capability::Capabilities;
use crate::error::Result;
use crate::key::{LockKey, OwnerToken};

/// Opens the store `url` names as a bare [`Backend`], for tools and
/// composites that drive the store calls themselves. Applications use
/// [`Client::connect`](crate::Client::connect), which adds deadlines, cancel
/// cleanup, renewal and `lost()`.
///
/// # Cancel safety
///
/// Dropping the future leaves nothing behind: no lock is taken by connecting.
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    crate::url::connect(url).await
}

/// One acquire request, as the client hands it to a backend.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// The key to lock.
    pub key: LockKey,
    /// The token that will own the grant; fresh for every acquisition.
    pub token: OwnerToken,
    /// The lease TTL, already checked against the crate's limits.
    pub ttl: Duration,
    /// A human label of the holder (`host:pid` by default) for `status`.
    pub label: String,
    /// Wait for the key (`true`) or make one attempt (`false`).
    pub wait: bool,
    /// Grant in request order. Only set when the backend declared
    /// [`Capabilities::fair`].
    pub fair: bool,
}

/// A successful acquisition.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The fencing token of this grant.
    pub fence: u64,
    /// When the request that produced this grant was sent (before sending).
    pub attempt_started: Instant,
    /// A signal the store fires when the grant is gone for a reason the
    /// client cannot see by renewing, such as a lost session. `None` when
    /// renewal alone tells.
    pub session_lost: Option<CancellationToken>,
}

/// One lease to renew.
#[derive(Debug, Clone)]
pub struct RenewRequest {
    /// The key.
    pub key: LockKey,
    /// The grant's token.
    pub token: OwnerToken,
    /// The TTL to extend to, from now on the store's clock.
    pub ttl: Duration,
}

/// Who holds a key, as far as the store can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockStatus {
    /// The key.
    pub key: String,
    /// The current holder, if any unexpired grant exists.
    pub holder: Option<HolderInfo>,
    /// How many waiters the store knows of, if it can count them.
    pub waiters: Option<u64>,
}

/// The holder of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderInfo {
    /// The holder's label.
    pub label: String,
    /// The fence of the holder's grant.
    pub fence: u64,
    /// Time left on the lease by the store's clock, where the store knows it.
    pub ttl_left: Option<Duration>,
}

/// A lock store. See the [module docs](self) for the contract.
#[async_trait]
pub trait Backend: fmt::Debug + Send + Sync + 'static {
    /// A short lowercase name of the store, used in errors: `"sqlite"`, `"redis"`.
    fn name(&self) -> &'static str;

    /// What this store can do.
    fn capabilities(&self) -> Capabilities;

    /// Grants the key or, with `req.wait == false`, returns `Ok(None)` if busy.
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>>;

    /// Releases the grant (or queue entry) of `token`; `Ok(false)` if it owned none.
    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool>;

    /// Renews each lease; the result has one entry per request, `true` if still held.
    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>>;

    /// Reports the holder and waiters of a key.
    async fn status(&self, key: &LockKey) -> Result<LockStatus>;
}
