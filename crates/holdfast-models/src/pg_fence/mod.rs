//! Model 7: per-key fences on PostgreSQL (issue 33 item 4).
//!
//! The PostgreSQL store kept ONE fence counter per namespace (the row
//! `{table}_fence` id 0), bumped by every grant of a free key under its row
//! lock, so grants of different keys waited for each other. The shipped
//! layout keeps a key's fence in its lease row instead: a release leaves the
//! row (the released marker: an empty token, expired at the release), a grant
//! of a key that has a row takes `row.fence + 1` under that row's lock, and
//! only a key without a row draws from the counter. Rows are deleted by the
//! sweep alone, which raises the counter to the deleted fence in the same
//! transaction (and so does a trigger on every delete, which covers the
//! deletes of clients of the old layout).
//!
//! One key; the counter stands for the namespace's. An acquire statement of
//! the new layout is two steps: its snapshot (`cur`, which decides whether
//! the counter is drawn from), then its writes, which see the latest row
//! version under the row's lock (`INSERT .. ON CONFLICT DO UPDATE` and
//! `UPDATE` under READ COMMITTED). Anything may run between the two. A
//! shared acquire is one transaction holding the gate row's lock from its
//! first statement, so it is one step. Clients of the old layout run their
//! statements as they were: the acquire bumps the counter and takes over a
//! row with the counter's value; the shared acquire draws the counter for
//! its fence; the release and the sweep DELETE the row.
//!
//! Time is abstract: a lease is live until it runs out (`Expire`), and the
//! sweep may delete any row that is not live (released, or expired however
//! long ago: the keep period only makes it rarer).

mod state;

pub use state::{FenceState, Holder, LeaseRow, Phase, client_name};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceVariant {
    /// Shipped: per-key fences; a statement whose snapshot saw a row that is
    /// gone by its writes changes nothing and runs again; the sweep raises the
    /// counter to what it deletes (and a delete trigger does the same for any
    /// client); the old counter row refuses every write (old clients fail
    /// loudly); shares draw from the gate row.
    Shipped,
    /// Rejected: a statement whose snapshot saw a row that is gone by its
    /// writes inserts with the snapshot's fence + 1.
    NoRetry,
    /// Rejected: a grant over an existing row takes the snapshot's fence + 1
    /// rather than the latest row version's.
    SnapshotFence,
    /// Rejected: the sweep deletes rows without raising the counter (and no
    /// delete trigger).
    SweepWithoutRaise,
    /// Rejected: shares keep drawing from the namespace counter (today's
    /// `fence_next`), the gate's fence set to theirs.
    SharesFromCounter,
    /// Rejected: old clients run unguarded (no trigger, no refusal).
    NoGuard,
    /// Rejected: option (T), triggers alone: an update that changes a row's
    /// token without raising its fence is raised to `OLD.fence + 1`, a delete
    /// raises the counter; old clients keep drawing from the counter.
    TriggersOnly,
}

/// What kind of client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The new layout's exclusive acquire (two steps).
    Exclusive,
    /// The new layout's shared acquire (one transaction).
    Shared,
    /// An exclusive client of the old layout.
    OldExclusive,
    /// A shared client of the old layout.
    OldShared,
}

/// Name of the mutual-exclusion property.
pub const MUTUAL_EXCLUSION: &str = "no two conflicting leases of the key are live at once";
/// Name of the fence-order property.
pub const FENCES_INCREASE: &str = "each grant's fence is above every earlier grant's of the key";
/// Reachability: a grant after the sweep deleted the row.
pub const GRANT_AFTER_SWEEP: &str = "the key is granted again after its row was swept";
/// Reachability: an acquire statement asked to run again.
pub const RETRIED: &str = "an acquire statement found its snapshot's row gone and ran again";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct FenceModel {
    /// Which design.
    pub variant: FenceVariant,
    /// The clients.
    pub kinds: Vec<Kind>,
    /// Acquisitions (attempts, for old clients) per client.
    pub grants: u8,
    /// Whether a second initial state has the first old exclusive client
    /// holding the key from before the migration (the counterexample
    /// searches start from the empty state alone, so that they replay).
    pub held_from_before: bool,
    /// The properties checked (empty: all). A counterexample search checks
    /// only the property it looks for: stateright's breadth-first search
    /// keeps the last violating state it visits for an always-property, not
    /// the first, so the search must end at the first one to report the
    /// shortest run.
    pub checked: Vec<&'static str>,
}

impl FenceModel {
    /// Two exclusive clients, a shared one, an old exclusive one and an old
    /// shared one, two acquisitions each.
    pub fn new(variant: FenceVariant) -> Self {
        let kinds = vec![Kind::Exclusive, Kind::Exclusive, Kind::Shared, Kind::OldExclusive, Kind::OldShared];
        FenceModel { variant, kinds, grants: 2, held_from_before: true, checked: Vec::new() }
    }

    /// The same model checking only `properties`.
    pub fn checking(mut self, properties: &[&'static str]) -> Self {
        self.checked = properties.to_vec();
        self
    }

    /// The same model with other clients.
    pub fn with_kinds(mut self, kinds: &[Kind], grants: u8) -> Self {
        self.kinds = kinds.to_vec();
        self.grants = grants;
        self.held_from_before = false;
        self
    }

    fn has_delete_trigger(&self) -> bool {
        !matches!(self.variant, FenceVariant::SweepWithoutRaise | FenceVariant::NoGuard)
    }

    /// The new layout: the counter drawn for a key without a row.
    fn draw(s: &mut FenceState) -> u8 {
        s.counter += 1;
        s.counter
    }

    fn grant(&self, s: &mut FenceState, c: u8, fence: u8, shared: bool) {
        let (x, sh) = s.live_holders();
        if x > 0 || (!shared && sh > 0) {
            s.granted_over_live = true;
        }
        if fence <= s.top_fence {
            s.fence_went_back = true;
        }
        s.top_fence = s.top_fence.max(fence);
        if s.swept {
            s.granted_after_sweep = true;
        }
        s.clients[c as usize] = Phase::Holding { fence, live: true, shared };
    }

    /// The writes of a new-layout acquire whose snapshot saw `seen`.
    fn write(&self, s: &mut FenceState, c: u8, seen: Option<LeaseRow>) {
        let token = Holder::Exclusive(c, s.grants[c as usize]);
        s.clients[c as usize] = Phase::Idle;
        let fence = match (seen, s.row) {
            // `f` then `ins`: the counter, then the insert or the conflict
            // path on the latest row version.
            (None, None) => Self::draw(s),
            (None, Some(r)) => {
                let drawn = Self::draw(s);
                if r.live {
                    return; // busy
                }
                drawn.max(r.fence + 1)
            }
            // `upd`: the latest row version, or nothing if it is gone.
            (Some(_), Some(r)) if r.live => return,
            (Some(seen), Some(r)) => {
                if self.variant == FenceVariant::SnapshotFence {
                    seen.fence + 1
                } else {
                    r.fence + 1
                }
            }
            (Some(seen), None) => {
                if self.variant == FenceVariant::NoRetry {
                    seen.fence + 1
                } else {
                    s.retried = true;
                    return; // nothing changed; the client runs it again at once
                }
            }
        };
        s.row = Some(LeaseRow { holder: token, fence, live: true });
        s.grants[c as usize] += 1;
        self.grant(s, c, fence, false);
    }

    /// A shared acquire: one transaction under the gate row's lock.
    fn acquire_shared(&self, s: &mut FenceState, c: u8) {
        s.grants[c as usize] += 1;
        let from_counter = self.variant == FenceVariant::SharesFromCounter;
        let row = match s.row {
            Some(r) => r,
            // The new layout creates the gate row with a fence drawn from the
            // counter; today's with 0.
            None => LeaseRow { holder: Holder::Gate, fence: if from_counter { 0 } else { Self::draw(s) }, live: false },
        };
        if row.live && row.holder != Holder::Gate {
            s.row = Some(row);
            return; // refused
        }
        let fence = if from_counter { Self::draw(s) } else { row.fence + 1 };
        let gate_fence = if from_counter { fence } else { row.fence.max(fence) };
        s.row = Some(LeaseRow { holder: Holder::Gate, fence: gate_fence, live: true });
        self.grant(s, c, fence, true);
    }

    /// The old layout's acquire: the counter bumped when no live holder was
    /// seen, then the insert or the takeover of an expired row with it.
    fn old_acquire(&self, s: &mut FenceState, c: u8) {
        s.grants[c as usize] += 1;
        if s.row.is_some_and(|r| r.live) {
            return; // busy
        }
        if self.refuses_old() {
            return; // the old counter row refuses the write: an error
        }
        let drawn = Self::draw(s);
        let fence = match s.row {
            Some(r) if self.variant == FenceVariant::TriggersOnly && drawn <= r.fence => r.fence + 1,
            _ => drawn,
        };
        s.row = Some(LeaseRow { holder: Holder::Exclusive(c, s.grants[c as usize] - 1), fence, live: true });
        self.grant(s, c, fence, false);
    }

    /// The old layout's shared acquire: the gate row made (fence 0) or
    /// locked, then a fence from the counter.
    fn old_acquire_shared(&self, s: &mut FenceState, c: u8) {
        s.grants[c as usize] += 1;
        let row = s.row.unwrap_or(LeaseRow { holder: Holder::Gate, fence: 0, live: false });
        if row.live && row.holder != Holder::Gate {
            return; // refused (the gate row it made, if any, stays: harmless)
        }
        if self.refuses_old() {
            return; // the old counter row refuses: the transaction rolls back
        }
        let fence = Self::draw(s);
        // `gate_to_shares` sets the token to GATE: the (T) trigger raises
        // the row's fence only when the token changes.
        let row_fence =
            if self.variant == FenceVariant::TriggersOnly && row.holder != Holder::Gate && fence <= row.fence {
                row.fence + 1
            } else {
                fence
            };
        s.row = Some(LeaseRow { holder: Holder::Gate, fence: row_fence, live: true });
        self.grant(s, c, fence, true);
    }

    fn refuses_old(&self) -> bool {
        !matches!(self.variant, FenceVariant::NoGuard | FenceVariant::TriggersOnly)
    }

    /// Whether another share than `c`'s is live.
    fn other_live_share(s: &FenceState, c: u8) -> bool {
        s.clients
            .iter()
            .enumerate()
            .any(|(i, p)| i != c as usize && matches!(p, Phase::Holding { live: true, shared: true, .. }))
    }

    /// A release (`old`: the old layout's DELETE), or the lease running
    /// out (`expire`).
    fn end(&self, s: &mut FenceState, c: u8, old: bool, expire: bool) {
        let Phase::Holding { fence, shared, .. } = s.clients[c as usize] else { return };
        let token = Holder::Exclusive(c, s.grants[c as usize] - 1);
        if shared {
            // The share row deleted (or expired); the gate shrunk to the
            // latest live share, or expired.
            let others = Self::other_live_share(s, c);
            if let Some(r) = s.row.as_mut()
                && r.holder == Holder::Gate
            {
                r.live = others;
            }
        } else if let Some(r) = s.row
            && r.holder == token
        {
            if expire {
                s.row = Some(LeaseRow { live: false, ..r });
            } else if old {
                s.row = None;
                if self.has_delete_trigger() {
                    s.counter = s.counter.max(r.fence);
                }
            } else {
                s.row = Some(LeaseRow { holder: Holder::Released, fence: r.fence, live: false });
            }
        }
        s.clients[c as usize] = if expire { Phase::Holding { fence, shared, live: false } } else { Phase::Idle };
    }

    fn sweep(&self, s: &mut FenceState) {
        if let Some(r) = s.row
            && !r.live
        {
            s.row = None;
            s.swept = true;
            if self.variant != FenceVariant::SweepWithoutRaise {
                s.counter = s.counter.max(r.fence);
            }
        }
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceAction {
    /// A new exclusive client's acquire statement takes its snapshot.
    Snapshot(u8),
    /// Its writes run.
    Write(u8),
    /// A shared acquire (new or old layout) runs its transaction.
    AcquireShared(u8),
    /// An old exclusive client's acquire statement.
    OldAcquire(u8),
    /// A holder releases.
    Release(u8),
    /// A holder's lease runs out.
    Expire(u8),
    /// The sweep deletes the row if it is not live.
    Sweep,
}

impl fmt::Display for FenceAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Snapshot(c) => write!(f, "{}'s acquire takes its snapshot", client_name(*c)),
            Self::Write(c) => write!(f, "{}'s acquire writes", client_name(*c)),
            Self::AcquireShared(c) => write!(f, "{} acquires a share", client_name(*c)),
            Self::OldAcquire(c) => write!(f, "{} (old layout) acquires", client_name(*c)),
            Self::Release(c) => write!(f, "{} releases", client_name(*c)),
            Self::Expire(c) => write!(f, "{}'s lease runs out", client_name(*c)),
            Self::Sweep => write!(f, "the sweep runs"),
        }
    }
}

impl Model for FenceModel {
    type State = FenceState;
    type Action = FenceAction;

    fn init_states(&self) -> Vec<FenceState> {
        let n = self.kinds.len();
        let empty = FenceState {
            counter: 0,
            row: None,
            clients: vec![Phase::Idle; n],
            grants: vec![0; n],
            top_fence: 0,
            fence_went_back: false,
            granted_over_live: false,
            swept: false,
            granted_after_sweep: false,
            retried: false,
        };
        let mut states = vec![empty.clone()];
        // A namespace migrated while an old client held the key (its row and
        // the counter as the old layout left them).
        if let Some(old) = self.kinds.iter().position(|k| *k == Kind::OldExclusive)
            && self.held_from_before
        {
            let mut held = empty;
            held.counter = 1;
            held.top_fence = 1;
            held.row = Some(LeaseRow { holder: Holder::Exclusive(old as u8, 0), fence: 1, live: true });
            held.clients[old] = Phase::Holding { fence: 1, live: true, shared: false };
            held.grants[old] = 1;
            states.push(held);
        }
        states
    }

    fn actions(&self, s: &FenceState, actions: &mut Vec<FenceAction>) {
        for (i, kind) in self.kinds.iter().enumerate() {
            let c = i as u8;
            let more = s.grants[i] < self.grants;
            match (s.clients[i], kind) {
                (Phase::Idle, Kind::Exclusive) if more => actions.push(FenceAction::Snapshot(c)),
                (Phase::Idle, Kind::Shared | Kind::OldShared) if more => actions.push(FenceAction::AcquireShared(c)),
                (Phase::Idle, Kind::OldExclusive) if more => actions.push(FenceAction::OldAcquire(c)),
                (Phase::Snapped(_), _) => actions.push(FenceAction::Write(c)),
                (Phase::Holding { live, .. }, _) => {
                    actions.push(FenceAction::Release(c));
                    if live {
                        actions.push(FenceAction::Expire(c));
                    }
                }
                _ => {}
            }
        }
        if s.row.is_some_and(|r| !r.live) {
            actions.push(FenceAction::Sweep);
        }
    }

    fn next_state(&self, s: &FenceState, action: FenceAction) -> Option<FenceState> {
        let mut next = s.clone();
        match action {
            FenceAction::Snapshot(c) => next.clients[c as usize] = Phase::Snapped(s.row),
            FenceAction::Write(c) => {
                let Phase::Snapped(seen) = s.clients[c as usize] else { return None };
                self.write(&mut next, c, seen);
            }
            FenceAction::AcquireShared(c) => match self.kinds[c as usize] {
                Kind::OldShared => self.old_acquire_shared(&mut next, c),
                _ => self.acquire_shared(&mut next, c),
            },
            FenceAction::OldAcquire(c) => self.old_acquire(&mut next, c),
            FenceAction::Release(c) => {
                let old = matches!(self.kinds[c as usize], Kind::OldExclusive | Kind::OldShared);
                self.end(&mut next, c, old, false)
            }
            FenceAction::Expire(c) => self.end(&mut next, c, false, true),
            FenceAction::Sweep => self.sweep(&mut next),
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let all = vec![
            Property::always(MUTUAL_EXCLUSION, |_, s: &FenceState| !s.granted_over_live && !s.two_live_leases()),
            Property::always(FENCES_INCREASE, |_, s: &FenceState| !s.fence_went_back),
            Property::sometimes(GRANT_AFTER_SWEEP, |_, s: &FenceState| s.granted_after_sweep),
            Property::sometimes(RETRIED, |_, s: &FenceState| s.retried),
        ];
        all.into_iter().filter(|p| self.checked.is_empty() || self.checked.contains(&p.name)).collect()
    }
}
