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
    /// A notification each waiter's listener heard and its waiter has not
    /// yet used (tokio's `Notify` keeps one while nobody sleeps).
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

    /// A waiter sleeps with nothing heard while no notification will come:
    /// the row is not held by another with the mark on.
    pub fn sleeps_unannounced(&self) -> bool {
        self.waiters.iter().enumerate().any(|(i, w)| {
            let p = i as u8 + 1;
            *w == Waiter::Asleep && !self.heard[i] && !(self.wanted && self.holder.is_some_and(|h| h != p))
        })
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
