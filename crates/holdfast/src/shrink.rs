//! Making a held grant smaller in place ([`Backend::shrink`]): a write lock
//! downgraded to a read lock, part of a semaphore grant given back. One
//! atomic store step each, so that nobody is granted in between.
//!
//! [`Backend::shrink`]: crate::backend::Backend::shrink

use std::sync::atomic::Ordering;

use crate::backend::{LeaseMode, UNLIMITED};
use crate::guard::{Guard, Permit, ReadGuard, ReadKind, WriteKind};
use crate::held::Held;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::metrics::LostCause;

impl Guard<WriteKind> {
    /// Turns this write lock into a read lock without letting a writer in
    /// between: in one atomic store step the lease becomes a reader's, with
    /// the same fence, token and expiry, and renewal goes on for it. No
    /// other writer is granted before the returned [`ReadGuard`] is
    /// released (a writer already waiting stays behind it); readers that
    /// waited for the writer are admitted at once, woken by the store's
    /// notification, while readers that came after a waiting writer stay
    /// behind that writer, as the lock's writer preference says.
    ///
    /// Fails with [`Error::Lost`] if the lease was lost (the work done under
    /// it may have overlapped another holder), with
    /// [`Error::Unsupported`] on a store that does not declare
    /// [`Capabilities::shrink`](crate::Capabilities::shrink), with
    /// [`Error::InvalidInput`] for a reentrant grant (its other holds would
    /// become reads too: release them first), or with a store error. On
    /// every error the write lease is released as dropping the guard
    /// releases it.
    ///
    /// ```no_run
    /// # async fn demo() -> holdfast::Result<()> {
    /// let client = holdfast::Client::connect("sqlite:///tmp/holdfast-doc.db").await?;
    /// let config = client.rwlock("config/pricing");
    /// let writing = config.write().acquire().await?;
    /// // ... write the new prices ...
    /// let reading = writing.downgrade().await?;   // no writer gets in between
    /// // ... read them back, alongside other readers ...
    /// reading.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the write guard, which releases the lease
    /// (shrunk or not) in the background, as dropping a guard does.
    pub async fn downgrade(self) -> Result<ReadGuard> {
        shrink(self.held(), LeaseMode::Shared { weight: 1, limit: UNLIMITED }).await?;
        Ok(self.retyped::<ReadKind>())
    }
}

impl Permit {
    /// Gives back `n` of this grant's permits and keeps the rest, in one
    /// atomic store step: the grant keeps its fence, token and expiry, and
    /// [`permits`](Self::permits) falls by `n`. Waiting requests that now fit
    /// are admitted, woken by the store's notification as a release wakes
    /// them. `n` must be at least 1 and less than the permits held (give
    /// them all back with [`release`](Guard::release)); otherwise
    /// [`Error::InvalidInput`] before any I/O.
    ///
    /// Fails with [`Error::Lost`] if the lease was lost, with
    /// [`Error::Unsupported`] on a store that does not declare
    /// [`Capabilities::shrink`](crate::Capabilities::shrink), with
    /// [`Error::InvalidInput`] for a reentrant grant, or with a store error;
    /// the permit is still held after every error but `Lost` (after a store
    /// error the store may have applied the call: the permit may hold `n`
    /// fewer than [`permits`](Self::permits) says until it is released).
    ///
    /// ```no_run
    /// # async fn demo() -> holdfast::Result<()> {
    /// let client = holdfast::Client::connect("sqlite:///tmp/holdfast-doc.db").await?;
    /// let workers = client.semaphore("import-workers", 8);
    /// let mut permit = workers.acquire_many(4).await?;
    /// // ... the heavy first phase needs 4 ...
    /// permit.release_some(3).await?;            // the tail needs 1; others may take 3
    /// assert_eq!(permit.permits(), 1);
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// One store call: dropped, the permits were either given back or not,
    /// and the permit is still held ([`permits`](Self::permits) then says
    /// the old count, an upper bound); its release frees whatever it holds.
    pub async fn release_some(&mut self, n: u32) -> Result<()> {
        let held = self.permits();
        if n == 0 || n >= held {
            return Err(Error::invalid(
                "permits",
                format!("cannot give back {n} of {held} permits: from 1 to {} (release() gives back all)", held - 1),
            ));
        }
        // A share keeps the limit recorded with the key (a resize may have
        // changed it since this permit was granted): only the weight counts.
        shrink(self.held(), LeaseMode::Shared { weight: held - n, limit: UNLIMITED }).await?;
        self.held().weight.store(held - n, Ordering::Release);
        Ok(())
    }
}

/// The client's side of a shrink: refuses what cannot shrink before any
/// I/O, asks the store, and marks the lease lost if the store no longer had it.
async fn shrink(held: &Held, to: LeaseMode) -> Result<()> {
    let lease = &held.lease;
    let backend = &held.core.backend;
    if held.owner.is_some() {
        // The client joins later reentrant acquires of the owner to this
        // grant: a write acquire would join a read lease.
        return Err(Error::invalid("shrink", "a reentrant grant cannot shrink: acquire it without an owner"));
    }
    if !backend.capabilities().shrink {
        return Err(Error::Unsupported {
            store: backend.name(),
            what: "shrinking a held lease (downgrade, partial release): release it and acquire the smaller one",
        });
    }
    if lease.is_lost() {
        return Err(Error::Lost { key: lease.key.to_string() });
    }
    if backend.shrink(&lease.key, lease.token, to).await? {
        return Ok(());
    }
    lease.mark_lost(LostCause::Renewal);
    Err(Error::Lost { key: lease.key.to_string() })
}
