//! The fence floor a RedLock sends with each round.
//!
//! A member grants a fence of `max(what it would issue, floor)` (see
//! [`AcquireRequest::fence_floor`](crate::backend::AcquireRequest::fence_floor)).
//! A floor above every granting member's counter makes them all answer the
//! floor, so the round needs no fence write-back: an uncontended acquire is
//! one round. This table remembers, per key, the highest fence the lock saw
//! (granted, or answered by a member in a round that did not count), and
//! asks for one above it. A stale or lost entry costs only a write-back: any
//! floor is safe (the model `holdfast-models` `redlock` explores every floor
//! a client may send, stale and too low included), since a member's fence is
//! still above its counter and `complete` still writes back to every member
//! whose answer was below the round's fence.
//!
//! Members whose fences follow a clock (Redis: the server clock in µs) issue
//! fences that move with time, not with grants, so one above the last fence
//! seen is below their next one. For them (recognised by the size of their
//! fences: above 2^50, µs since 1970 after the year 2005) the floor is the
//! client's clock in µs plus one call timeout, which is ahead of a member
//! whose clock is within a call timeout of the client's when the call lands
//! (a later answer is a failed vote anyway). Fences then still move with the
//! clock, ahead of it by at most a call timeout.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::vocabulary::key::LockKey;

/// Keys remembered at most; past it the table starts over (a forgotten key
/// costs its next acquire a write-back, nothing else).
const KEPT: usize = 4096;

/// Fences from here on are taken for a clock in µs (the year 2005 and later).
const CLOCK_FENCES: u64 = 1 << 50;

/// The highest floor sent: the lowest cap among the stores that take floors
/// (Redis: 2^52, its scripts count in doubles). A higher one is not sent.
pub(super) const MAX_FLOOR: u64 = 1 << 52;

/// The highest fence seen per key.
#[derive(Debug, Default)]
pub(super) struct Floors {
    seen: Mutex<HashMap<LockKey, u64>>,
    /// Whether the members' fences looked like a clock: the floor of a key
    /// not seen yet follows the clock too.
    clock_fences: AtomicBool,
}

impl Floors {
    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<LockKey, u64>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The floor to send for `key`: one above the highest fence seen, and on
    /// members whose fences follow a clock, at least the client's clock in µs
    /// plus `lead`; 0 (none) for a key never seen on counter members, or past
    /// [`MAX_FLOOR`].
    pub(super) fn next(&self, key: &LockKey, lead: Duration) -> u64 {
        let last = self.seen().get(key).copied();
        let clock = last.map_or_else(|| self.clock_fences.load(Ordering::Relaxed), |l| l >= CLOCK_FENCES);
        let mut floor = last.map_or(0, |l| l.saturating_add(1));
        if clock {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default() + lead;
            floor = floor.max(u64::try_from(now.as_micros()).unwrap_or(u64::MAX));
        }
        if floor > MAX_FLOOR { 0 } else { floor }
    }

    /// A member issued `fence` for `key` (its counter stands at least there).
    pub(super) fn saw(&self, key: &LockKey, fence: u64) {
        if fence >= CLOCK_FENCES {
            self.clock_fences.store(true, Ordering::Relaxed);
        }
        let mut seen = self.seen();
        if seen.len() >= KEPT && !seen.contains_key(key) {
            seen.clear();
        }
        let last = seen.entry(key.clone()).or_insert(fence);
        *last = (*last).max(fence);
    }
}
