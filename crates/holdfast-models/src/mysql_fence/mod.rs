//! Model 8: per-key fences on MySQL/MariaDB (issue 33 item 4).
//!
//! The MySQL store draws every grant's fence from ONE counter row per
//! namespace (`{ns}_fence` id 0), so grants of different keys queue on that
//! row. The layout modelled here keeps a key's fence in its lease row, as
//! [`crate::pg_fence`] does on PostgreSQL: a release leaves the row as the
//! released marker, a grant of a key that has a row takes `row.fence + 1`
//! under that row's lock, and only a key without a row draws from the
//! counter. The sweep and the forced release raise the counter to what they
//! delete, in the transaction that deletes it. A share of a key that has a
//! row is fenced from the row (the gate) alone, as an exclusive grant over a
//! row is, so shares of different keys never wait for one another; a share
//! of a key without a row draws from the counter; the gate's fence is kept
//! at least every share's.
//!
//! One key; the counter stands for the namespace's. Time is abstract: a
//! lease is live until it runs out (`Expire`), and the sweep may delete any
//! row that is not live (the keep period only makes it rarer).
//!
//! # The statements as atomic steps
//!
//! Every statement of the layout takes row locks and sees the latest
//! committed row, so each action below is ONE atomic step:
//!
//! - `FastGrant`: one autocommit `UPDATE leases SET fence = IF(free,
//!   fence + 1, fence), token = .. WHERE lock_key = ?`. InnoDB's `UPDATE`
//!   locks the row and evaluates `free` on its latest committed version.
//! - `SlowGrant`: one transaction, the counter row first (`fence_next`,
//!   `UPDATE .. SET value = value + 1`, locked to the commit), then `INSERT .. ON DUPLICATE
//!   KEY UPDATE lock_key = lock_key`, whose duplicate check reads the latest
//!   committed key under a lock; a duplicate (affected rows 0) rolls back,
//!   the counter unchanged. Everything that writes the counter locks it
//!   first, so the transaction is serialised at its insert.
//! - `Release`: `UPDATE .. SET token = released, live_until = now WHERE
//!   lock_key = ? AND token = ?` (the row stays).
//! - `Sweep`, `ForceRelease`, `ShareGrant`, `ShareRelease`, `ShareAgain`,
//!   `RaiseFence`: transactions that lock the counter row (the first two,
//!   and a share of a key without a row) and the key's rows with `SELECT ..
//!   FOR UPDATE` before deciding, and check the expiry again under those
//!   locks (the sweep's unlocked search for candidates only shrinks what it
//!   may delete). A share's transaction that finds no row takes the
//!   counter's lock and then reads the row again: a row inserted between its
//!   first read (which locks nothing when there is no row) and the counter
//!   is then seen, since every insert of a row holds the counter; without
//!   the second read the share's insert would meet an exclusive holder's
//!   new row and turn it into its gate, a double grant that this model,
//!   whose steps are atomic, cannot show.
//!
//! Unlike [`crate::pg_fence`], there is no snapshot step: PostgreSQL's
//! `INSERT .. ON CONFLICT` decides from the statement's snapshot, which may
//! be stale by the time it writes. Under READ COMMITTED, InnoDB's `UPDATE`,
//! `INSERT .. ON DUPLICATE KEY UPDATE` and `SELECT .. FOR UPDATE` are
//! locking reads of the latest committed row. A server with
//! `binlog_format=STATEMENT` runs REPEATABLE READ instead (READ COMMITTED
//! needs row-based logging); there plain `SELECT`s read the transaction's
//! snapshot, but `UPDATE`, `INSERT .. ON DUPLICATE KEY UPDATE` and locking
//! reads still read the latest committed row under its lock, so the same
//! steps hold.
//!
//! # Old clients
//!
//! A client started before the upgrade runs the old statements: its grant
//! bumps the counter and takes over a free row with the counter's value, its
//! sweep and forced release delete without raising anything, its release
//! deletes the row. In the initial state an old client may hold the row with
//! a fence at most the counter's (the old layout drew every fence from it).
//! The upgrade renames the lease tables' expiry column, so every old
//! statement that names the expiry fails: only `OldRelease` (a `DELETE ..
//! WHERE lock_key = ? AND token = ?`) still runs. The model offers the
//! failing ones only to the variant without the rename (a statement that
//! fails changes nothing).
//!
//! # Variants and their counterexamples
//!
//! [`FenceVariant::Shipped`] has none over a complete exploration (three new
//! clients, one old one that may hold the key from before the upgrade, three
//! grants each, one fence raise). Each rejected variant repeats a fence;
//! `tests/mysql_fence.rs` prints the shortest run from the empty state, with
//! no fence raise (so none of them needs one):
//!
//! - `SweepWithoutRaise` (6 steps): A is granted 1 from the counter,
//!   releases, takes the marker over (2), releases; the sweep deletes the
//!   marker, the counter still 1; A draws 2 again.
//! - `ForceWithoutRaise` (5 steps): the same with the forced release
//!   deleting A's live row (fence 2) in place of the release and the sweep.
//! - `SharesFromCounter` (5 steps): A is granted 1, then 2 over its marker
//!   (counter 1); B's share draws 2 from the counter.
//! - `GateNotRaised` (3 steps): A's share draws 1 from the counter and
//!   inserts the gate (fence 1); B's share is fenced 2 from the gate, which
//!   stays at 1; C's share is fenced 2 again.
//! - `GateOverwrite` (6 steps): shares A (1) and B (2); A re-acquires,
//!   writing the gate's fence back to 1; both release; A takes the gate over
//!   with 2.
//! - `NoRename` (5 steps): A is granted 1, then 2 over its marker (counter
//!   1); the old client's grant takes the marker over with the counter's 2.
//! - `ReleaseDeletes` (5 steps): A's share (1) and its release leave the gate
//!   free; A takes it over (2, counter 1); A's release deletes the row; A
//!   draws 2 again.
//!
//! [`FenceVariant::SharesUnderCounter`], the layout shipped before (every
//! share under the counter's lock, fenced above both the counter and the
//! row), has no counterexample either: it is slower, not wrong (the shares
//! of every key of a namespace queued on the counter row: 673 read locks a
//! second on 64 keys of their own, against 8,060 mutex cycles).
//!
//! Each counterexample forgets a granted fence: the row's, above the counter,
//! deleted without raising the counter or overlooked by a draw from it, or a
//! share's, written over in the gate. The shipped layout keeps the greatest
//! fence in the row until a transaction that holds the counter's lock raises
//! the counter to it and deletes the row.
//!
//! A fence raise ([`FenceAction::RaiseFence`]) is a floor every later grant
//! must be above, so it counts in [`FENCES_INCREASE`] as a fence granted.
//! Leases run out one at a time (`Expire` names the client), which covers
//! every lease running out at once.
//!
//! Not modelled: more keys (the counter's other users only raise it),
//! renewal (it only keeps a live lease live), reservations, the wait for a
//! row lock (each step is atomic, as the locks make it), a lost reply and its
//! retry (a grant over the client's own row: a new grant).

mod state;
mod steps;

pub use state::{FenceState, LeaseRow, Share, Token, client_name};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceVariant {
    /// Shipped: per-key fences in the lease row; the release leaves the
    /// released marker; the sweep and the forced release raise the counter
    /// to what they delete; a share takes the row's next fence where the key
    /// has a row (the counter's next where it has none), and the gate keeps
    /// the greatest fence; the expiry column is renamed, so old clients'
    /// grants, sweeps and forced releases fail.
    Shipped,
    /// Sound, superseded (shipped until 2026-12-01): every share takes the
    /// greater of the counter's next and the row's next, under the
    /// counter's lock.
    SharesUnderCounter,
    /// Rejected: the sweep deletes without raising the counter.
    SweepWithoutRaise,
    /// Rejected: the forced release deletes without raising the counter.
    ForceWithoutRaise,
    /// Rejected: a share's fence is the counter's next alone (the row's fence
    /// ignored) and the gate's fence is set to it.
    SharesFromCounter,
    /// Rejected: a share's grant and re-acquire set the gate's fence to the
    /// share's rather than the greater of the two.
    GateOverwrite,
    /// Rejected: a share fenced from the row leaves the row's fence as it
    /// was (the gate not raised to the share's fence).
    GateNotRaised,
    /// Rejected: the expiry column is not renamed, so old clients run every
    /// statement as they were.
    NoRename,
    /// Rejected: the release deletes the row (as the old layout did), with
    /// no counter raise.
    ReleaseDeletes,
}

/// What kind of client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A client of the new layout: exclusive grants and shares.
    New,
    /// An exclusive client started before the upgrade.
    Old,
}

// The properties this model shares with the PostgreSQL one, by name.
pub use crate::pg_fence::{FENCES_INCREASE, GRANT_AFTER_SWEEP, MUTUAL_EXCLUSION};
/// Reachability: an exclusive grant over the released marker.
pub const GRANT_OVER_MARKER: &str = "an exclusive grant takes over the released marker";
/// Reachability: a share granted over a row whose fence is above the counter.
pub const SHARE_OVER_RAISED_ROW: &str = "a share is granted over a row whose fence is above the counter";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct FenceModel {
    /// Which design.
    pub variant: FenceVariant,
    /// The clients.
    pub kinds: Vec<Kind>,
    /// Grants (attempts, for old clients) per client.
    pub grants: u8,
    /// Fence raises in all.
    pub raises: u8,
    /// Whether a second initial state has the first old client holding the
    /// key from before the upgrade (the counterexample searches start from
    /// the empty state alone, so that they replay).
    pub held_from_before: bool,
    /// The properties checked (empty: all). A counterexample search checks
    /// only the ones it looks for, so that the breadth-first checker stops at
    /// the first state violating them, a shortest run: stateright 0.31 goes
    /// on to the end of its block of states while any property awaits a
    /// discovery, replacing an always-property's counterexample with each
    /// later (longer) one it pops.
    pub checked: Vec<&'static str>,
}

impl FenceModel {
    /// Three new clients and an old one, three grants each, one fence raise,
    /// the old client possibly holding the key from before the upgrade.
    pub fn new(variant: FenceVariant) -> Self {
        let kinds = vec![Kind::New, Kind::New, Kind::New, Kind::Old];
        FenceModel { variant, kinds, grants: 3, raises: 1, held_from_before: true, checked: Vec::new() }
    }

    /// The same model with other clients and budgets, from the empty state.
    pub fn with_kinds(mut self, kinds: &[Kind], grants: u8, raises: u8) -> Self {
        self.kinds = kinds.to_vec();
        self.grants = grants;
        self.raises = raises;
        self.held_from_before = false;
        self
    }

    /// The same model checking only `properties`.
    pub fn checking(mut self, properties: &[&'static str]) -> Self {
        self.checked = properties.to_vec();
        self
    }
}

/// What may happen next (each action one atomic step).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceAction {
    /// A new client's autocommit takeover of a row that is not live.
    FastGrant(u8),
    /// A new client's counter draw and insert, for a key without a row.
    SlowGrant(u8),
    /// A new client releases its exclusive lease (the row stays).
    Release(u8),
    /// A client's lease (exclusive or share) runs out.
    Expire(u8),
    /// The sweep deletes a row that is not live, raising the counter.
    Sweep,
    /// The admin's forced release deletes the row and the shares, raising
    /// the counter.
    ForceRelease,
    /// A new client is granted a share.
    ShareGrant(u8),
    /// A new client re-acquires its live share.
    ShareAgain(u8),
    /// A new client releases its share.
    ShareRelease(u8),
    /// A new client holding a live lease raises the key's fence.
    RaiseFence(u8),
    /// An old client's acquire (unrenamed only).
    OldGrant(u8),
    /// An old client's release (a DELETE).
    OldRelease(u8),
    /// An old client's sweep (unrenamed only).
    OldSweep,
    /// An old client's forced release (unrenamed only).
    OldForceRelease,
}

impl fmt::Display for FenceAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FastGrant(c) => write!(f, "{} takes over the row", client_name(*c)),
            Self::SlowGrant(c) => write!(f, "{} draws the counter and inserts the row", client_name(*c)),
            Self::Release(c) => write!(f, "{} releases", client_name(*c)),
            Self::Expire(c) => write!(f, "{}'s lease runs out", client_name(*c)),
            Self::Sweep => write!(f, "the sweep runs"),
            Self::ForceRelease => write!(f, "the admin forces a release"),
            Self::ShareGrant(c) => write!(f, "{} acquires a share", client_name(*c)),
            Self::ShareAgain(c) => write!(f, "{} re-acquires its share", client_name(*c)),
            Self::ShareRelease(c) => write!(f, "{} releases its share", client_name(*c)),
            Self::RaiseFence(c) => write!(f, "{} raises the key's fence", client_name(*c)),
            Self::OldGrant(c) => write!(f, "{} (old layout) acquires", client_name(*c)),
            Self::OldRelease(c) => write!(f, "{} (old layout) releases", client_name(*c)),
            Self::OldSweep => write!(f, "an old client's sweep runs"),
            Self::OldForceRelease => write!(f, "an old client's forced release runs"),
        }
    }
}

impl Model for FenceModel {
    type State = FenceState;
    type Action = FenceAction;

    fn init_states(&self) -> Vec<FenceState> {
        let empty = FenceState::empty(self.kinds.len());
        let mut states = vec![empty.clone()];
        // The upgrade ran while an old client held the key with the
        // counter's latest value.
        if let Some(old) = self.kinds.iter().position(|k| *k == Kind::Old)
            && self.held_from_before
        {
            let mut held = empty;
            held.counter = 1;
            held.top_fence = 1;
            held.row = Some(LeaseRow { token: Token::Holder(old as u8), fence: 1, live: true });
            held.grants[old] = 1;
            states.push(held);
        }
        states
    }

    fn actions(&self, s: &FenceState, actions: &mut Vec<FenceAction>) {
        use FenceAction as A;
        for (i, kind) in self.kinds.iter().enumerate() {
            let c = i as u8;
            let more = s.grants[i] < self.grants && s.idle(c);
            let row_live = s.row.is_some_and(|r| r.live);
            let lease_live = s.live_holder() == Some(c) || s.shares[i].is_some_and(|sh| sh.live);
            match kind {
                Kind::New => {
                    if more && s.row.is_some() && !row_live {
                        actions.push(A::FastGrant(c));
                    }
                    if more && s.row.is_none() {
                        actions.push(A::SlowGrant(c));
                    }
                    if more && s.live_holder().is_none() {
                        actions.push(A::ShareGrant(c));
                    }
                    if s.holds_row(c) {
                        actions.push(A::Release(c));
                    }
                    if s.shares[i].is_some_and(|sh| sh.live) {
                        actions.push(A::ShareAgain(c));
                    }
                    if s.shares[i].is_some() {
                        actions.push(A::ShareRelease(c));
                    }
                    if lease_live && s.raises < self.raises {
                        actions.push(A::RaiseFence(c));
                    }
                }
                Kind::Old => {
                    // Renamed: the old grant, sweep and forced release fail
                    // and change nothing, so they are not offered.
                    if more && !row_live && !self.renamed() {
                        actions.push(A::OldGrant(c));
                    }
                    if s.holds_row(c) {
                        actions.push(A::OldRelease(c));
                    }
                }
            }
            if lease_live {
                actions.push(A::Expire(c));
            }
        }
        if s.row.is_some_and(|r| !r.live) {
            actions.push(A::Sweep);
        }
        if s.row.is_some() || s.shares.iter().any(Option::is_some) {
            actions.push(A::ForceRelease);
            if self.has_old() && !self.renamed() {
                actions.push(A::OldForceRelease);
            }
        }
        if s.row.is_some_and(|r| !r.live) && self.has_old() && !self.renamed() {
            actions.push(A::OldSweep);
        }
    }

    fn next_state(&self, s: &FenceState, action: FenceAction) -> Option<FenceState> {
        let mut next = s.clone();
        match action {
            FenceAction::FastGrant(c) => Self::fast_grant(&mut next, c)?,
            FenceAction::SlowGrant(c) => Self::slow_grant(&mut next, c)?,
            FenceAction::Release(c) => self.release(&mut next, c)?,
            FenceAction::Expire(c) => Self::expire(&mut next, c)?,
            FenceAction::Sweep => self.sweep(&mut next)?,
            FenceAction::ForceRelease => {
                Self::force_release(&mut next, self.variant != FenceVariant::ForceWithoutRaise)?
            }
            FenceAction::ShareGrant(c) => self.share_grant(&mut next, c)?,
            FenceAction::ShareAgain(c) => self.share_again(&mut next, c)?,
            FenceAction::ShareRelease(c) => Self::share_release(&mut next, c)?,
            FenceAction::RaiseFence(c) => self.raise_fence(&mut next, c)?,
            FenceAction::OldGrant(c) => Self::old_grant(&mut next, c)?,
            FenceAction::OldRelease(c) => Self::old_release(&mut next, c)?,
            FenceAction::OldSweep => Self::old_sweep(&mut next)?,
            FenceAction::OldForceRelease => Self::force_release(&mut next, false)?,
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let all = vec![
            Property::always(MUTUAL_EXCLUSION, |_, s: &FenceState| !s.granted_over_live && !s.conflict()),
            Property::always(FENCES_INCREASE, |_, s: &FenceState| !s.fence_went_back),
            Property::sometimes(GRANT_AFTER_SWEEP, |_, s: &FenceState| s.granted_after_sweep),
            Property::sometimes(GRANT_OVER_MARKER, |_, s: &FenceState| s.granted_over_marker),
            Property::sometimes(SHARE_OVER_RAISED_ROW, |_, s: &FenceState| s.share_over_raised_row),
        ];
        all.into_iter().filter(|p| self.checked.is_empty() || self.checked.contains(&p.name)).collect()
    }
}
