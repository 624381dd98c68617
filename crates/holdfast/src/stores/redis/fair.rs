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
//! Which message it takes: one whose fence is above the lock's last fence
//! as its latest queue request **answered "queued"** found it. Fences only
//! grow, so that hand-off ran after the request. A message without that
//! check could come from an earlier hand-off to the same token whose claim
//! window ran out unclaimed (the message was slow; the token queued again
//! meanwhile), while another client holds the lock now.
//!
//! How long such a grant is valid, by the waiter's clock: until that request
//! was sent, plus the shorter of the TTL and the queue entry's TTL (the
//! grant's `attempt_started` and `valid_for`), less the drift margin. The hand-off read the entry that request (or a later one)
//! wrote, so the entry lived at least that long, and the lease the hand-off
//! wrote ends no earlier than the entry (the claim window is the entry's
//! remaining life, at least 100 ms, or the whole TTL).
//!
//! The `fair_handoff` model in `holdfast-models` checks this rule over a
//! lossy, reordering network with clock drift, and finds two holders at once
//! for each of the rules it replaces: counting from the message's arrival,
//! from a refresh still in flight, by the TTL alone, or without the fence
//! check.
//!
//! A waiter claims as before (a fair acquire, which finds it owns the lock
//! and grants it again) when the message carries no fence (a release by an
//! older holdfast, a lock found free, a lost pub/sub connection), when less
//! than half of that validity is left, or when grants must be confirmed by
//! replicas (`replicas=N`: `WAIT` covers only its own connection's writes,
//! and the hand-off was written by the releasing client's).

use std::time::{Duration, Instant};

use super::keys::{E, H, Q, key_parts};
use super::{RedisBackend, busy_for, ms};
use crate::backend::{AcquireRequest, Grant};
use crate::vocabulary::error::Result;

/// A fair acquire call's answer.
enum FairReply {
    Granted(Grant),
    /// Queued (or the entry refreshed): the holder's time left, and the
    /// lock's last fence as the call found it.
    Queued {
        expires_in: Option<Duration>,
        last_fence: u64,
    },
}

/// What a waiter knows from its latest request answered "queued".
#[derive(Clone, Copy, Debug)]
pub(super) struct Queued {
    /// When it was sent.
    pub(super) sent: Instant,
    /// Every fence granted after it ran is above this.
    pub(super) last_fence: u64,
}

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
            let sent = Instant::now();
            let (expires_in, queued) = match self.fair_attempt(req).await? {
                FairReply::Granted(grant) => return Ok(grant),
                FairReply::Queued { expires_in, last_fence } => (expires_in, Queued { sent, last_fence }),
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
                if let Some(grant) = grant_from_hand_off(fence, queued, req.ttl, config.queue_ttl, Instant::now()) {
                    return Ok(grant);
                }
            }
        }
    }

    /// One fair acquire call: granted, or queued (the call refreshes the
    /// entry of a token queued already).
    async fn fair_attempt(&self, req: &AcquireRequest) -> Result<FairReply> {
        let config = &self.inner.config;
        let mut inv = self.inner.scripts.fair_acquire.call(3);
        for which in [H, Q, E] {
            inv.key_parts(&key_parts(&config.prefix, &req.key, which));
        }
        inv.arg(&req.token.hex_digits()[..]).arg(ms(req.ttl)).arg(&req.label);
        inv.arg(ms(config.queue_ttl)).arg(&self.inner.client_id).arg(ms(config.fence_keep));
        let started = Instant::now();
        let generation = self.track(&self.inner.conn, &mut inv);
        let reply: Vec<i64> = self.invoke(&inv).await?;
        match reply[..] {
            [1, fence, ..] => {
                self.confirm_grant(&req.key, req.token, generation, inv.client_id()).await?; // replicas=N (replicas.rs)
                Ok(FairReply::Granted(Grant::new(fence.max(0) as u64, started, req.ttl)))
            }
            [_, left, last, ..] => Ok(FairReply::Queued { expires_in: busy_for(left), last_fence: last.max(0) as u64 }),
            // A queued reply without the fence (not this version's script):
            // no message can be checked against it, so every one is claimed.
            [_, left] => Ok(FairReply::Queued { expires_in: busy_for(left), last_fence: u64::MAX }),
            _ => Err(crate::vocabulary::error::Error::backend(
                super::STORE,
                false,
                "unexpected reply to the fair acquire script",
            )),
        }
    }
}

/// The grant a hand-off message with `fence` gives a waiter whose latest
/// request answered "queued" was `queued` (see the module docs), or `None`:
/// the message is older than that request (its fence is not above the one
/// the request found), or less than half of the grant's validity is left at
/// `now`. The waiter then claims.
///
/// The grant starts when that request was sent (the request that earned
/// it, as the `Backend` contract asks) and is valid for the claim window the
/// store guarantees from then, the shorter of the TTL and the queue entry's
/// TTL: the lease the hand-off wrote lasts no longer without a renewal. (A
/// renewal extends the lease on the server by the whole TTL; the client,
/// which keeps one validity per lease, counts each renewal as this window,
/// so it renews a hand-off grant every third of the window.)
pub(super) fn grant_from_hand_off(
    fence: u64,
    queued: Queued,
    ttl: Duration,
    queue_ttl: Duration,
    now: Instant,
) -> Option<Grant> {
    if fence <= queued.last_fence {
        return None;
    }
    let window = ttl.min(queue_ttl);
    let valid_until = queued.sent.checked_add(window)?.checked_sub(crate::lease::drift_margin(window))?;
    (valid_until.checked_duration_since(now)? >= window / 2).then(|| Grant::new(fence, queued.sent, window))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn queued_at(sent: Instant) -> Queued {
        Queued { sent, last_fence: 6 }
    }

    /// The grant starts when the queued request was sent (not before) and
    /// is valid for what the queue entry vouches for: the shorter of the TTL
    /// and the entry's TTL, never longer.
    #[test]
    fn the_grant_starts_at_the_queued_request_and_lasts_its_window() {
        let queued = Instant::now();
        for (ttl, queue_ttl) in [(30_000, 2_000), (1_000, 2_000), (2_000, 2_000)] {
            let (ttl, queue_ttl) = (ttl * MS, queue_ttl * MS);
            let grant =
                grant_from_hand_off(7, queued_at(queued), ttl, queue_ttl, queued + 10 * MS).expect("fresh enough");
            assert_eq!(grant.fence, 7);
            assert_eq!(grant.attempt_started, queued, "the start of the request that earned it");
            assert_eq!(grant.valid_for, ttl.min(queue_ttl), "the claim window");
        }
    }

    /// A message read after half of that validity is gone is not used: the
    /// waiter claims.
    #[test]
    fn a_late_message_is_claimed_instead() {
        let queued = Instant::now();
        let (ttl, queue_ttl) = (30_000 * MS, 2_000 * MS);
        // Valid until 2 s less the drift margin (21 ms) after the request.
        assert!(grant_from_hand_off(7, queued_at(queued), ttl, queue_ttl, queued + 900 * MS).is_some());
        assert!(grant_from_hand_off(7, queued_at(queued), ttl, queue_ttl, queued + 1_000 * MS).is_none());
        assert!(grant_from_hand_off(7, queued_at(queued), ttl, queue_ttl, queued + 5_000 * MS).is_none());
    }

    /// A message whose fence is not above the lock's last fence as the
    /// queued request found it comes from an earlier hand-off (whose claim
    /// window may have run out since): claimed, not taken.
    #[test]
    fn a_message_older_than_the_queued_request_is_claimed_instead() {
        let queued = Instant::now();
        let (ttl, queue_ttl) = (30_000 * MS, 2_000 * MS);
        let at = queued + 10 * MS;
        assert!(grant_from_hand_off(6, queued_at(queued), ttl, queue_ttl, at).is_none());
        assert!(grant_from_hand_off(5, queued_at(queued), ttl, queue_ttl, at).is_none());
        let unknown = Queued { sent: queued, last_fence: u64::MAX };
        assert!(grant_from_hand_off(u64::MAX, unknown, ttl, queue_ttl, at).is_none());
    }
}
