//! One lease as the client sees it: its local deadline, `lost()` and
//! `expiring()`, and the horizon after which releasing it no longer matters.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::Grant;
use crate::vocabulary::key::{LockKey, OwnerToken};
use crate::vocabulary::metrics::{KeyMetrics, LostCause};

/// The margin by which the client's view of a lease ends before the store's:
/// 1% of the TTL for clock-rate drift between client and store, plus 1 ms.
pub(crate) fn drift_margin(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(1)
}

/// One granted lease as the client sees it.
#[derive(Debug)]
pub(crate) struct LeaseState {
    pub(crate) key: LockKey,
    pub(crate) token: OwnerToken,
    pub(crate) fence: u64,
    pub(crate) ttl: Duration,
    /// How long the store keeps the grant after a request that vouched for
    /// it (the TTL, or less where a session bounds it).
    valid_for: Duration,
    /// The local deadline and whether the lease was lost, under one lock
    /// (one lock a lease, not four fields of their own: a client may hold
    /// 100,000 leases).
    life: Mutex<Life>,
    /// A deadline no renewal moves the lease past: one TTL after the grant
    /// for a lease not renewed on a session-bound store, whose renewals
    /// then only keep the session's word for that TTL (see
    /// [`end_after_one_ttl`](Self::end_after_one_ttl)).
    ends_by: Option<Instant>,
    session_lost: Option<CancellationToken>,
    /// The client's metric handles for this key's prefix.
    pub(crate) metrics: Arc<KeyMetrics>,
}

/// What changes in a lease's life.
#[derive(Debug)]
struct Life {
    valid_until: Instant,
    /// Lost (or ended after a failed release): `lost()` has fired or will.
    lost: bool,
    /// Whether the lease's end was counted (lost once, or released).
    accounted: bool,
    /// Why the lease was lost: the first cause seen.
    cause: Option<LostCause>,
    /// The token `lost()` and `expiring()` wait on, made at the first such
    /// call (cancelled when lost): a client holding 100,000 leases that
    /// nobody watches keeps no `CancellationToken` (about 110 bytes) each.
    waiters: Option<CancellationToken>,
}

impl LeaseState {
    pub(crate) fn new(key: LockKey, token: OwnerToken, ttl: Duration, grant: Grant, metrics: Arc<KeyMetrics>) -> Self {
        let valid_for = grant.valid_for.min(ttl);
        LeaseState {
            key,
            token,
            fence: grant.fence,
            ttl,
            valid_for,
            life: Mutex::new(Life {
                valid_until: Instant::from_std(grant.attempt_started) + valid_for - drift_margin(valid_for),
                lost: false,
                accounted: false,
                cause: None,
                waiters: None,
            }),
            ends_by: None,
            session_lost: grant.session_lost,
            metrics,
        }
    }

    fn life(&self) -> MutexGuard<'_, Life> {
        self.life.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the lease lost (and its end counted, if `count` is given and it
    /// was not counted yet), cancelling the waiters' token outside the lock.
    fn lose(&self, count: Option<LostCause>) {
        let (token, counted) = {
            let mut life = self.life();
            life.lost = true;
            let counted = count.filter(|_| !std::mem::replace(&mut life.accounted, true));
            if let Some(cause) = count {
                life.cause.get_or_insert(cause);
            }
            (life.waiters.clone(), counted)
        };
        if let Some(cause) = counted {
            self.metrics.lost(cause);
        }
        if let Some(token) = token {
            token.cancel();
        }
    }

    /// The token waiters wait on: cancelled now if the lease is lost
    /// already, else when it is.
    fn waiters(&self) -> CancellationToken {
        let mut life = self.life();
        let token = life.waiters.get_or_insert_with(CancellationToken::new).clone();
        if life.lost {
            token.cancel();
        }
        token
    }

    /// Makes this lease end one TTL after `started` (its grant's
    /// `attempt_started`), less the drift margin, as a lease without renewal
    /// does on a store that keeps a grant for its TTL. For a lease whose
    /// grant the store vouches for only `valid_for < ttl` at a time (a
    /// session bounds it): the client then renews it to reach that end,
    /// and no renewal extends it past.
    pub(crate) fn end_after_one_ttl(&mut self, started: std::time::Instant) {
        self.ends_by = Some(Instant::from_std(started) + self.ttl - drift_margin(self.ttl));
    }

    /// How long the store keeps this grant without renewal.
    pub(crate) fn valid_for(&self) -> Duration {
        self.valid_for
    }

    /// After when releasing this lease no longer matters.
    pub(crate) fn release_horizon(&self) -> Horizon {
        match &self.session_lost {
            Some(session) => Horizon::Session(session.clone()),
            // The store's deadline is at most one drift margin after ours;
            // allow one more for its clock running slow.
            None => Horizon::At(self.valid_until() + 2 * drift_margin(self.valid_for)),
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.life().valid_until
    }

    /// Extends the local deadline after a renewal whose request left at `sent`.
    pub(super) fn extended(&self, sent: Instant) {
        let vouched = sent + self.valid_for - drift_margin(self.valid_for);
        let mut life = self.life();
        life.valid_until = life.valid_until.max(self.ends_by.map_or(vouched, |end| vouched.min(end)));
    }

    /// Marks the lease lost, counting it once (unless it was released).
    pub(crate) fn mark_lost(&self, cause: LostCause) {
        self.lose(Some(cause));
    }

    /// Marks the lease's end as counted without counting a loss: it was
    /// released (or given up) by its guard, so a deadline that passes later
    /// is no loss.
    pub(crate) fn mark_ended(&self) {
        self.life().accounted = true;
    }

    /// Ends the lease after a release that failed: `lost()` fires, no loss
    /// is counted.
    pub(crate) fn end(&self) {
        self.mark_ended();
        self.lose(None);
    }

    /// Why the lease was lost, if it was (the first cause seen).
    pub(crate) fn lost_cause(&self) -> Option<LostCause> {
        self.life().cause
    }

    pub(crate) fn is_lost(&self) -> bool {
        if self.life().lost {
            return true;
        }
        if self.session_lost.as_ref().is_some_and(|s| s.is_cancelled()) {
            self.mark_lost(LostCause::Session);
            return true;
        }
        if Instant::now() >= self.valid_until() {
            self.mark_lost(LostCause::Deadline);
            return true;
        }
        false
    }

    /// Resolves once the lease is lost: marked by the renewer, reported by
    /// the store's session, or past its local deadline (whichever is first;
    /// the deadline is checked here too, so a starved renewal task cannot
    /// delay the signal).
    pub(crate) async fn lost(self: Arc<Self>) {
        let session = session_ended(self.session_lost.as_ref());
        tokio::pin!(session);
        let lost = self.waiters();
        loop {
            let deadline = self.valid_until();
            tokio::select! {
                // In the order written, not at random: a seed replays exactly.
                biased;
                _ = lost.cancelled() => return,
                _ = &mut session => { self.mark_lost(LostCause::Session); return }
                _ = tokio::time::sleep_until(deadline) => {
                    if Instant::now() >= self.valid_until() {
                        self.mark_lost(LostCause::Deadline);
                        return;
                    }
                }
            }
        }
    }
}

impl LeaseState {
    /// Resolves once the lease can no longer be guaranteed for the next
    /// `within`: it is lost, or its local deadline (which only a successful
    /// renewal moves) is less than `within` away.
    pub(crate) async fn expiring(self: Arc<Self>, within: Duration) {
        let session = session_ended(self.session_lost.as_ref());
        tokio::pin!(session);
        let lost = self.waiters();
        loop {
            let at = self.valid_until().checked_sub(within).unwrap_or_else(Instant::now);
            tokio::select! {
                // In the order written, not at random: a seed replays exactly.
                biased;
                _ = lost.cancelled() => return,
                _ = &mut session => { self.mark_lost(LostCause::Session); return }
                _ = tokio::time::sleep_until(at) => {
                    // Past what the clock can count is past the deadline too.
                    if Instant::now().checked_add(within).is_none_or(|end| end >= self.valid_until()) {
                        return;
                    }
                }
            }
        }
    }
}

/// Resolves when the store's session behind a lease ends; never for a lease
/// without one (without making a token that is never cancelled: a token is
/// an allocation, and `lost()` and `expiring()` are called in loops).
async fn session_ended(session: Option<&CancellationToken>) {
    match session {
        Some(token) => token.cancelled().await,
        None => std::future::pending().await,
    }
}

/// After when a release no longer matters, because the store has let the
/// grant go by itself.
#[derive(Debug, Clone)]
pub(crate) enum Horizon {
    /// The store expires the grant by this instant (its TTL, plus drift).
    At(Instant),
    /// The grant lives on a store session; it goes when the session ends.
    Session(CancellationToken),
    /// Unknown (an abandoned attempt on a session-bound store): the store's
    /// release reports `Ok(false)` once the grant cannot exist any more.
    Unknown,
}

impl Horizon {
    pub(crate) fn passed(&self) -> bool {
        match self {
            Horizon::At(t) => Instant::now() >= *t,
            Horizon::Session(s) => s.is_cancelled(),
            Horizon::Unknown => false,
        }
    }

    pub(crate) async fn reached(&self) {
        match self {
            Horizon::At(t) => tokio::time::sleep_until(*t).await,
            Horizon::Session(s) => s.cancelled().await,
            Horizon::Unknown => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::LeaseState;
    use crate::backend::Grant;
    use crate::vocabulary::key::{LockKey, OwnerToken};
    use crate::vocabulary::metrics::{KeyMetrics, LostCause};

    fn lease() -> LeaseState {
        let ttl = Duration::from_secs(30);
        let grant = Grant { fence: 1, attempt_started: std::time::Instant::now(), valid_for: ttl, session_lost: None };
        LeaseState::new(LockKey::new("k").unwrap(), OwnerToken::from_bytes([7; 16]), ttl, grant, KeyMetrics::noop())
    }

    /// A waiter's token fires whether it was made before the loss or after,
    /// no token is made while nobody waits, and the first cause stays.
    #[test]
    fn lost_reaches_waiters_made_before_and_after() {
        let before = lease();
        let early = before.waiters();
        assert!(!early.is_cancelled() && !before.is_lost());
        before.mark_lost(LostCause::Renewal);
        before.mark_lost(LostCause::Deadline);
        assert!(early.is_cancelled() && before.is_lost());
        assert!(before.waiters().is_cancelled());
        assert!(matches!(before.lost_cause(), Some(LostCause::Renewal)));

        let after = lease();
        after.end();
        assert!(after.life().waiters.is_none(), "a token made with nobody waiting");
        assert!(after.is_lost() && after.lost_cause().is_none());
        assert!(after.waiters().is_cancelled());
    }

    /// One lease's state stays small: a client may hold 100,000.
    #[test]
    fn a_lease_state_takes_at_most_160_bytes() {
        assert!(std::mem::size_of::<LeaseState>() <= 160, "{} bytes", std::mem::size_of::<LeaseState>());
    }
}
