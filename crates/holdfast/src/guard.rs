//! The guard of a held lease, one type for every primitive ([`Guard`], with
//! a kind marker): its fence, `lost()`, `expiring()`, and how it ends
//! (release, drop, or leak).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::backend::{LeaseMode, UNLIMITED};
use crate::held::Held;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::metrics::LostCause;

/// Why a lease was lost ([`Guard::lost_reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The store no longer had the grant when the client renewed or released
    /// it, although the client's deadline had not passed: something removed
    /// it, most often a forced release ([`Client::force_release`](crate::Client::force_release),
    /// `holdfast release --force`).
    Removed,
    /// No renewal succeeded before the local lease deadline (the store was
    /// unreachable or slow, or this process was stalled), or `max_hold` or
    /// `no_renew` let the lease run out.
    Expired,
    /// The store's session that bound the lease ended (etcd, ZooKeeper).
    SessionEnded,
}

impl From<LostCause> for LostReason {
    fn from(cause: LostCause) -> Self {
        match cause {
            LostCause::Renewal | LostCause::Release => LostReason::Removed,
            LostCause::Deadline => LostReason::Expired,
            LostCause::Session => LostReason::SessionEnded,
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Removed => {
                "the store no longer had the grant although its TTL was not over: it was removed, most often by a \
                 forced release"
            }
            LostReason::Expired => "no renewal succeeded before the lease ran out",
            LostReason::SessionEnded => "the store's session that held the lease ended",
        })
    }
}

/// What a [`Guard`] holds: a mutex, semaphore permits, a read or a write
/// lock. Sealed: the kinds are the ones below.
pub trait GuardKind: sealed::Sealed + fmt::Debug + Send + Sync + 'static {
    /// The lease mode of a request of this kind for `weight` under `limit`.
    #[doc(hidden)]
    fn mode(weight: u32, limit: u32) -> LeaseMode;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! guard_kinds {
    ($($(#[$doc:meta])* $kind:ident => |$w:ident, $l:ident| $mode:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $kind;
        impl sealed::Sealed for $kind {}
        impl GuardKind for $kind {
            fn mode($w: u32, $l: u32) -> LeaseMode {
                $mode
            }
        }
    )*};
}

guard_kinds! {
    /// The kind of a [`Mutex`](crate::Mutex)'s guard: one exclusive lease.
    MutexKind => |_w, _l| LeaseMode::Exclusive;
    /// The kind of a [`Semaphore`](crate::Semaphore)'s guard: a share of
    /// `weight` permits of `limit`.
    PermitKind => |w, l| LeaseMode::Shared { weight: w, limit: l };
    /// The kind of a read lock's guard: a share without limit.
    ReadKind => |_w, _l| LeaseMode::Shared { weight: 1, limit: UNLIMITED };
    /// The kind of a write lock's guard: exclusive, preferred over new readers.
    WriteKind => |_w, _l| LeaseMode::Writer;
}

/// A held mutex.
pub type MutexGuard = Guard<MutexKind>;
/// Permits held of a [`Semaphore`](crate::Semaphore).
pub type Permit = Guard<PermitKind>;
/// A held read lock of a [`RwLock`](crate::RwLock): shared with other readers.
pub type ReadGuard = Guard<ReadKind>;
/// A held write lock of a [`RwLock`](crate::RwLock): excludes readers and writers.
pub type WriteGuard = Guard<WriteKind>;

/// A held lease: a [`MutexGuard`], a [`Permit`], a [`ReadGuard`] or a
/// [`WriteGuard`]. Dropping it releases the lease.
///
/// `Send` and `Sync`, and `'static`: it can move between tasks and threads.
///
/// # Drop
///
/// Prefer [`release`](Self::release), which reports whether the lease was
/// still held. A guard dropped without it stops renewal and releases in the
/// background when a tokio runtime is running; without a runtime the lease
/// simply expires after its TTL (on etcd and ZooKeeper: when the client's
/// session ends, or at the lease's deadline while the client lives). To keep
/// the lease until it runs out, use [`leak`](Self::leak).
#[must_use = "the lease is released when the guard is dropped"]
#[clippy::has_significant_drop]
pub struct Guard<K: GuardKind> {
    held: Arc<Held>,
    released: bool,
    kind: PhantomData<fn() -> K>,
}

impl<K: GuardKind> fmt::Debug for Guard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("kind", &std::any::type_name::<K>().rsplit("::").next().unwrap_or_default())
            .field("key", &self.held.lease.key)
            .field("fence", &self.held.lease.fence)
            .finish_non_exhaustive()
    }
}

impl<K: GuardKind> Guard<K> {
    pub(crate) fn new(held: Arc<Held>) -> Self {
        Guard { held, released: false, kind: PhantomData }
    }

    /// The fencing token of this grant: strictly greater than every fence the
    /// store issued before for this key (for shared leases too, so a fenced
    /// resource can order readers, permits and writers alike). Pass it to whatever the lock
    /// protects, and have that reject writes with a lower fence than it saw.
    pub fn fence(&self) -> u64 {
        self.held.lease.fence
    }

    pub(crate) fn weight(&self) -> u32 {
        self.held.weight.load(Ordering::Acquire)
    }

    pub(crate) fn held(&self) -> &Arc<Held> {
        &self.held
    }

    /// The same grant as a guard of another kind (after the store changed
    /// its mode); this guard is consumed without releasing.
    pub(crate) fn retyped<J: GuardKind>(mut self) -> Guard<J> {
        self.released = true;
        Guard::new(self.held.clone())
    }

    /// The owner token of this grant, as the store records it: for
    /// matching a history or the store's own records (`status`, logs)
    /// against this grant. Whoever has it can release the grant, so treat
    /// it like the guard itself.
    pub fn token(&self) -> crate::vocabulary::key::OwnerToken {
        self.held.lease.token
    }

    pub(crate) fn backend(&self) -> &dyn crate::backend::Backend {
        self.held.core.backend.as_ref()
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

    /// The local lease deadline: the instant until which this client
    /// believes the lease held, unless a renewal moves it later first. It is
    /// counted from before the acquire (or the last successful renewal) was
    /// sent, minus a drift margin, so the store cannot grant the key to
    /// anyone else before it. [`lost`](Self::lost) fires at it at the
    /// latest; after it, [`is_lost`](Self::is_lost) is true. Only renewals
    /// move it, and only later. For recording a history on one clock
    /// (`holdfast verify` does) or for deciding whether work still fits.
    pub fn valid_until(&self) -> std::time::Instant {
        self.held.lease.valid_until().into_std()
    }

    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.held.lease.is_lost()
    }

    /// Why the lease was lost, once it is ([`is_lost`](Self::is_lost));
    /// `None` while it is held, and after a release that did not find it lost.
    pub fn lost_reason(&self) -> Option<LostReason> {
        if !self.held.lease.is_lost() {
            return None;
        }
        self.held.lease.lost_cause().map(LostReason::from)
    }

    /// Resolves when the lease is lost: renewal found the grant gone, the
    /// store's session ended, or the local lease deadline passed without a
    /// successful renewal. The local deadline is counted from before the
    /// request was sent, minus a drift margin (see
    /// [`drift_margin`](crate::LockOptions::drift_margin)), so this fires before the
    /// store can grant the key to anyone else. Never resolves while the lease
    /// is held; may be awaited after the guard is gone (it is `'static`).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only observes the lease; dropping it changes nothing.
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
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only observes the lease; dropping it changes nothing.
    pub fn expiring(&self, within: Duration) -> impl Future<Output = ()> + Send + 'static {
        self.held.lease.clone().expiring(within)
    }

    /// Releases the lease, owner-checked. With reentrancy, only the last
    /// guard's release frees the key.
    ///
    /// Fails with [`Error::Lost`] if the lease had expired or been taken
    /// over before the release (the work done under it may have overlapped
    /// another holder), or with a store error. After a store error that may
    /// pass (the store unreachable), the release goes on in the background,
    /// retried until the store confirms it or the lease has run out, so the
    /// key is freed as soon as the store is back rather than at expiry.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping this future after its first poll still
    /// releases the lock: a release in flight is handed to a task of its
    /// own, which sends it again (a re-sent release answers as the first
    /// would); only the outcome is not reported.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        if !self.held.drop_hold() {
            return Ok(());
        }
        let lease = &self.held.lease;
        let was_lost = lease.is_lost();
        match self.held.release().first_outcome().await {
            Ok(true) if !was_lost => {
                lease.mark_ended();
                Ok(())
            }
            Ok(_) => {
                lease.mark_lost(LostCause::Release);
                Err(Error::Lost { key: lease.key.to_string() })
            }
            Err(e) => {
                lease.end();
                Err(e)
            }
        }
    }

    /// Forgets the guard without releasing: renewal stops and the lock stays
    /// held until its lease runs out (one TTL after the last renewal), then
    /// the store frees it. On a session-bound store (etcd, ZooKeeper) the
    /// client deletes it at that deadline, or the store does when the
    /// client's session ends, whichever is first. With reentrancy, this
    /// gives up one hold; the lease runs out only once no guard is left.
    pub fn leak(mut self) {
        self.released = true;
        if self.held.drop_hold() {
            self.held.lease.mark_ended();
            self.held.core.renewer.stop_renewing(self.held.renewal);
        }
    }
}

impl<K: GuardKind> Drop for Guard<K> {
    fn drop(&mut self) {
        if self.released || !self.held.drop_hold() {
            return;
        }
        self.held.lease.mark_ended();
        if self.held.release().spawn().is_none() {
            tracing::debug!(key = %self.held.lease.key, "no runtime to release in; the lease will expire");
        }
    }
}
