//! MySQL/MariaDB's local hand-over of shares (issue 33, item 2): a granted
//! share released while another task of this client waits for a share of
//! the key is handed to it by one call of `NAME_share_pass1`
//! (`share_procs`); the offers and failure paths are `lease/handover.rs`'s.
//! Only shares (permits, read leases) are handed, and only where the
//! procedures are usable: a mutex's contended cycle already runs at or
//! above its floor here, and a writer is served by its reservation.

use std::sync::Arc;

use super::{MysqlBackend, Turn};
use crate::backend::wait::{Attempt, PollBounds};
use crate::backend::{AcquireRequest, LeaseMode, UNLIMITED};
use crate::lease::handover::{HandOver, Offer, Offers, Passed};
use crate::vocabulary::error::Result;
use crate::vocabulary::key::{LockKey, OwnerToken};

impl MysqlBackend {
    /// Whether a waiting acquire of `mode` leaves an offer: a permit of a
    /// bounded semaphore, where the procedures are usable. A read lease
    /// (an unlimited share) waits only behind a writer, whose reservation
    /// refuses every hand-over: its offers only cost (the read-write lock
    /// ran at 0.76x its floor with them against 0.95x without, 2026-12-03).
    pub(super) fn offers_for(&self, mode: LeaseMode) -> bool {
        matches!(mode, LeaseMode::Shared { limit, .. } if limit != UNLIMITED) && self.shares.procs.usable()
    }

    /// Whether a release of `token` may hand over: this client's granted
    /// share, where the procedures are usable.
    pub(super) fn hands_over(&self, token: OwnerToken) -> bool {
        self.shares.procs.usable() && self.share_tokens().get(&token) == Some(&true)
    }
}

impl HandOver for MysqlBackend {
    fn offers(&self) -> &Arc<Offers> {
        &self.offers
    }

    fn poll(&self) -> PollBounds {
        self.config.poll
    }

    async fn attempt_while_waiting(&self, req: &AcquireRequest) -> Result<Attempt> {
        // Only shares offer; the turn matters to the mutex's attempts alone.
        self.waiting_attempt(req, Turn::Wait).await
    }

    async fn release_without_hand_over(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        self.release_plain(key, token).await
    }

    async fn hand_over(&self, key: &LockKey, from: OwnerToken, offer: &Offer) -> Result<Passed> {
        let LeaseMode::Shared { weight, limit } = offer.mode else { return Ok(Passed::Untouched) };
        let (k, from_bytes, to_bytes) = (key.as_str().as_bytes(), from.to_bytes(), offer.token.to_bytes());
        let label: String = offer.label.chars().take(255).collect();
        let ttl_us = super::session::micros(offer.ttl);
        // A deadlock victim rolled back: the call is whole or not at all.
        let passed = self
            .retry_contention(|| {
                self.timed(async |op| {
                    let mut conn = op.conn().await?;
                    let procs = &self.shares.procs;
                    let ask = (weight.into(), limit.into());
                    procs.hand_over(&mut conn, (k, &from_bytes, &to_bytes), ask, &label, ttl_us).await
                })
            })
            .await?;
        // What the call found free is not noted: a waiter whose offer is
        // taken keeps its turn, as a mutex's does. Waiters asking side by
        // side run refused transactions that write reservations, after
        // which no procedure can grant (0.08x the floor, 2026-12-03).
        let (passed, _spare) = passed.unwrap_or((Passed::Untouched, None));
        match passed {
            Passed::Handed(_) => {
                self.share_tokens().insert(offer.token, true);
                self.forget(from);
            }
            Passed::Released => {
                self.forget(from);
                self.wakeups.wake_one(key.as_str());
            }
            Passed::Untouched => {}
        }
        Ok(passed)
    }
}
