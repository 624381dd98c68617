//! The steps of [`Layered`]'s calls that involve both stores.

use std::time::Instant;

use super::{FAST_RENEW_GRACE, FAST_RETRY_AFTER, Layered};
use crate::backend::{AcquireRequest, Backend, Grant, LeaseMode, LockStatus, RenewRequest};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

impl Layered {
    /// [`Backend::shrink`]: on the authoritative store, whose answer is the
    /// one returned (exclusion and fences are its); then on the fast store,
    /// whose larger lease would only hold back the waiters that now fit.
    /// A fast store that cannot shrink it (down, lost, unsupported) has the
    /// fast lease released instead: the fast store is never trusted for
    /// safety, so letting go of the filter is safe, and waiters reach the
    /// authoritative store, which admits only what fits.
    ///
    /// # Cancel safety
    ///
    /// Dropped between the two calls, the fast store keeps the larger
    /// lease (more restrictive, never less safe) until it is released.
    pub(super) async fn shrink_both(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        if !self.authoritative.shrink(key, token, to).await? {
            return Ok(false);
        }
        match self.fast.shrink(key, token, to).await {
            Ok(true) => {}
            other => {
                tracing::debug!(key = %key, outcome = ?other, "layered: fast store did not shrink; releasing its lease");
                if let Err(e) = self.fast.release(key, token).await {
                    tracing::debug!(key = %key, error = %e, "layered: fast store release failed");
                }
            }
        }
        Ok(true)
    }

    /// Whether acquisitions go through the fast store now (it is not being
    /// skipped after a failure).
    pub(super) fn fast_in_use(&self) -> bool {
        let mut skipped = self.fast_skipped_until.lock().unwrap_or_else(|p| p.into_inner());
        match *skipped {
            Some(until) if Instant::now() < until => false,
            Some(_) => {
                *skipped = None;
                true
            }
            None => true,
        }
    }

    /// The fast store refused or failed `call`: this request goes on on the
    /// authoritative store alone, and after a retryable failure the fast
    /// store is skipped for [`FAST_RETRY_AFTER`].
    pub(super) fn fast_refused(&self, call: &str, e: &Error) {
        if e.is_transient() {
            tracing::warn!(error = %e, "layered: fast store {call} failed; authoritative store alone for {FAST_RETRY_AFTER:?}");
            let mut skipped = self.fast_skipped_until.lock().unwrap_or_else(|p| p.into_inner());
            *skipped = Some(Instant::now() + FAST_RETRY_AFTER);
        } else {
            tracing::debug!(error = %e, "layered: fast store refused {call}; authoritative store alone for this request");
        }
    }

    /// One try on the authoritative store by a request that holds the fast
    /// lease; busy there, the fast lease is released first.
    ///
    /// # Cancel safety
    ///
    /// Dropped at any point, the client's release of the token removes what
    /// either store granted.
    pub(super) async fn try_authoritative_holding_fast(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        match self.authoritative.try_acquire(req).await? {
            Some(grant) => Ok(Some(grant)),
            None => match self.fast.release(&req.key, req.token).await {
                Ok(_) => Ok(None),
                // The client cleans up after errors only: report it as one,
                // so the fast lease is released by the client's retry.
                Err(e) => {
                    self.fast_refused("release", &e);
                    Err(e)
                }
            },
        }
    }

    /// Waits on the authoritative store by a request that holds the fast
    /// lease, renewing the fast lease every third of the TTL meanwhile.
    ///
    /// # Cancel safety
    ///
    /// Dropped at any point, the client's release of the token removes what
    /// either store granted or queued.
    pub(super) async fn acquire_authoritative_holding_fast(&self, req: &AcquireRequest) -> Result<Grant> {
        let keep_fast = async {
            let renewal = [RenewRequest { key: req.key.clone(), token: req.token, ttl: req.ttl }];
            loop {
                tokio::time::sleep(req.ttl / 3).await;
                if let Err(e) = self.fast.renew(&renewal).await {
                    tracing::debug!(key = %req.key, error = %e, "layered: fast lease renewal while waiting failed");
                }
            }
        };
        tokio::select! {
            granted = self.authoritative.acquire(req) => granted,
            never = keep_fast => never,
        }
    }

    /// Renews on both stores at once; the authoritative store's answer is the
    /// result. The fast store gets [`FAST_RENEW_GRACE`] after that answer.
    ///
    /// # Cancel safety
    ///
    /// A dropped renewal changes at most lease expiries, on either store.
    pub(super) async fn renew_both(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        let authoritative = self.authoritative.renew(leases);
        let fast = self.fast.renew(leases);
        tokio::pin!(authoritative, fast);
        let mut fast_done = false;
        let result = loop {
            tokio::select! {
                r = &mut authoritative => break r,
                r = &mut fast, if !fast_done => {
                    fast_done = true;
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "layered: fast store renewal failed");
                    }
                }
            }
        };
        if !fast_done {
            if let Ok(Err(e)) = tokio::time::timeout(FAST_RENEW_GRACE, fast).await {
                tracing::debug!(error = %e, "layered: fast store renewal failed");
            }
        }
        result
    }

    /// The authoritative store's status; its waiter count adds the fast
    /// store's (where layered waiters wait) when both stores count them.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub(super) async fn status_both(&self, key: &LockKey) -> Result<LockStatus> {
        if !self.capabilities().counts_waiters {
            return self.authoritative.status(key).await;
        }
        let (authoritative, fast) = tokio::join!(self.authoritative.status(key), self.fast.status(key));
        let mut status = authoritative?;
        status.waiters = match (status.waiters, fast.ok().and_then(|f| f.waiters)) {
            (Some(a), Some(f)) => Some(a + f),
            _ => None,
        };
        Ok(status)
    }
}
