//! The fence floor a RedLock sends with each round.
//!
//! A member grants a fence of `max(what it would issue, floor)` (see
//! [`AcquireRequest::fence_floor`](crate::backend::AcquireRequest::fence_floor)).
//! A floor above every granting member's last fence makes them all answer
//! the floor, so the round needs no fence write-back: an uncontended acquire
//! is one round. This table remembers, per key, the highest fence the lock
//! saw (granted, or answered by a member in a round that did not count), and
//! asks for one above it. A stale or lost entry costs only a write-back: any
//! floor is safe (the model `holdfast-models` `redlock` explores every floor
//! a client may send, stale and too low included), since a member's fence is
//! still above its counter and `complete` still writes back to every member
//! whose answer was below the round's fence.
//!
//! The floor comes only from fences the members issued, never from the
//! client's clock. Redis members issue fences from their clock (µs) when a
//! key has no fence yet, but with a floor and a kept fence they answer the
//! kept fence plus one, raised to the floor (`acquire.lua`), so one above
//! the last fence seen is their next fence too. (A floor from the client's
//! clock was tried: a client whose clock ran ahead of the members' by more
//! than their fence keep period would have issued fences that a member's own
//! clock falls below once the key's fence expires.)

use std::collections::HashMap;
use std::sync::Mutex;

use crate::vocabulary::key::LockKey;

/// Keys remembered at most; past it the table starts over (a forgotten key
/// costs its next acquire a write-back, nothing else).
const KEPT: usize = 4096;

/// The highest floor sent: the lowest cap among the stores that take floors
/// (Redis: 2^52, its scripts count in doubles). A higher one is not sent.
pub(super) const MAX_FLOOR: u64 = 1 << 52;

/// The highest fence seen per key.
#[derive(Debug, Default)]
pub(super) struct Floors {
    seen: Mutex<HashMap<LockKey, u64>>,
}

impl Floors {
    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<LockKey, u64>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The floor to send for `key`: one above the highest fence seen; 0
    /// (none) for a key not seen, or past [`MAX_FLOOR`].
    pub(super) fn next(&self, key: &LockKey) -> u64 {
        match self.seen().get(key) {
            Some(&last) if last < MAX_FLOOR => last + 1,
            _ => 0,
        }
    }

    /// A member issued `fence` for `key` (its counter stands at least there).
    pub(super) fn saw(&self, key: &LockKey, fence: u64) {
        let mut seen = self.seen();
        if seen.len() >= KEPT && !seen.contains_key(key) {
            seen.clear();
        }
        let last = seen.entry(key.clone()).or_insert(fence);
        *last = (*last).max(fence);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_one_above_the_highest_fence_seen_and_never_the_clock() {
        let floors = Floors::default();
        let key = LockKey::new("k").unwrap();
        assert_eq!(floors.next(&key), 0, "a key never seen has no floor");
        // A fence from a member's clock (µs since 1970, an hour behind the
        // client's): the floor follows the member, not the client's clock.
        let member_clock = 1_700_000_000_000_000;
        floors.saw(&key, member_clock);
        floors.saw(&key, member_clock - 5);
        assert_eq!(floors.next(&key), member_clock + 1);
        floors.saw(&key, MAX_FLOOR);
        assert_eq!(floors.next(&key), 0, "no floor past the cap");
    }
}
