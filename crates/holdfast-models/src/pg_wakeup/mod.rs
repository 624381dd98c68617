//! Model 14: how a PostgreSQL waiter makes sure the key's release will wake
//! it (issue 33: on a contended key across processes, every refused waiting
//! attempt rewrote the lease row to mark it `wanted`, already marked or not).
//!
//! The lease row of one key carries a `wanted` mark; a release sends a
//! NOTIFY (which every client's listener hears) only if the row is marked,
//! and keeps the mark; a grant sets it afresh (to whether the new holder's
//! client has other waiters of the key). A
//! waiter's acquire statement runs under `READ COMMITTED`: it takes its
//! snapshot (one step), then its writes (another step), each of which finds
//! its row through the snapshot and, where the row changed since, re-checks
//! its condition on the latest version (PostgreSQL's re-check of an
//! `UPDATE`); a write whose condition fails there changes nothing. A
//! statement that grants nothing answers "registered" or not; a waiter told
//! "registered" sleeps until its listener hears a notification, one not
//! told runs its statement again at once. Each waiter is its own process,
//! listening before its first waiting attempt; a notification heard while
//! no waiter of the process is asleep is kept for the next. With
//! `together`, waiters P1 and P2 are two tasks of one client: one listener,
//! one kept notification (it wakes one of them), and a grant to one of them
//! starts the row marked while the other waits (as a client's grant does
//! when it has other waiters of the key). Expiry is not modelled: a
//! sleeping waiter's timer at the holder's expiry is the fallback, and a
//! waiter that only that timer would wake is the defect looked for.
//!
//! - `Shipped`: a snapshot that shows another live holder and the mark on
//!   answers "registered" and writes nothing; one that shows the mark off
//!   sets it with `UPDATE ... AND NOT wanted` (re-checked: another live
//!   holder, still unmarked), "registered" if it did.
//! - `Before`: the mark always written (re-checked: another live holder),
//!   "registered" if it was: a new row version per refused attempt.
//! - `ForcedRegistered` (rejected; the experiment measured in the
//!   twenty-first session): as `Shipped`, but "registered" whatever the
//!   update found.
//! - `MarkLatest` (rejected): the mark written on the row's latest version
//!   whoever holds it, without the re-check of a live holder.

mod state;

pub use state::{Waiter, WakeupState};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WakeupVariant {
    /// Shipped: a row seen marked is not written; an unmarked one is marked
    /// only if unmarked on its latest version.
    Shipped,
    /// The design before: the mark always written.
    Before,
    /// Rejected: "registered" whatever the update found.
    ForcedRegistered,
    /// Rejected: the mark written without the re-check of a live holder.
    MarkLatest,
}

/// Name of the exclusion property.
pub const ONE_HOLDER: &str = "at most one holder";
/// Name of the wake-up property.
pub const NO_UNANNOUNCED_SLEEP: &str = "no process sleeps unless a notification is on its way or heard";
/// Name of the liveness property.
pub const ALL_SERVED: &str = "every waiter is granted and releases";
/// Name of the cost property.
pub const NO_REWRITE: &str = "no waiting attempt writes a new version of a row already marked";
/// Reachability: a waiter sleeps on a mark another wrote (the write skipped).
pub const SLEEPS_ON_ANOTHERS_MARK: &str = "a waiter sleeps on a mark another waiter wrote";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct WakeupModel {
    /// Which design.
    pub variant: WakeupVariant,
    /// Waiters (process 0 holds at first; each waiter is process 1..).
    pub waiters: u8,
    /// Waiters P1 and P2 are two tasks of one client (process 1).
    pub together: bool,
}

impl WakeupModel {
    /// Two waiters, each its own process, beside the first holder.
    pub fn new(variant: WakeupVariant) -> Self {
        WakeupModel { variant, waiters: 2, together: false }
    }

    /// The process of waiter `p`.
    pub fn process_of(&self, p: u8) -> u8 {
        if self.together && p == 2 { 1 } else { p }
    }

    /// Whether a waiter of `p`'s process other than `p` is registered.
    fn others_wait(&self, s: &WakeupState, p: u8) -> bool {
        (1..=self.waiters).any(|q| q != p && self.process_of(q) == self.process_of(p) && s.registered(q))
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WakeupAction {
    /// A ready waiter's statement takes its snapshot.
    Snapshot(u8),
    /// The statement's writes run against the row's latest version, and the reply arrives.
    Write(u8),
    /// A sleeping waiter's heard notification wakes it.
    Wake(u8),
    /// Process `p` releases the key.
    Release(u8),
}

impl fmt::Display for WakeupAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Snapshot(p) => write!(f, "P{p}'s acquire statement takes its snapshot"),
            Self::Write(p) => write!(f, "P{p}'s statement writes and answers"),
            Self::Wake(p) => write!(f, "P{p}'s listener wakes it"),
            Self::Release(p) => write!(f, "P{p} releases"),
        }
    }
}

impl WakeupModel {
    /// The writes of process `p`'s statement, which saw `seen` (holder,
    /// mark) in its snapshot, against the row's latest version; the
    /// waiter's next state.
    fn write(&self, s: &mut WakeupState, p: u8, seen: (Option<u8>, bool)) -> Waiter {
        let held_by_other = s.holder.is_some_and(|h| h != p);
        let Some(_) = seen.0 else {
            // The snapshot showed the key free: the grant, re-checked.
            if s.holder.is_none() {
                s.holder = Some(p);
                s.wanted = self.others_wait(s, p);
                return Waiter::Holding;
            }
            return Waiter::Ready; // taken since: run again at once
        };
        let marked_by_another = s.wanted;
        let registered = match self.variant {
            WakeupVariant::Before => {
                if held_by_other {
                    s.rewrote_marked_row |= s.wanted;
                    s.wanted = true;
                }
                held_by_other
            }
            WakeupVariant::Shipped | WakeupVariant::ForcedRegistered => {
                let marked = if seen.1 {
                    true
                } else if held_by_other && !s.wanted {
                    s.wanted = true;
                    true
                } else {
                    false
                };
                marked || self.variant == WakeupVariant::ForcedRegistered
            }
            WakeupVariant::MarkLatest => {
                s.rewrote_marked_row |= s.wanted;
                s.wanted = true;
                true
            }
        };
        if !registered {
            return Waiter::Ready;
        }
        s.slept_on_mark_of_another |= seen.1 && marked_by_another;
        Waiter::Asleep
    }
}

impl Model for WakeupModel {
    type State = WakeupState;
    type Action = WakeupAction;

    fn init_states(&self) -> Vec<WakeupState> {
        let n = usize::from(self.waiters);
        vec![WakeupState {
            holder: Some(0),
            wanted: false,
            waiters: vec![Waiter::Ready; n],
            heard: vec![false; n],
            rewrote_marked_row: false,
            slept_on_mark_of_another: false,
        }]
    }

    fn actions(&self, s: &WakeupState, actions: &mut Vec<WakeupAction>) {
        if s.holder == Some(0) {
            actions.push(WakeupAction::Release(0));
        }
        for p in 1..=self.waiters {
            let i = WakeupState::index(p);
            match s.waiters[i] {
                Waiter::Ready => actions.push(WakeupAction::Snapshot(p)),
                Waiter::Snapped { .. } => actions.push(WakeupAction::Write(p)),
                Waiter::Asleep if s.heard[WakeupState::index(self.process_of(p))] => {
                    actions.push(WakeupAction::Wake(p))
                }
                Waiter::Holding => actions.push(WakeupAction::Release(p)),
                _ => {}
            }
        }
    }

    fn next_state(&self, s: &WakeupState, action: WakeupAction) -> Option<WakeupState> {
        let mut n = s.clone();
        match action {
            WakeupAction::Snapshot(p) => {
                n.waiters[WakeupState::index(p)] = Waiter::Snapped { holder: s.holder, wanted: s.wanted };
            }
            WakeupAction::Write(p) => {
                let Waiter::Snapped { holder, wanted } = s.waiters[WakeupState::index(p)] else { return None };
                let next = self.write(&mut n, p, (holder, wanted));
                n.waiters[WakeupState::index(p)] = next;
            }
            WakeupAction::Wake(p) => {
                n.heard[WakeupState::index(self.process_of(p))] = false;
                n.waiters[WakeupState::index(p)] = Waiter::Ready;
            }
            WakeupAction::Release(p) => {
                n.holder = None;
                if p > 0 {
                    n.waiters[WakeupState::index(p)] = Waiter::Done;
                }
                if n.wanted {
                    // Every listener hears it; it is kept for a process
                    // with a waiter registered (the key's wake-ups).
                    for q in 1..=self.waiters {
                        if n.registered(q) {
                            n.heard[WakeupState::index(self.process_of(q))] = true;
                        }
                    }
                }
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_HOLDER, |_, s: &WakeupState| s.holders() <= 1),
            Property::always(NO_UNANNOUNCED_SLEEP, |m: &Self, s: &WakeupState| {
                !s.sleeps_unannounced(|p| m.process_of(p))
            }),
            Property::eventually(ALL_SERVED, |_, s: &WakeupState| s.waiters.iter().all(|w| *w == Waiter::Done)),
            Property::always(NO_REWRITE, |_, s: &WakeupState| !s.rewrote_marked_row),
            Property::sometimes(SLEEPS_ON_ANOTHERS_MARK, |_, s: &WakeupState| s.slept_on_mark_of_another),
        ]
    }
}
