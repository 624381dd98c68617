//! The chain's mode record on the arbiter: which store is active, in which
//! epoch, and the mode leases that let a client grant from it.
//!
//! The record is one key on the arbiter, written with the lease model and
//! the record the arbiter keeps with that key ([`Backend::write_record`]),
//! which only this chain writes:
//!
//! - a **mode lease** is a shared lease on the record key (no limit), never
//!   renewed: a client takes a fresh one every half mode TTL while it
//!   grants, and reads the mode from the key's record once the lease is
//!   granted. No switch can write while the lease is held, so the mode read
//!   is the lease's for as long as the lease lasts (a read that comes back
//!   after the lease's end is not used);
//! - a **switch** takes the record key exclusively, as a writer (so no new
//!   mode lease is granted while it waits, and it is granted only once every
//!   mode lease has expired on the arbiter's clock), reads the record,
//!   checks that the epoch is still the one it meant to leave, and writes
//!   the new mode before releasing. The write is owner-checked in the same
//!   store call: a switch whose writer lease lapsed while its write was in
//!   flight changes nothing, so it cannot move the epoch under mode leases
//!   granted after the lapse.
//!
//! Why not the key's fences: on SQLite one counter serves the whole file,
//! and on PostgreSQL and MySQL the whole namespace, so a mode kept in the
//! record key's fence floor moved with every other tenant's grants and
//! raises (another chain's switch, a RedLock member's write-back), and a
//! Redis arbiter refuses floors above 2^52. The record is the key's alone.
//!
//! The record holds `epoch << 8 | active`; a key without one is in
//! [`Mode::START`]. A record naming a store the chain lacks belongs to
//! another chain's layout under the same name: a typed error, never a
//! grant. 4,095 switches ([`MAX_EPOCH`]) fit in a record's life, since a
//! chain fence keeps the epoch in its top 12 bits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{AcquireRequest, Backend, LeaseMode, UNLIMITED};
use crate::lease::drift_margin;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

/// Bits of a chain fence below the epoch: the active store's own fence.
pub(super) const EPOCH_SHIFT: u32 = 52;
/// The last epoch a record can switch to.
pub const MAX_EPOCH: u64 = (1 << (64 - EPOCH_SHIFT)) - 1;
/// The most stores a chain may have (the active index takes 8 bits).
pub const MAX_STORES: usize = 255;

/// Which store grants, and since which switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// How many switches the record has seen.
    pub epoch: u64,
    /// The index, in the chain, of the store that grants in this epoch.
    pub active: usize,
}

impl Mode {
    /// The mode a record starts in: epoch 0, the first store.
    pub const START: Mode = Mode { epoch: 0, active: 0 };

    /// The mode a record value names, if it is one a chain of `stores`
    /// stores can be in.
    pub(super) fn of_record(value: u64, stores: usize) -> Option<Mode> {
        let mode = Mode { epoch: value >> 8, active: (value & 0xFF) as usize };
        (mode.epoch <= MAX_EPOCH && mode.active < stores).then_some(mode)
    }

    /// The record value that names this mode.
    pub(super) fn record(self) -> u64 {
        (self.epoch << 8) | self.active as u64
    }
}

/// A mode lease as this client holds it.
#[derive(Debug, Clone, Copy)]
pub(super) struct ModeLease {
    token: OwnerToken,
    pub(super) mode: Mode,
    /// Until when this client may grant under it: the arbiter keeps the
    /// lease at least until then, drift included.
    pub(super) until: Instant,
}

/// The record, seen from one client.
#[derive(Debug)]
pub(super) struct ModeRecord {
    arbiter: Arc<dyn Backend>,
    key: LockKey,
    /// How many stores the chain has: a record naming another is refused.
    stores: usize,
    /// The mode lease TTL.
    ttl: Duration,
    label: String,
    current: Mutex<Option<ModeLease>>,
    /// One refresh at a time; callers that find one running wait for it.
    refreshing: tokio::sync::Mutex<()>,
}

impl ModeRecord {
    pub(super) fn new(arbiter: Arc<dyn Backend>, stores: usize, key: LockKey, ttl: Duration, label: String) -> Self {
        let (current, refreshing) = (Mutex::new(None), tokio::sync::Mutex::new(()));
        ModeRecord { arbiter, key, stores, ttl, label, current, refreshing }
    }

    pub(super) fn stores(&self) -> usize {
        self.stores
    }

    /// The mode the record holds now. Read under a lease of the record key
    /// (a mode lease or a switch's writer lease), so that no switch writes
    /// it meanwhile.
    async fn read(&self) -> Result<Mode> {
        let Some(value) = self.arbiter.read_record(&self.key).await? else { return Ok(Mode::START) };
        Mode::of_record(value, self.stores).ok_or_else(|| {
            Error::invalid(
                "fallback chain",
                format!(
                    "the mode record {} on the {} arbiter holds {value:#x}, which names store {} in epoch {} of a \
                     chain of {} stores: another chain layout uses this record name (give each chain its own \
                     `name`)",
                    self.key,
                    self.arbiter.name(),
                    value & 0xFF,
                    value >> 8,
                    self.stores
                ),
            )
        })
    }

    pub(super) fn ttl(&self) -> Duration {
        self.ttl
    }

    pub(super) fn key(&self) -> &LockKey {
        &self.key
    }

    /// The mode lease held now, if its time is not up.
    pub(super) fn current(&self) -> Option<ModeLease> {
        let now = Instant::now();
        self.current.lock().unwrap_or_else(|p| p.into_inner()).filter(|l| l.until > now)
    }

    /// A mode lease with at least `need` left, taken fresh when the one held
    /// has less than half the mode TTL left. With `wait`, a client without a
    /// usable lease waits for one (through a switch in progress); without,
    /// it gets a retryable error.
    ///
    /// The refresh runs on a task of its own, so a caller dropped mid-way
    /// never leaves a mode lease taken and unrecorded (an unrecorded one
    /// would only delay a switch by its TTL, but the task keeps it tidy).
    pub(super) async fn lease_for(self: &Arc<Self>, need: Duration, wait: bool) -> Result<ModeLease> {
        if let Some(l) = self.current().filter(|l| l.until >= Instant::now() + (self.ttl / 2).max(need)) {
            return Ok(l);
        }
        let this = Arc::clone(self);
        let refreshed = tokio::spawn(async move { this.refresh(wait).await })
            .await
            .map_err(|e| Error::backend("fallback", true, format!("mode lease refresh task: {e}")))?;
        let usable = |l: &ModeLease| l.until >= Instant::now() + need;
        match refreshed {
            Ok(l) if usable(&l) => Ok(l),
            // A refresh that failed leaves the lease held, if still usable.
            _ if self.current().is_some_and(|l| usable(&l)) => Ok(self.current().expect("checked just above")),
            Ok(_) => Err(Error::backend("fallback", true, "the mode lease was granted with too little time left")),
            Err(e) => Err(e),
        }
    }

    /// Takes a fresh mode lease and makes it current; the previous one is
    /// released. Returns the current lease.
    async fn refresh(self: &Arc<Self>, wait: bool) -> Result<ModeLease> {
        let _one = self.refreshing.lock().await;
        // Another refresh may have finished while this one queued.
        if let Some(l) = self.current().filter(|l| l.until >= Instant::now() + self.ttl / 2) {
            return Ok(l);
        }
        let req = AcquireRequest::new(self.key.clone(), OwnerToken::random(), self.ttl)
            .with_mode(LeaseMode::Shared { weight: 1, limit: UNLIMITED })
            .with_label(self.label.clone());
        let has_usable = self.current().is_some();
        let attempt = async {
            if wait && !has_usable {
                // Queued behind a switch in progress, if any: bounded by the
                // switch's own bound (a writer waits at most one mode TTL
                // for the leases before it).
                match tokio::time::timeout(3 * self.ttl + Duration::from_secs(5), self.arbiter.acquire(&req)).await {
                    Ok(r) => r.map(Some),
                    Err(_) => Err(Error::backend("fallback", true, "no mode lease within three mode TTLs")),
                }
            } else {
                self.arbiter.try_acquire(&req).await
            }
        };
        let grant = match attempt.await {
            Ok(Some(g)) => g,
            Ok(None) => {
                return Err(Error::backend(
                    "fallback",
                    true,
                    "the chain is switching stores (a switch holds the mode record)",
                ));
            }
            Err(e) => {
                // The attempt may have been applied: let it go (it expires anyway).
                let _ = self.arbiter.release(&self.key, req.token).await;
                return Err(e);
            }
        };
        let valid_for = grant.valid_for.min(self.ttl);
        let until = Instant::from_std(grant.attempt_started) + valid_for - drift_margin(valid_for);
        // The mode is read once the lease is granted; a switch cannot
        // write it before the lease has expired on the arbiter.
        let mode = match self.read().await {
            // A read answered after the lease's end may have seen a later
            // switch: the lease is used only if the read came back within it.
            Ok(mode) if Instant::now() < until => mode,
            other => {
                let _ = self.arbiter.release(&self.key, req.token).await;
                return Err(other.err().unwrap_or_else(|| {
                    Error::backend("fallback", true, "the mode lease ran out before the mode record was read")
                }));
            }
        };
        let lease = ModeLease { token: req.token, mode, until };
        let old = self.current.lock().unwrap_or_else(|p| p.into_inner()).replace(lease);
        if let Some(old) = old {
            let (arbiter, key) = (Arc::clone(&self.arbiter), self.key.clone());
            tokio::spawn(async move {
                // Best effort: an unreleased mode lease only expires later.
                let _ = arbiter.release(&key, old.token).await;
            });
        }
        Ok(lease)
    }

    /// Moves the record from `from` to a new epoch whose active store is
    /// `to`; `Ok(mode)` with the record's mode afterwards (which is not the
    /// switch asked for when another client switched first). Waits until
    /// every mode lease of `from` has expired on the arbiter: about one mode
    /// TTL. Runs on a task of its own, so that a dropped caller never leaves
    /// the record held.
    pub(super) async fn switch(self: &Arc<Self>, from: Mode, to: usize) -> Result<Mode> {
        let this = Arc::clone(self);
        tokio::spawn(async move { this.switch_inner(from, to).await })
            .await
            .map_err(|e| Error::backend("fallback", true, format!("switch task: {e}")))?
    }

    async fn switch_inner(&self, from: Mode, to: usize) -> Result<Mode> {
        if from.epoch >= MAX_EPOCH {
            return Err(Error::Unsupported {
                store: "fallback",
                what: "more than 4,095 switches of one mode record (start a new record name)",
            });
        }
        // A writer lease needs to outlive only the read and the write.
        let req = AcquireRequest::new(self.key.clone(), OwnerToken::random(), self.ttl.max(Duration::from_secs(1)))
            .with_mode(LeaseMode::Writer)
            .with_label(self.label.clone());
        let bound = 2 * self.ttl + Duration::from_secs(5);
        match tokio::time::timeout(bound, self.arbiter.acquire(&req)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let _ = self.arbiter.release(&self.key, req.token).await;
                return Err(e);
            }
            Err(_) => {
                let _ = self.arbiter.release(&self.key, req.token).await;
                return Err(Error::backend("fallback", true, format!("a switch waited {bound:?} for the mode record")));
            }
        };
        let outcome = match self.read().await {
            // Someone else switched first.
            Ok(now) if now.epoch != from.epoch => Ok(now),
            Ok(_) => {
                let next = Mode { epoch: from.epoch + 1, active: to };
                match self.arbiter.write_record(&self.key, req.token, next.record()).await {
                    Ok(true) => Ok(next),
                    Ok(false) => Err(Error::backend("fallback", true, "the switch's hold on the mode record lapsed")),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        let _ = self.arbiter.release(&self.key, req.token).await;
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_through_records() {
        for mode in [
            Mode::START,
            Mode { epoch: 1, active: 0 },
            Mode { epoch: 7, active: 3 },
            Mode { epoch: MAX_EPOCH, active: 254 },
        ] {
            assert_eq!(Mode::of_record(mode.record(), MAX_STORES), Some(mode), "{mode:?}");
        }
        // A store the chain lacks, or an epoch beyond the last, names no mode.
        assert_eq!(Mode::of_record(Mode { epoch: 1, active: 2 }.record(), 2), None);
        assert_eq!(Mode::of_record((MAX_EPOCH + 1) << 8, 2), None);
    }
}
