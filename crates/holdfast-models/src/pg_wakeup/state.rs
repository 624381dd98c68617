//! The state of the PostgreSQL wake-up model: the key's lease row (its
//! holder and its `wanted` mark) and each waiter's progress through its
//! acquire statement.

use std::fmt;

/// Where one waiter is. Each waiter is its own process, registered with its
/// process's listener before its first waiting attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Waiter {
    /// About to send a waiting attempt.
    Ready,
    /// Its statement took its snapshot: the row's holder and mark as seen.
    Snapped {
        /// The holder the snapshot shows (`None`: the key is free).
        holder: Option<u8>,
        /// Whether the snapshot shows the row marked `wanted`.
        wanted: bool,
    },
    /// Refused and told "registered": sleeps until its process's listener
    /// hears a notification (no poll: a waiter only a poll would wake is the
    /// defect looked for).
    Asleep,
    /// Granted.
    Holding,
    /// Released.
    Done,
}

/// The whole system: process 0 holds the key at first; processes 1.. wait.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WakeupState {
    /// The holder of the row's latest version (`None`: released).
    pub holder: Option<u8>,
    /// The row's latest `wanted` mark (a release keeps it; a grant sets it
    /// to whether the granted client has other waiters: here never).
    pub wanted: bool,
    /// The waiters, process 1 first.
    pub waiters: Vec<Waiter>,
    /// A notification each waiting process's listener heard and none of
    /// its waiters has used yet (tokio's `Notify` keeps one while nobody
    /// sleeps; one for all of a process's waiters of the key), by
    /// [`WakeupState::index`] of the process.
    pub heard: Vec<bool>,
    /// A waiting attempt wrote a new version of a row already marked.
    pub rewrote_marked_row: bool,
    /// A waiter slept on a mark another waiter had written.
    pub slept_on_mark_of_another: bool,
}

impl WakeupState {
    /// Process `p`'s waiter index.
    pub fn index(p: u8) -> usize {
        usize::from(p) - 1
    }

    /// A process sleeps with nothing heard while no notification will come:
    /// it has waiters registered, all asleep (one awake is enough: it asks
    /// the store, and marks the row for the others when granted, as the
    /// client's one turn does), and the row is not held with the mark on.
    /// `process_of` names each waiter's process.
    pub fn sleeps_unannounced(&self, process_of: impl Fn(u8) -> u8) -> bool {
        let waiters = 1..=self.waiters.len() as u8;
        waiters.clone().any(|p| {
            let process = process_of(p);
            let mine = || waiters.clone().filter(|q| process_of(*q) == process && self.registered(*q));
            mine().all(|q| self.waiters[Self::index(q)] == Waiter::Asleep)
                && mine().next().is_some()
                && !self.heard[Self::index(process)]
                && !(self.wanted && self.holder.is_some())
        })
    }

    /// Whether waiter `p` is registered with its process (waiting: ready,
    /// in a statement, or asleep).
    pub fn registered(&self, p: u8) -> bool {
        matches!(self.waiters[Self::index(p)], Waiter::Ready | Waiter::Snapped { .. } | Waiter::Asleep)
    }

    /// How many hold the key.
    pub fn holders(&self) -> usize {
        usize::from(self.holder == Some(0)) + self.waiters.iter().filter(|w| **w == Waiter::Holding).count()
    }
}

impl fmt::Display for WakeupState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.holder {
            Some(h) => write!(f, "row held by P{h}")?,
            None => write!(f, "row released")?,
        }
        write!(f, ", wanted {}, waiters {:?}, heard {:?}", self.wanted, self.waiters, self.heard)
    }
}
