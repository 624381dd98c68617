//! A fair waiter: queued by the fair acquire script, handed the lock by a
//! release, and granted by the hand-off message itself.
//!
//! A release that finds fair waiters queued makes the live head the owner
//! on the server (a new fence, a lease of its claim window) and publishes to
//! the head's client. The message names the token and, for a client whose
//! id ends in `.f` (every client of this version), the fence. The waiter
//! then counts itself granted from the message, without a claim request:
//! one request per acquisition fewer, and one round trip less between a
//! release and the next holder.
//!
//! How long such a grant is valid, by the waiter's clock: until its latest
//! queue request **answered "queued"** was sent, plus the shorter of the
//! TTL and the queue entry's TTL, less the drift margin. That request ran on
//! the server before the hand-off (one run after it would have been answered
//! "granted"), so the entry the hand-off read lives at least until then, and
//! the lease the hand-off wrote ends no earlier than the entry (the claim
//! window is at least the entry's remaining life, or the whole TTL). Counting
//! from when the message arrived, or from a refresh still in flight, or
//! without the queue entry's TTL, would each let two holders overlap: the
//! `fair_handoff` model in `holdfast-models` finds those runs and none for
//! this rule.
//!
//! A waiter claims as before (a fair acquire, which finds it owns the lock
//! and grants it again) when the message carries no fence (a release by an
//! older holdfast, a lock found free, a lost pub/sub connection), when that
//! validity is less than half gone already, or when grants must be confirmed
//! by replicas (`replicas=N`: `WAIT` covers only its own connection's
//! writes, and the hand-off was written by the releasing client's).

use std::time::{Duration, Instant};

use super::RedisBackend;
use crate::backend::{AcquireRequest, Grant};
use crate::error::Result;
use crate::wait::Attempt;

impl RedisBackend {
    /// Queues `req` on the lock's fair queue and waits to be handed the lock,
    /// refreshing the queue entry every quarter of its TTL.
    ///
    /// # Cancel safety
    ///
    /// As [`Backend::acquire`](crate::backend::Backend::acquire): a dropped
    /// call may leave its token queued or handed the lock; the client
    /// releases the token, which removes either.
    pub(super) async fn acquire_fair(&self, req: &AcquireRequest) -> Result<Grant> {
        let config = &self.inner.config;
        // Registered before the first attempt, so a hand-off right after it is not missed.
        let watch = self.inner.notifier.watch_token(req.key.as_str(), req.token.to_hex(), config.timeout).await;
        let refresh = config.queue_ttl / 4;
        loop {
            let notified = watch.notify().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // If answered "queued", the latest request that was.
            let sent = Instant::now();
            let expires_in = match self.attempt(req, true, true).await? {
                Attempt::Granted(grant) => return Ok(grant),
                Attempt::Busy { expires_in } => expires_in,
            };
            let delay = match expires_in {
                Some(left) => refresh.min(left + Duration::from_millis(1)),
                None => refresh,
            };
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(delay) => {}
            }
            if let (Some(fence), 0) = (watch.take_handed_fence(), config.replicas) {
                if let Some(grant) = grant_from_hand_off(fence, sent, req.ttl, config.queue_ttl, Instant::now()) {
                    return Ok(grant);
                }
            }
        }
    }
}

/// The grant a hand-off message with `fence` gives a waiter whose latest
/// queue request answered "queued" left at `queued_sent` (see the module
/// docs), or `None` if less than half of its validity is left at `now` (the
/// waiter claims instead).
///
/// The grant's lease is the TTL counted from a start moved back so that it
/// ends at `queued_sent + min(ttl, queue_ttl)`: renewals then extend it by
/// the full TTL, as any other grant's.
pub(super) fn grant_from_hand_off(
    fence: u64,
    queued_sent: Instant,
    ttl: Duration,
    queue_ttl: Duration,
    now: Instant,
) -> Option<Grant> {
    let window = ttl.min(queue_ttl);
    let started = queued_sent.checked_add(window)?.checked_sub(ttl)?;
    let valid_until = started.checked_add(ttl)?.checked_sub(crate::lease::drift_margin(ttl))?;
    (valid_until.checked_duration_since(now)? >= window / 2).then(|| Grant::new(fence, started, ttl))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// The lease ends where the queue entry vouches for it: the shorter of
    /// the TTL and the entry's TTL after the queued request, less the drift
    /// margin, never later.
    #[test]
    fn the_lease_ends_where_the_queued_request_vouches() {
        let queued = Instant::now();
        for (ttl, queue_ttl) in [(30_000, 2_000), (1_000, 2_000), (2_000, 2_000)] {
            let (ttl, queue_ttl) = (ttl * MS, queue_ttl * MS);
            let grant = grant_from_hand_off(7, queued, ttl, queue_ttl, queued + 10 * MS).expect("fresh enough");
            assert_eq!(grant.fence, 7);
            assert_eq!(grant.valid_for, ttl, "renewals extend by the whole TTL");
            let ends = grant.attempt_started + grant.valid_for - crate::lease::drift_margin(ttl);
            assert_eq!(ends, queued + ttl.min(queue_ttl) - crate::lease::drift_margin(ttl));
        }
    }

    /// A message read after half of that validity is gone is not used: the
    /// waiter claims.
    #[test]
    fn a_late_message_is_claimed_instead() {
        let queued = Instant::now();
        let (ttl, queue_ttl) = (30_000 * MS, 2_000 * MS);
        assert!(grant_from_hand_off(7, queued, ttl, queue_ttl, queued + 600 * MS).is_some());
        assert!(grant_from_hand_off(7, queued, ttl, queue_ttl, queued + 800 * MS).is_none());
        assert!(grant_from_hand_off(7, queued, ttl, queue_ttl, queued + 5_000 * MS).is_none());
    }
}
