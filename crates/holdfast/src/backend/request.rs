//! What a store is asked for and answers with: the kind of lease
//! ([`LeaseMode`]), an acquire ([`AcquireRequest`]), a grant ([`Grant`]) and
//! a renewal ([`RenewRequest`]). The contract over them is in the
//! [module docs](super).

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

#[cfg(doc)]
use super::Backend;
#[cfg(doc)]
use crate::vocabulary::capability::Capabilities;
use crate::vocabulary::error::Result;
use crate::vocabulary::key::{LockKey, OwnerToken};

/// What kind of lease an acquire asks for: the one lease model every
/// primitive is built on.
///
/// A key holds a set of leases, and waiting requests may hold reservations
/// (see below), under one admission rule:
///
/// - an **exclusive** lease ([`Exclusive`](Self::Exclusive),
///   [`Writer`](Self::Writer)) is granted only when the key holds no other
///   unexpired lease (reservations do not hold it back: exclusive requests
///   may barge, as a mutex's do);
/// - a **shared** lease of weight `w` under limit `L` is granted only when
///   no exclusive lease is held, no [`Writer`](Self::Writer) reservation is
///   older than the request's own (writer preference: once a writer waits,
///   later readers queue behind it), and `w` plus the weights of the shared
///   leases held plus those of the shared reservations older than the
///   request's own is at most `L` (a waiting request keeps its place, so
///   later small requests cannot starve a large one). A request without a
///   reservation counts as younger than every reservation.
///
/// A mutex is one exclusive lease; a semaphore of N permits is shared leases
/// under limit N; a read-write lock is shared leases under an unlimited limit
/// ([`UNLIMITED`]) excluded by a writer.
///
/// The limit lives with the key while any lease of it is held or waiting: a
/// shared request that names another limit than the held ones fails with
/// [`Error::Conflict`](crate::Error::Conflict), and
/// [`Backend::resize`] changes it.
///
/// A waiting request that reserves ([`Writer`](Self::Writer) and
/// [`Shared`](Self::Shared)) leaves a **reservation** in the store when it is
/// refused (a queue entry, ordered by when it was first made): it expires
/// one TTL after the request's last attempt unless that attempt is followed
/// by another (the waiting loop attempts at least every third of the TTL),
/// is replaced by the grant, and is removed by [`Backend::release`] of the
/// request's token. [`Backend::try_acquire`] never reserves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LeaseMode {
    /// One holder at a time (a mutex). A waiting exclusive request leaves
    /// no reservation: shared requests are never held back by it.
    #[default]
    Exclusive,
    /// Exclusive, and while it waits, no new shared lease is granted (the
    /// writer of a writer-preferring read-write lock).
    Writer,
    /// A share of the key.
    Shared {
        /// How much of the limit this lease takes (1..=limit).
        weight: u32,
        /// The most the weights of the key's shared leases may sum to.
        limit: u32,
    },
}

/// The limit of a read-write lock's readers: no limit.
pub const UNLIMITED: u32 = u32::MAX;

impl LeaseMode {
    /// Whether a refused waiting request of this mode leaves a reservation.
    pub fn reserves(&self) -> bool {
        !matches!(self, LeaseMode::Exclusive)
    }

    /// Whether leases of this mode exclude every other lease.
    pub fn is_exclusive(&self) -> bool {
        matches!(self, LeaseMode::Exclusive | LeaseMode::Writer)
    }

    /// The weight a lease of this mode counts for (1 for exclusive leases).
    pub fn weight(&self) -> u32 {
        match self {
            LeaseMode::Shared { weight, .. } => *weight,
            _ => 1,
        }
    }

    /// The limit of a shared mode; `None` for exclusive ones.
    pub fn limit(&self) -> Option<u32> {
        match self {
            LeaseMode::Shared { limit, .. } => Some(*limit),
            _ => None,
        }
    }
}

/// One acquire request, as the client hands it to a backend.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The key to lock.
    pub key: LockKey,
    /// The token that will own the grant; fresh for every acquisition.
    pub token: OwnerToken,
    /// The lease TTL, already checked against the crate's limits.
    pub ttl: Duration,
    /// A human label of the holder (`host:pid` by default) for `status`.
    pub label: String,
    /// Grant in request order. Only set when the backend declared
    /// [`Capabilities::fair`].
    pub fair: bool,
    /// The kind of lease.
    pub mode: LeaseMode,
    /// An earlier attempt of this request failed with a retryable error and
    /// may have been applied: the store may already hold a grant or a queue
    /// entry for this token, so a store that queues waiters locally lets this
    /// attempt go first (see [`until_granted`](crate::backend::wait::until_granted)).
    pub retry: bool,
    /// Grant, if granting, a fence of at least this (0: no floor). The fence
    /// is then `max(the fence the store would issue, fence_floor)`, and the
    /// store's counter stands at least at it afterwards, so later fences are
    /// above it. Honoured by the stores that declare
    /// [`Capabilities::fence_floor`], for exclusive grants outside a fair
    /// queue (what RedLock asks its members for: with one floor above every
    /// member's counter, every member issues the same fence and no fence
    /// needs writing back); ignored by the others. A floor above the store's
    /// cap (2^52 on Redis, 2^62 on the SQL stores) is
    /// [`Error::InvalidInput`](crate::Error::InvalidInput). A retry by the
    /// holding token returns its grant, whatever the floor.
    pub fence_floor: u64,
}

impl AcquireRequest {
    /// An exclusive, non-fair request with an empty label.
    pub fn new(key: LockKey, token: OwnerToken, ttl: Duration) -> Self {
        AcquireRequest {
            key,
            token,
            ttl,
            label: String::new(),
            fair: false,
            mode: LeaseMode::Exclusive,
            retry: false,
            fence_floor: 0,
        }
    }

    /// Sets the fence floor ([`fence_floor`](Self::fence_floor)); 0 for none.
    pub fn with_fence_floor(mut self, floor: u64) -> Self {
        self.fence_floor = floor;
        self
    }

    /// The fence floor, checked against `cap`, the highest floor `store`
    /// takes: [`Error::InvalidInput`](crate::Error::InvalidInput) above it.
    // Used by the stores that take floors; unused in a build without them.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "redis", feature = "postgres", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) fn fence_floor_within(&self, cap: u64, store: &'static str) -> Result<u64> {
        if self.fence_floor > cap {
            return Err(crate::vocabulary::error::Error::invalid(
                "fence floor",
                format!("{} is above {cap}, the highest floor the {store} store takes", self.fence_floor),
            ));
        }
        Ok(self.fence_floor)
    }

    /// Sets the kind of lease.
    pub fn with_mode(mut self, mode: LeaseMode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the holder label.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// Asks for a grant in request order.
    pub fn with_fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }
}

/// A successful acquisition.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The fencing token of this grant.
    pub fence: u64,
    /// When the request that produced this grant was sent (before sending).
    pub attempt_started: Instant,
    /// How long after `attempt_started` the store keeps the grant without a
    /// renewal: the request's TTL, or less where a session bounds it.
    pub valid_for: Duration,
    /// A signal the store fires when the grant is gone for a reason the
    /// client cannot see by renewing, such as a lost session or a key deleted
    /// under it. `None` when renewal alone tells.
    pub session_lost: Option<CancellationToken>,
}

impl Grant {
    /// A grant valid for `ttl` from `attempt_started`, without a session signal.
    pub fn new(fence: u64, attempt_started: Instant, ttl: Duration) -> Self {
        Grant { fence, attempt_started, valid_for: ttl, session_lost: None }
    }
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
