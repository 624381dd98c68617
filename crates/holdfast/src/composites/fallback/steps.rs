//! The steps of a grant through the chain: waiting on the active store
//! under a mode lease, counting a grant, switching when the store fails,
//! failing back, and the chain fence.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::mode::{EPOCH_SHIFT, Mode, ModeLease};
use super::{Fallback, PROBE_TIMEOUT, STORE_FENCE_MASK};
use crate::backend::{AcquireRequest, Backend, Grant};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

/// How a wait on the active store ended.
pub(super) enum Waited {
    Granted(Grant),
    Failed(Error),
    /// The record moved to another store while waiting.
    Moved,
}

impl Fallback {
    pub(super) fn arbiter(&self) -> Arc<dyn Backend> {
        Arc::clone(self.stores.last().expect("a chain has at least two stores"))
    }

    /// How far ahead a grant or renewal of TTL `ttl` is vouched for.
    pub(super) fn need(&self, ttl: Duration) -> Duration {
        ttl.min(self.record.ttl() / 2)
    }

    /// The chain fence of a grant by store `store` with fence `fence` in `mode`.
    pub(super) fn fence(&self, mode: Mode, store: usize, fence: u64) -> Result<u64> {
        let low = if store == self.stores.len() - 1 {
            // The arbiter's counter is shared with its other tenants on the
            // SQL stores (one per file or namespace), and before the mode
            // moved into a record it carried the chain's epoch floors: its
            // low 52 bits still increase within an epoch.
            fence & STORE_FENCE_MASK
        } else if fence > STORE_FENCE_MASK {
            return Err(Error::backend(
                "fallback",
                false,
                format!("store {store} issued fence {fence}, above the 2^52 a chain fence keeps"),
            ));
        } else {
            fence
        };
        Ok((mode.epoch << EPOCH_SHIFT) | low)
    }

    /// Notes a failure of `mode`'s active store; true once it has failed
    /// for `switch_after`.
    pub(super) fn store_failed(&self, mode: Mode) -> bool {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match *failing {
            Some((m, since)) if m == mode => now.duration_since(since) >= self.switch_after,
            _ => {
                *failing = Some((mode, now));
                self.switch_after.is_zero()
            }
        }
    }

    /// Whether store `store` answers a read now (within [`PROBE_TIMEOUT`]),
    /// asked before the chain moves on from it: a store that stalled twice
    /// with no call of this client between (a slow script, a pause) has
    /// not failed for `switch_after`, and a switch would cost every client
    /// a mode TTL without grants. If it answers, its run of failures is
    /// over.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read; dropped, nothing switches.
    pub(super) async fn still_answers(&self, mode: Mode, store: usize) -> bool {
        let probe = tokio::time::timeout(PROBE_TIMEOUT, self.stores[store].status(self.record.key())).await;
        let answers = matches!(probe, Ok(Ok(_)));
        if answers {
            self.store_answered(mode);
        }
        answers
    }

    pub(super) fn store_answered(&self, mode: Mode) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        if failing.is_some_and(|(m, _)| m == mode) {
            *failing = None;
        }
    }

    /// Starts a switch back to the first store, in the background, once the
    /// chain has run on another for `fail_back_after` and the first store
    /// answers a probe.
    pub(super) fn maybe_fail_back(&self, mode: Mode) {
        let Some(after) = self.fail_back_after.filter(|_| mode.active != 0) else { return };
        let now = Instant::now();
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            match &mut *seen {
                Some((m, since, probed)) if *m == mode => {
                    let due =
                        now.duration_since(*since) >= after && probed.is_none_or(|p| now.duration_since(p) >= after);
                    if !due {
                        return;
                    }
                    *probed = Some(now);
                }
                _ => {
                    *seen = Some((mode, now, None));
                    return;
                }
            }
        }
        // Off the caller's path: the probe may take up to PROBE_TIMEOUT.
        let (first, record) = (Arc::clone(&self.stores[0]), Arc::clone(&self.record));
        tokio::spawn(async move {
            let probe = tokio::time::timeout(PROBE_TIMEOUT, first.status(record.key())).await;
            if matches!(probe, Ok(Ok(_))) {
                // A failed fail-back is retried at the next probe.
                let _ = record.switch(mode, 0).await;
            }
        });
    }

    /// Waits on store `store` under `lease`, taking fresh mode leases as
    /// they come due, until the store answers or the record moves away.
    pub(super) async fn wait_on(
        &self,
        store: usize,
        req: &AcquireRequest,
        mut lease: ModeLease,
        need: Duration,
    ) -> Waited {
        let acquire = self.stores[store].acquire(req);
        tokio::pin!(acquire);
        loop {
            let floor = Instant::now() + self.record.ttl() / 20;
            let refresh_at = lease.until.checked_sub(self.record.ttl() / 2).unwrap_or(floor).max(floor);
            tokio::select! {
                // In the order written, not at random: a seed replays exactly.
                biased;
                answer = &mut acquire => return match answer {
                    Ok(grant) => Waited::Granted(grant),
                    Err(e) => Waited::Failed(e),
                },
                () = tokio::time::sleep_until(refresh_at) => match self.record.lease_for(need, true).await {
                    Ok(fresh) if fresh.mode.active == store => lease = fresh,
                    Ok(_) => return Waited::Moved,
                    Err(e) => return Waited::Failed(e),
                },
            }
        }
    }

    /// Counts `grant` from store `store` (asked under `token`) if a mode
    /// lease naming that store reaches as far as the grant is believed;
    /// `None` (the grant let go) if the record has moved to another store.
    pub(super) async fn count(
        &self,
        req: &AcquireRequest,
        store: usize,
        token: OwnerToken,
        grant: Grant,
    ) -> Result<Option<Grant>> {
        let need = self.need(req.ttl);
        // An error here leaves the store's grant recorded: the client's
        // retry (same token) or release picks it up.
        let lease = self.record.lease_for(need, false).await?;
        if lease.mode.active != store {
            self.let_go(&req.key, store, token);
            return Ok(None);
        }
        let fence = match self.fence(lease.mode, store, grant.fence) {
            Ok(f) => f,
            Err(e) => {
                self.let_go(&req.key, store, token);
                return Err(e);
            }
        };
        self.holdings.granted(&req.key, req.token, (store, token));
        // The lease reaches `need` from now, and the grant is believed at
        // most `valid_for` from its start, which is before now.
        let valid_for = grant.valid_for.min(req.ttl).min(need);
        Ok(Some(Grant { fence, attempt_started: grant.attempt_started, valid_for, session_lost: grant.session_lost }))
    }

    /// Releases one store attempt in the background (it stays recorded, so
    /// the client's release repeats it).
    pub(super) fn let_go(&self, key: &LockKey, store: usize, token: OwnerToken) {
        let (backend, key) = (Arc::clone(&self.stores[store]), key.clone());
        tokio::spawn(async move {
            let _ = backend.release(&key, token).await;
        });
    }

    /// The request to send store `store` for client request `req`.
    pub(super) fn store_request(&self, req: &AcquireRequest, store: usize) -> (AcquireRequest, OwnerToken) {
        let (token, sent_before) = self.holdings.next(&req.key, req.token, store, req.ttl);
        let mut r = req.clone();
        r.token = token;
        r.retry = req.retry || sent_before;
        (r, token)
    }
}
