//! Redis's local hand-over calls (issue 33, item 2; the shared machinery,
//! offers and failure paths are `lease/handover.rs`'s).
//!
//! - A mutex (non-fair, exclusive) is handed by `hand_over.lua` (model
//!   `handover`): if the releasing token holds an unexpired lease, no fair
//!   waiter is queued and fewer than [`HAND_OVER_BOUND`] hand-overs in a
//!   row led to it, the store makes the waiter's own token the holder with
//!   the next fence and the waiter's TTL (server clock). After the bound the
//!   script releases as a plain release does and wakes the lock's channel,
//!   so a waiter of another client can be granted: one client never keeps a
//!   key from other clients for more than the bound's hand-overs in a row.
//! - A share is handed by `share_hand_over.lua` (model `share_handover`):
//!   if the releasing token holds a live share, the store releases it and
//!   admits the waiter by the rule of every shared acquire, in the same
//!   call; not admitted, the call is the share's release (the lock's
//!   channel told) and the waiter waits on. Its reply's `spare` tells the
//!   client whether its next waiter may ask beside the call.
//! - A script's reply `(1, fence)` is a hand-over, `(0, 1)` a release (the
//!   bound, or a share not admitted), `(0, 0)` nothing changed. A handed
//!   grant under `replicas=N` is confirmed as every grant is.

use super::keys::{H, key_parts, lock_keys};
use super::{RedisBackend, ms};
use crate::backend::wait::{Attempt, PollBounds};
use crate::backend::{AcquireRequest, LeaseMode, admission};
use crate::lease::handover::{HandOver, Offer, Offers, Passed};
use crate::vocabulary::error::Result;
use crate::vocabulary::key::{LockKey, OwnerToken};
use std::sync::Arc;

/// Hand-overs in a row (within one client) after which a release is a
/// plain release that wakes every client's waiters. Eight keeps the cost
/// of that release (a notification and a new acquire) to about a ninth of
/// the grants under contention, and another client's waiter behind at most
/// eight grants of this one.
pub(super) const HAND_OVER_BOUND: u32 = 8;

impl HandOver for RedisBackend {
    fn offers(&self) -> &Arc<Offers> {
        &self.inner.offers
    }

    fn poll(&self) -> PollBounds {
        self.inner.config.poll
    }

    async fn attempt_while_waiting(&self, req: &AcquireRequest) -> Result<Attempt> {
        if req.mode == LeaseMode::Exclusive {
            self.attempt(req, true).await
        } else {
            self.attempt_shared(req, true).await
        }
    }

    async fn release_without_hand_over(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        self.release_plain(key, token).await
    }

    async fn hand_over(&self, key: &LockKey, from: OwnerToken, offer: &Offer) -> Result<Passed> {
        let config = &self.inner.config;
        let mut inv = if offer.mode == LeaseMode::Exclusive {
            let mut inv = self.inner.scripts.hand_over.call(1);
            inv.key_parts(&key_parts(&config.prefix, key, H));
            inv.arg(&from.hex_digits()[..]).arg(&offer.token.hex_digits()[..]).arg(ms(offer.ttl)).arg(&offer.label);
            inv.arg(ms(config.fence_keep)).arg(HAND_OVER_BOUND);
            inv
        } else {
            let [h, _, _, s] = lock_keys(&config.prefix, key);
            let (_, weight, limit) = admission::encode(offer.mode);
            let mut inv = self.inner.scripts.share_hand_over.call(2);
            inv.key(h).key(s);
            inv.arg(&from.hex_digits()[..]).arg(&offer.token.hex_digits()[..]).arg(ms(offer.ttl)).arg(&offer.label);
            inv.arg(weight).arg(limit).arg(ms(config.fence_keep));
            inv
        };
        inv.arg_parts(&self.inner.notifier.naming().lock_channel_parts(key.as_str()));
        let generation = self.track(&self.inner.conn, &mut inv);
        let reply: Vec<i64> = self.invoke(&inv).await?;
        if offer.mode != LeaseMode::Exclusive {
            self.inner.offers.note_spare(key.as_str(), reply.get(2).copied());
        }
        match (reply.first().copied().unwrap_or(0), reply.get(1).copied().unwrap_or(0)) {
            (1, fence) => {
                // replicas=N (replicas.rs): an unconfirmed grant is released.
                self.confirm_grant(key, offer.token, generation, inv.client_id()).await?;
                Ok(Passed::Handed(fence.max(0) as u64))
            }
            (0, 1) => Ok(Passed::Released),
            _ => Ok(Passed::Untouched),
        }
    }
}
