//! The [`Backend`] trait that every store implements, and the types it speaks.
//!
//! This module is written for implementers. Users lock through
//! [`Client`](crate::Client); the client does everything that is the same for
//! every store (input checks, deadlines, cancel cleanup, renewal scheduling,
//! reentrancy, `lost()`) so that a backend is only the store calls.
//!
//! # Contract
//!
//! A backend must pass the conformance suite in `holdfast-testkit` (clauses
//! C1..C17 and the fault clauses). In terms of this trait:
//!
//! - [`try_acquire`](Backend::try_acquire) makes one attempt: it grants
//!   `req.key` to `req.token` only when no unexpired grant of another token
//!   exists, with a lease of `req.ttl` measured by the **store's** clock and a
//!   fence strictly greater than every fence the store issued before for that
//!   key, or returns `Ok(None)` if the key is busy, leaving nothing behind.
//!   A store that declares [`Capabilities::fence_floor`] grants, when
//!   `req.fence_floor` is set, a fence of at least that floor: the fence is
//!   the higher of the one it would issue and the floor, and its counter
//!   stands at that fence afterwards (so the floor never lowers a fence or
//!   repeats one). A floor above the store's cap is
//!   [`Error::InvalidInput`](crate::Error::InvalidInput) before any I/O.
//! - [`acquire`](Backend::acquire) waits for the key, woken by the store's
//!   notification where it has one, with a bounded fallback poll, and returns
//!   only with a grant or an error. It does **not** ride out store failures
//!   itself: a transient failure (connection lost, session expired, failover)
//!   is returned as a retryable [`Error::Backend`](crate::Error::Backend), and
//!   the client's one waiting policy ([`crate::backend::wait`]) decides whether to call
//!   again with the same token. Deadlines are the client's: it drops the future.
//! - An acquire (either kind) by a token that already holds the key (a retry
//!   whose first reply was lost) returns the grant (the same fence, or a
//!   higher one where the store issues a new one) **and extends the lease to
//!   `req.ttl` from now**, so that the client's view of the lease, counted
//!   from the retry, never outlasts the store's.
//! - Any acquire future may be dropped at any await point. After a drop, or an
//!   error, the client calls [`release`](Backend::release) with the same token;
//!   that call must remove any grant **and any queue entry** the attempt left.
//! - [`release`](Backend::release) deletes the grant only if `token` owns it
//!   (and wakes one waiter); otherwise it returns `Ok(false)` and changes
//!   nothing. It is idempotent, and a repeat owns nothing: a release sent
//!   again by the same token in a later call, after an earlier one removed
//!   the grant, returns `Ok(false)` on every store and takes nothing from a
//!   later holder (conformance `c4_release_repeated`). (One call that sends
//!   its request again after its connection was lost, as Redis does, may
//!   count what its own first copy removed as removed: `Ok(true)`.) So a
//!   client that re-sends a release whose reply it lost cannot tell "I
//!   released it" from "it was gone". A store must not forget a grant before the store confirmed its
//!   deletion: a failed release is retried by the client (in the background,
//!   while the error is retryable) until it succeeds or returns `Ok(false)`
//!   because the grant can no longer exist (its session ended).
//!   Instead of freeing the key, a release may pass it in the same store
//!   call to a waiting acquire of the same backend instance, under that
//!   request's own token, with a new fence and the request's TTL from the
//!   store's clock; that acquire then returns the grant as its own (the
//!   Redis store's local hand-over, bounded so that other clients' waiters
//!   are not kept out). Every rule above holds for such a grant: a dropped
//!   acquire is released by its token, which removes a handed grant too.
//! - [`renew`](Backend::renew) extends every listed lease that its token still
//!   owns to its TTL from now (store clock), in as few round trips as the
//!   store allows (one script, one statement, one keep-alive), and reports per
//!   lease whether it was still held. It must hear from the store: a `true`
//!   vouches that the grant was held when the request was sent.
//! - [`Grant::attempt_started`] must be taken **before** the request that
//!   produced the grant was sent, and [`Grant::valid_for`] is how long from
//!   then the store keeps the grant without renewal (`req.ttl`, or less where a
//!   session bounds it), so that the client's view of the lease ends before the
//!   store's. The client owns lease time: it counts deadlines, fires `lost()`,
//!   and, on a store that declares [`Capabilities::session_bound`], releases a
//!   lease whose local deadline passed unrenewed (such a store keeps grants
//!   while its session lives, whatever their TTL).
//! - [`force_release`](Backend::force_release) (declared by
//!   [`Capabilities::admin`], with [`list`](Backend::list)) removes every
//!   held lease of a key whatever its owner and returns their fences; after
//!   it returns, the key can be granted at once with a fence above every
//!   removed one (fences never go backwards), waiters are woken by the same
//!   path as a release, and every later [`renew`](Backend::renew) of a
//!   removed lease reports `false` (so the holder's `lost()` fires at its
//!   next renewal at the latest). Waiters' reservations stay.
//! - [`shrink`](Backend::shrink) (declared by [`Capabilities::shrink`])
//!   turns `token`'s held lease of `key` into a smaller one in one atomic
//!   store step, keeping its token, fence and expiry, so that no other
//!   request can be granted between the larger lease and the smaller one;
//!   waiters that now fit are woken as a release wakes them.
//! - No method may block the async runtime; no method may panic on any input.

mod admin;
pub mod admission;
pub(crate) mod located;
#[cfg(test)]
pub(crate) mod prop_modes;
mod request;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod session_book;
mod status;
pub mod wait;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::vocabulary::capability::Capabilities;
use crate::vocabulary::error::Result;
use crate::vocabulary::key::{LockKey, OwnerToken};
pub use admin::ForceReleased;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use admin::held_statuses;
pub use request::{AcquireRequest, Grant, LeaseMode, RenewRequest, UNLIMITED};
pub use status::{HolderInfo, HolderWatch, LockStatus};

/// Opens the store a URL names: the registry's
/// [`stores::connect_or_defer`](crate::stores::connect_or_defer), handed
/// down to the composites so that they, standing below the registry, can
/// open the stores their own URL lists without importing it.
pub type ConnectFn = for<'a> fn(&'a str) -> futures::future::BoxFuture<'a, Result<Arc<dyn Backend>>>;

/// A lock store. See the [module docs](self) for the contract.
// The wrappers `located::Located` and `deferred` forward every method: a new
// method with a default body must be forwarded there too, or the wrapped
// store's own answer is silently replaced by the default.
#[async_trait]
pub trait Backend: fmt::Debug + Send + Sync + 'static {
    /// A short lowercase name of the store, used in errors: `"sqlite"`, `"redis"`.
    fn name(&self) -> &'static str;

    /// What this store can do.
    fn capabilities(&self) -> Capabilities;

    /// One attempt: the grant, or `Ok(None)` if the key is busy.
    ///
    /// # Cancel safety
    ///
    /// May be dropped at any await point; a dropped attempt may have been
    /// applied, and the client then releases its token.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>>;

    /// Waits for the key; returns with a grant or an error (transient store
    /// failures as retryable errors, for the client's waiting policy).
    ///
    /// # Cancel safety
    ///
    /// May be dropped at any await point (that is how deadlines work); the
    /// client then releases the token, which must remove any grant and queue
    /// entry the attempt left.
    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant>;

    /// Releases the grant (or queue entry) of `token`; `Ok(false)` if it owned none,
    /// as a repeat of a release that took effect does (see the module docs).
    ///
    /// # Cancel safety
    ///
    /// The client runs it on a task of its own and never drops it; an
    /// implementation may still be dropped when the runtime shuts down.
    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool>;

    /// Renews each lease; the result has one entry per request, `true` if still held.
    ///
    /// # Cancel safety
    ///
    /// May be dropped (the renewer gives up at the earliest deadline in the
    /// batch); a dropped renewal changes at most lease expiries.
    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>>;

    /// Reports the holder and waiters of a key.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    async fn status(&self, key: &LockKey) -> Result<LockStatus>;

    /// Changes the limit recorded with `key`'s shared leases to `limit` and
    /// returns the weight now held. Holders above a lowered limit keep their
    /// leases until they release; no shared lease is granted until the held
    /// weight is under the new limit. A key with no shared lease held keeps
    /// no limit, so this changes nothing there (the next grant records its
    /// request's limit).
    ///
    /// # Cancel safety
    ///
    /// One store call: dropped, it either changed the limit or did not.
    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        let _ = (key, limit);
        Err(crate::vocabulary::error::Error::Unsupported { store: self.name(), what: "shared leases" })
    }

    /// Replaces the label stored with `token`'s unexpired grant of `key`
    /// (an election's published value); `Ok(false)` if `token` holds no
    /// grant of `key`, changing nothing.
    ///
    /// # Cancel safety
    ///
    /// One store call: dropped, the label is either changed or not.
    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        let _ = (key, token, label);
        Err(crate::vocabulary::error::Error::Unsupported { store: self.name(), what: "changing a held grant's label" })
    }

    /// If `token` holds an unexpired lease of `key` (exclusive or a held
    /// share, not a reservation), raises `key`'s fence floor to at least
    /// `floor`, so that every later grant of `key` gets a fence above
    /// `floor`; never lowers it. Returns whether `token` held; a token that
    /// holds nothing raises nothing. On SQLite the floor is the store's one
    /// counter, shared by every key, so a raise moves every key's later
    /// fences; PostgreSQL and MySQL keep fences per key and raise the key's
    /// alone. Declared by
    /// [`Capabilities::fence_floor`].
    ///
    /// RedLock writes the fence it chose back to its majority with it, so
    /// that fences stay increasing across majorities (raising with max
    /// makes a late write-back harmless; the owner check adds nothing
    /// there). A fallback chain keeps its mode in a record
    /// ([`write_record`](Self::write_record)), not in a fence floor, since a
    /// counter shared by every key is shared by every tenant of the store.
    ///
    /// # Cancel safety
    ///
    /// One store call: dropped, the floor is either raised or not, and a
    /// repeated raise changes nothing more.
    async fn raise_fence(&self, key: &LockKey, token: OwnerToken, floor: u64) -> Result<bool> {
        let _ = (key, token, floor);
        Err(crate::vocabulary::error::Error::Unsupported { store: self.name(), what: "raising a fence floor" })
    }

    /// The record kept with `key` ([`write_record`](Self::write_record)),
    /// or `None` if none was ever written. Declared by
    /// [`Capabilities::records`].
    ///
    /// A record is a register of one `u64` per key, apart from the key's
    /// leases and its fence counter: only a writer holding the key
    /// exclusively changes it, and it stays after every lease of the key is
    /// gone (it never expires). The fallback chain keeps its mode in the
    /// record of its mode key, so no other tenant of the arbiter store
    /// (another chain, plain locks, a fence floor raised on another key)
    /// can move it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    async fn read_record(&self, key: &LockKey) -> Result<Option<u64>> {
        let _ = key;
        Err(crate::vocabulary::error::Error::Unsupported { store: self.name(), what: "records kept with a key" })
    }

    /// If `token` holds an unexpired exclusive lease of `key` (an
    /// [`Exclusive`](LeaseMode::Exclusive) or [`Writer`](LeaseMode::Writer)
    /// grant, not a share or a reservation), sets the record kept with
    /// `key` to `value`, in one atomic store call; returns whether `token`
    /// held (a token that holds nothing writes nothing). See
    /// [`read_record`](Self::read_record). Declared by
    /// [`Capabilities::records`].
    ///
    /// # Cancel safety
    ///
    /// One store call: dropped, the record is either written or not, and
    /// writing the same value again changes nothing more.
    async fn write_record(&self, key: &LockKey, token: OwnerToken, value: u64) -> Result<bool> {
        let _ = (key, token, value);
        Err(crate::vocabulary::error::Error::Unsupported { store: self.name(), what: "records kept with a key" })
    }

    /// Makes the lease `token` holds on `key` the smaller mode `to`, in one
    /// atomic store step: an exclusive lease ([`Exclusive`](LeaseMode::Exclusive)
    /// or [`Writer`](LeaseMode::Writer)) becomes `Shared { weight: 1, limit }`
    /// (a write lock downgraded to a read lock); a share of weight `w`
    /// becomes one of weight `1 <= to.weight < w` under the key's recorded
    /// limit (`to.limit` is not checked there). The token, the fence and the
    /// expiry stay; renewal renews the smaller lease as before. Waiters that
    /// now fit are admitted by the admission rule ([`LeaseMode`]) and woken
    /// by the store's notification; no request can be granted between the
    /// two modes (a waiting writer stays behind the smaller lease). Returns
    /// `Ok(false)`, changing nothing, if `token` holds no unexpired lease of
    /// `key`; a `to` that is not smaller than the held lease is
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) (`what:
    /// "shrink"`), changing nothing. Declared by [`Capabilities::shrink`].
    ///
    /// # Cancel safety
    ///
    /// One atomic store step: dropped, the lease either shrank or did not,
    /// and a repeat of an applied shrink is refused as not smaller. The
    /// client then releases the lease by its token either way, or keeps it.
    async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        let _ = (key, token, to);
        Err(crate::vocabulary::error::Error::Unsupported {
            store: self.name(),
            what: "shrinking a held lease (downgrade, partial release)",
        })
    }

    /// Every key whose name starts with `prefix` (checked by
    /// [`check_prefix`](crate::LockKey::check_prefix); empty: every key) and that has
    /// an unexpired held lease, with its status as [`status`](Self::status)
    /// reports it, in any order. Declared by [`Capabilities::admin`].
    ///
    /// # Cost
    ///
    /// An admin call: O(keys under the prefix), read in pages where the
    /// store pages (never a command that blocks the store for all of them,
    /// such as Redis `KEYS`).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    async fn list(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        let _ = prefix;
        Err(crate::vocabulary::error::Error::Unsupported { store: self.name(), what: "listing held keys" })
    }

    /// Removes every held lease of `key` (exclusive and shared, whatever
    /// their owner; waiters' reservations stay) and returns their fences;
    /// see the [module docs](self) for what must hold after it returns.
    /// Declared by [`Capabilities::admin`].
    ///
    /// # Cancel safety
    ///
    /// Dropped, it removed all, some or none of the leases (one store call
    /// on most stores); calling it again removes the rest.
    async fn force_release(&self, key: &LockKey) -> Result<ForceReleased> {
        let _ = key;
        Err(crate::vocabulary::error::Error::Unsupported { store: self.name(), what: "forced release" })
    }

    /// A [`HolderWatch`] of `key` fed by the store's own watch, or
    /// `Ok(None)` where the store has none (the default; election
    /// observers then poll [`status`](Self::status)).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads and starts a watch, which dropping the
    /// future or the stream stops.
    async fn watch_holders(&self, key: &LockKey) -> Result<Option<HolderWatch>> {
        let _ = key;
        Ok(None)
    }
}
