//! The distributed semaphore: a [`Lock`] of shared leases whose weights sum
//! to at most its permits.

use std::time::Duration;

use tokio::time::Instant;

use crate::guard::{Permit, PermitKind};
use crate::lock::{Lock, Waiting};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::LockKey;

/// A named distributed semaphore of N permits. Cheap to clone; holds no
/// permit by itself. The builder methods and the one-permit acquire methods
/// ([`acquire`](Lock::acquire), [`acquire_timeout`](Lock::acquire_timeout),
/// [`try_acquire`](Lock::try_acquire)) are [`Lock`]'s.
///
/// Every grant is a lease like a mutex's: renewed while its [`Permit`] lives,
/// freed within its TTL when its holder dies, with a fence strictly above
/// every earlier grant of the key, and `lost()`.
///
/// # The permit count lives with the key
///
/// The first grant records N with the key; while any permit is held, an
/// acquire that names another N fails with [`Error::Conflict`] rather than
/// making a second semaphore. [`resize`](Self::resize) changes N for the
/// permits held: holders above a lowered limit keep their permits until they
/// release, and no permit is granted until the count is under the new limit.
/// Once no permit is held the key keeps no count, and the next grant records
/// its own.
///
/// # Waiting
///
/// A waiting request keeps its place: a request for many permits reserves
/// them while it waits, so later small requests cannot starve it (they pass
/// it only while there is room for both).
///
/// ```no_run
/// # async fn demo() -> holdfast::Result<()> {
/// let client = holdfast::Client::connect("sqlite:///tmp/holdfast-doc.db").await?;
/// let partner_api = client.semaphore("partner-api", 8);   // at most 8 calls at once, fleet-wide
/// let permit = partner_api.acquire().await?;
/// // ... call the partner API; permit.fence() orders the calls ...
/// permit.release().await?;
/// # Ok(()) }
/// ```
pub type Semaphore = Lock<PermitKind>;

impl Lock<PermitKind> {
    pub(crate) fn with_permits(mut self, permits: u32) -> Self {
        self.limit = permits;
        self
    }

    /// The permit count this handle acquires under.
    pub fn permits(&self) -> u32 {
        self.limit
    }

    /// Waits for `n` permits as one grant (released whole, or in part with
    /// [`release_some`](Permit::release_some)): without limit,
    /// or at most [`LockOptions::wait_timeout`](crate::LockOptions::wait_timeout)
    /// if set. `n` of 0 or above the permit count is [`Error::InvalidInput`]
    /// before any I/O.
    ///
    /// # Cancel safety
    ///
    /// As for [`acquire`](Lock::acquire): dropping the future leaves no
    /// grant and no reservation behind.
    pub async fn acquire_many(&self, n: u32) -> Result<Permit> {
        // A deadline past what the clock can count is no deadline.
        let deadline = self.opts.wait_timeout.and_then(|t| Instant::now().checked_add(t));
        self.weighted(n).acquire_inner(Waiting::Until(deadline)).await?.ok_or_else(|| self.busy())
    }

    /// Waits for `n` permits at most `timeout`; see [`acquire_many`](Self::acquire_many)
    /// and [`acquire_timeout`](Lock::acquire_timeout).
    ///
    /// # Cancel safety
    ///
    /// As for [`acquire_timeout`](Lock::acquire_timeout).
    pub async fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Result<Permit> {
        let deadline = Instant::now().checked_add(timeout);
        self.weighted(n).acquire_inner(Waiting::Until(deadline)).await?.ok_or_else(|| self.busy())
    }

    /// One attempt at `n` permits: the permit, or `None` if there is not
    /// room for `n` now (or an earlier request waits for it).
    ///
    /// # Cancel safety
    ///
    /// As for [`try_acquire`](Lock::try_acquire).
    pub async fn try_acquire_many(&self, n: u32) -> Result<Option<Permit>> {
        self.weighted(n).acquire_inner(Waiting::No).await
    }

    /// Changes the permit count of the live semaphore to `permits` (see
    /// [the type's docs](Self#the-permit-count-lives-with-the-key)) and of
    /// this handle; returns how many permits are held now. Other handles
    /// that still name the old count get [`Error::Conflict`] until they are
    /// made with the new one.
    ///
    /// # Cancel safety
    ///
    /// One store call: dropped, the count is either changed or not (this
    /// handle's count changes only when the call returns).
    pub async fn resize(&mut self, permits: u32) -> Result<u64> {
        if permits == 0 {
            return Err(Error::invalid("permits", "a semaphore needs at least 1 permit"));
        }
        let key = LockKey::new(self.key())?;
        let held = self.core().backend.resize(&key, permits).await?;
        self.limit = permits;
        Ok(held)
    }

    fn weighted(&self, n: u32) -> Self {
        let mut this = self.clone();
        this.weight = n;
        this
    }

    fn busy(&self) -> Error {
        Error::backend("holdfast", false, format!("backend returned busy to a waiting acquire of {:?}", self.key()))
    }
}

impl Permit {
    /// How many permits this grant holds.
    pub fn permits(&self) -> u32 {
        self.weight()
    }
}
