//! Whether this client's waiting shares of a key may wait in the store side
//! by side (issue 33: a semaphore's permits taken one join at a time ran at
//! 0.31-0.44x its floor).
//!
//! A process's waiting shares of a key normally take turns, one queue node
//! in the store at a time ([`wait::take_turn`]): each node a share adds
//! behind a waiting one makes the head waiter list the queue again, and
//! with several processes side by side waiters cost more than they gain
//! (docs/performance.md, 2026-11-30 (evening) and 2026-12-04 (morning)).
//! While every node of the key's queue is this client's, no other process
//! pays for them: the shares then take lanes ([`wait::take_lane`]), as
//! many as the limit admits, at most [`wait::MAX_LANES`], and their joins
//! overlap. A node of anyone else in a share's listing makes the key's next
//! waiters ask alone again; the lanes already taken finish their turn, so a
//! process never keeps more than `MAX_LANES` waiting nodes on a key.
//!
//! This is a choice of how many of this client's requests wait at once, not
//! of who is granted: every node is admitted by the queue's rule alone.
//!
//! [`wait::take_turn`]: crate::backend::wait::take_turn
//! [`wait::take_lane`]: crate::backend::wait::take_lane
//! [`wait::MAX_LANES`]: crate::backend::wait::MAX_LANES

use super::{ZkBackend, nodes};
use crate::vocabulary::key::OwnerToken;

/// How many forgotten tokens are remembered: a node released by this
/// client after a listing was taken is still in that listing, and must not
/// read as another client's.
const FORGOTTEN: usize = 256;

impl ZkBackend {
    /// Whether every node of `queue` is one of this client's (a live
    /// attempt's, or one of the last tokens it forgot).
    fn queue_is_ours(&self, queue: &[String]) -> bool {
        let tokens: Vec<u128> = queue
            .iter()
            .filter_map(|n| nodes::parse_name(n).and_then(|(_, t, _)| u128::from_str_radix(t, 16).ok()))
            .collect();
        if tokens.len() < queue.len() {
            return false;
        }
        let attempts = self.inner.attempts.lock().unwrap_or_else(|p| p.into_inner());
        let forgotten = self.inner.forgotten.lock().unwrap_or_else(|p| p.into_inner());
        tokens.iter().all(|t| attempts.contains_key(t) || forgotten.contains(t))
    }

    /// After an admission check of `key` over `queue`: the key's next
    /// waiting shares may wait side by side only if the queue is this
    /// client's; and whether the next join lists the queue right behind it
    /// (a queue that held others), which a join alone never needs.
    pub(super) fn note_queue(&self, key: &str, queue: &[String]) {
        self.inner.waiters.note_queue(key, self.queue_is_ours(queue), queue.len() > 1);
    }

    /// Whether the key's last queue seen by a waiter held others.
    pub(super) fn crowded(&self, key: &str) -> bool {
        self.inner.waiters.crowded(key)
    }

    /// Remembers a token this client forgot (see [`FORGOTTEN`]).
    pub(super) fn remember_forgotten(&self, token: OwnerToken) {
        let mut forgotten = self.inner.forgotten.lock().unwrap_or_else(|p| p.into_inner());
        if forgotten.len() == FORGOTTEN {
            forgotten.pop_front();
        }
        forgotten.push_back(token.as_u128());
    }
}
