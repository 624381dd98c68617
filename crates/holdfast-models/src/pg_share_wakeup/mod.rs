//! Model 21: whether a held share's release may stop notifying
//! unconditionally, leaving its one notification to the gate function's,
//! sent only if the gate row is marked `wanted` when read under its lock
//! (`release_sql.rs`, `share_fns.rs`'s `<table>_gate`).
//!
//! One key, one or two share holders that release, and one or two waiters.
//! The key's lease row is the **gate** of its shares: up while a share it
//! covers is held, down (at the epoch) otherwise, with a `wanted` mark. A
//! `pg_notify` queued in a transaction reaches every client's listener at
//! its commit; a notification heard while its waiter is not asleep is kept
//! for its next sleep. Row locks are held to their transaction's commit,
//! and a step that needs the gate's lock while another transaction holds
//! it waits (is not enabled); a snapshot shows the gate's committed
//! version. Each holder releases by the variant and the form:
//!
//! - `Fused` (one statement, one commit): the delete (its row's lock held,
//!   the share still held for every other transaction), then the gate
//!   function: the gate's lock, the shares read in a fresh snapshot under
//!   it (its own delete seen), the gate written up or down (`WHERE token =
//!   GATE`: not if a waiter took the key), `wanted` read from that write;
//!   the commit.
//! - `TwoStep` (a namespace without the functions): the delete statement
//!   commits; a second transaction runs the gate part.
//!
//! The waiters: W, a reserving writer (`<table>_share`, `reserve = true`),
//! locks the gate, reads the shares in a snapshot under the lock (an
//! uncommitted delete still counts), and either takes the key (no share
//! held; the row written with `wanted = others_wait`, false: X has no
//! reservation; with `writer_keeps_mark`, the mark it finds kept) or reserves its place and marks the row if unmarked; it
//! commits, and sleeps if refused. X, a mutex acquire (`acquire_sql.rs`),
//! takes its snapshot; a gate it shows down is taken by an update
//! re-checked on the latest version (run again at once if it went up); one
//! it shows up and unmarked is marked by `w` (the gate's lock, re-checked
//! `up AND NOT wanted`); "registered" iff `w` marked it or the snapshot
//! showed it marked; registered, it sleeps, else runs again at once. A
//! woken waiter attempts again. With `waiters_release`, a waiter that took
//! the key releases it (the gate's lock, the row released, a notification
//! iff marked); with `stops`, a `TwoStep` holder's client may end between
//! its two calls. Expiry is not modelled: a waiter only its timer would
//! wake is the defect looked for.
//!
//! - `Always` (shipped until now): the release statement also notifies for
//!   every deleted share row, besides the gate function's.
//! - `GateOnly` (proposed): a held share's only notification is the gate
//!   function's.
//! - `SnapshotWanted` (rejected): the release statement notifies iff its
//!   own snapshot, taken at its start, shows the gate marked; the gate part
//!   does not notify.
//! - `Never` (rejected, sanity): a held share's release never notifies.

mod state;

pub use state::{Gate, Holder, Kind, Share, ShareWakeupState, Slot, Txn, Waiter};

use std::fmt;

use stateright::{Model, Property};

/// Which notifications a held share's release sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotifyVariant {
    /// Shipped until now: unconditionally, and the gate function's.
    Always,
    /// Proposed: the gate function's only (`wanted` read under its lock).
    GateOnly,
    /// Rejected: iff the statement's own snapshot shows the gate marked.
    SnapshotWanted,
    /// Rejected: none.
    Never,
}

/// How the release and the gate's shrink are committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseForm {
    /// One statement calling the gate function: one commit.
    Fused,
    /// The delete committed first; the gate function in a second transaction.
    TwoStep,
}

/// Which waiters there are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Waiters {
    /// The reserving writer W only.
    Writer,
    /// The mutex acquire X only.
    Exclusive,
    /// Both, W first.
    Both,
}

impl Waiters {
    /// The kinds, in the state's order.
    pub fn kinds(self) -> &'static [Kind] {
        match self {
            Self::Writer => &[Kind::Writer],
            Self::Exclusive => &[Kind::Exclusive],
            Self::Both => &[Kind::Writer, Kind::Exclusive],
        }
    }
}

/// Safety: no waiter asleep with nothing heard once what it waits on is gone.
pub const NO_LOST_WAKEUP: &str =
    "no waiter asleep with no notification heard once every release committed and no waiter holds the key";
/// Safety (sanity): never a waiter holding the key beside a held share.
pub const EXCLUSION: &str = "never a waiter holding the key while a share is held";
/// Reachability: a held share's release ends having sent no notification.
pub const SILENT_RELEASE: &str = "a held share's release commits having sent no notification";
/// Reachability: a sleeping waiter hears a notification.
pub const WOKEN: &str = "a sleeping waiter hears a notification";
/// Reachability: X's mark is refused by its re-check: the gate went down.
pub const RECHECK_FAILS: &str = "the mutex acquire's mark re-check finds the gate shrunk since its snapshot";
/// Reachability: W takes the key.
pub const WRITER_GRANTED: &str = "the writer takes the key";
/// Reachability: X takes the key.
pub const EXCLUSIVE_GRANTED: &str = "the mutex acquire takes the key";
/// Reachability: W refused only by uncommitted deletes (`Fused`).
pub const REFUSED_BY_UNCOMMITTED_DELETE: &str = "the writer is refused only by shares whose delete is uncommitted";
/// Reachability: W takes the key from a gate still up (`TwoStep`).
pub const TAKEN_FROM_UP_GATE: &str = "the writer takes the key from a gate still up after the last delete committed";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct ShareWakeupModel {
    /// Which notifications a release sends.
    pub variant: NotifyVariant,
    /// One commit or two.
    pub form: ReleaseForm,
    /// Share holders (1 or 2).
    pub holders: u8,
    /// The waiters.
    pub waiters: Waiters,
    /// A waiter that took the key releases it.
    pub waiters_release: bool,
    /// `TwoStep`: a holder's client may end after its delete committed,
    /// before the gate function's call.
    pub stops: bool,
    /// W's grant keeps a mark it finds (`wanted = others_wait OR wanted`,
    /// `shares.rs`'s `grant_writer`, the two-call form since finding (b)):
    /// a mutex acquire's mark outlives the writer's grant.
    pub writer_keeps_mark: bool,
}

impl ShareWakeupModel {
    /// Two holders and both waiters, which hold the key once granted.
    pub fn new(variant: NotifyVariant, form: ReleaseForm) -> Self {
        ShareWakeupModel {
            variant,
            form,
            holders: 2,
            waiters: Waiters::Both,
            waiters_release: false,
            stops: false,
            writer_keeps_mark: false,
        }
    }

    fn fused(&self) -> bool {
        self.form == ReleaseForm::Fused
    }

    /// Whether a share other than holder `i`'s is held, as a fresh
    /// snapshot shows it (`i` none: every share).
    fn others_present(&self, s: &ShareWakeupState, i: Option<usize>) -> bool {
        (0..s.shares.len()).any(|j| Some(j) != i && s.share_present(j, self.fused()))
    }

    /// The release statement's own notification (before the gate part),
    /// given the gate's committed version as its snapshot shows it.
    fn statement_notifies(&self, snapshot: Gate) -> bool {
        match self.variant {
            NotifyVariant::Always => true,
            NotifyVariant::SnapshotWanted => snapshot.wanted,
            NotifyVariant::GateOnly | NotifyVariant::Never => false,
        }
    }

    /// Holder `i`'s next release step; `None` if it waits or is done.
    fn release_step(&self, s: &mut ShareWakeupState, i: usize) -> Option<()> {
        s.shares[i] = match s.shares[i] {
            Share::Held if self.fused() => Share::Deleted { queued: self.statement_notifies(s.gate) },
            Share::Held => {
                let sent = self.statement_notifies(s.gate);
                if sent {
                    s.deliver();
                }
                Share::DeleteCommitted { sent }
            }
            Share::Deleted { queued: before } | Share::DeleteCommitted { sent: before } => {
                if s.lock.is_some() {
                    return None;
                }
                s.lock = Some(Txn::Release(i as u8));
                let up = self.others_present(s, Some(i));
                let latest = s.latest();
                let is_gate = matches!(latest.holder, Holder::Up | Holder::Down);
                if is_gate {
                    s.pending = Some(Gate { holder: if up { Holder::Up } else { Holder::Down }, ..latest });
                }
                let gate_notifies = matches!(self.variant, NotifyVariant::Always | NotifyVariant::GateOnly);
                let queued = gate_notifies && is_gate && latest.wanted;
                match s.shares[i] {
                    Share::Deleted { .. } => Share::Gated { queued: queued || before, sent: false },
                    _ => Share::Gated { queued, sent: before },
                }
            }
            Share::Gated { queued, sent } => {
                s.gate = s.latest();
                s.pending = None;
                s.lock = None;
                if queued {
                    s.deliver();
                }
                Share::Done { sent: sent || queued }
            }
            Share::Done { .. } | Share::Stopped { .. } => return None,
        };
        Some(())
    }

    /// W's attempt under the gate's lock: the key taken, or its place
    /// reserved and the gate marked.
    fn writer_attempt(&self, s: &mut ShareWakeupState, w: usize) -> Option<()> {
        if s.lock.is_some() || !matches!(s.waiters[w].at, Waiter::Ready | Waiter::Again) {
            return None;
        }
        let latest = s.latest();
        let others_held = self.others_present(s, None) || latest.holder == Holder::Waiter(Kind::Exclusive);
        s.pending = Some(if others_held {
            Gate { wanted: true, ..latest }
        } else {
            Gate { holder: Holder::Waiter(Kind::Writer), wanted: self.writer_keeps_mark && latest.wanted }
        });
        s.lock = Some(Txn::Writer);
        let behind_deletes =
            others_held && latest.holder != Holder::Waiter(Kind::Exclusive) && !s.shares.contains(&Share::Held);
        s.waiters[w].at = Waiter::Locked { granted: !others_held, behind_deletes };
        Some(())
    }

    /// X's statement writes (the take, or the mark) and commits; `None` if
    /// it waits for the gate's lock.
    fn exclusive_write(&self, s: &mut ShareWakeupState, w: usize) -> Option<()> {
        let Waiter::Snapped(seen) = s.waiters[w].at else { return None };
        if seen.holder.live() && seen.wanted {
            // `w` matches nothing in the snapshot: registered, no lock taken.
            s.waiters[w].at = Waiter::Asleep;
            return Some(());
        }
        if s.lock.is_some() {
            return None;
        }
        let latest = s.gate;
        s.waiters[w].at = if !seen.holder.live() {
            if latest.holder.live() {
                Waiter::Ready
            } else {
                s.gate = Gate { holder: Holder::Waiter(Kind::Exclusive), wanted: false };
                s.waiters[w].heard = false;
                Waiter::Holding
            }
        } else if latest.holder.live() && !latest.wanted {
            s.gate.wanted = true;
            Waiter::Asleep
        } else if latest.holder == Holder::Down {
            Waiter::Again
        } else {
            Waiter::Ready
        };
        Some(())
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShareWakeupAction {
    /// Share holder `i`'s release takes its next step.
    Release(u8),
    /// W's function locks the gate, reads the shares and writes.
    WriterAttempt,
    /// W's function commits.
    WriterCommit,
    /// X's acquire statement takes its snapshot.
    Snapshot,
    /// X's statement writes, commits and answers.
    Write,
    /// A sleeping waiter's listener wakes it.
    Wake(Kind),
    /// A waiter holding the key releases it.
    Leave(Kind),
    /// Share holder `i`'s client ends between its release's two calls.
    Stop(u8),
}

impl fmt::Display for ShareWakeupAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Release(i) => write!(f, "H{}'s release takes its next step", i + 1),
            Self::WriterAttempt => write!(f, "W locks the gate, reads the shares, takes the key or reserves"),
            Self::WriterCommit => write!(f, "W commits"),
            Self::Snapshot => write!(f, "X's acquire statement takes its snapshot"),
            Self::Write => write!(f, "X's statement takes or marks the gate (or neither), commits"),
            Self::Wake(k) => write!(f, "{k}'s listener wakes it"),
            Self::Leave(k) => write!(f, "{k} releases the key"),
            Self::Stop(i) => write!(f, "H{}'s client ends before its gate call", i + 1),
        }
    }
}

impl Model for ShareWakeupModel {
    type State = ShareWakeupState;
    type Action = ShareWakeupAction;

    fn init_states(&self) -> Vec<ShareWakeupState> {
        let slot = |&kind| Slot { kind, at: Waiter::Ready, heard: false };
        vec![ShareWakeupState {
            gate: Gate { holder: Holder::Up, wanted: false },
            pending: None,
            lock: None,
            shares: vec![Share::Held; usize::from(self.holders)],
            waiters: self.waiters.kinds().iter().map(slot).collect(),
        }]
    }

    fn actions(&self, s: &ShareWakeupState, actions: &mut Vec<ShareWakeupAction>) {
        let free = s.lock.is_none();
        for (i, share) in s.shares.iter().enumerate() {
            let waits = matches!(share, Share::Deleted { .. } | Share::DeleteCommitted { .. }) && !free;
            if !matches!(share, Share::Done { .. } | Share::Stopped { .. }) && !waits {
                actions.push(ShareWakeupAction::Release(i as u8));
            }
            if self.stops && matches!(share, Share::DeleteCommitted { .. }) {
                actions.push(ShareWakeupAction::Stop(i as u8));
            }
        }
        for w in &s.waiters {
            match (w.kind, w.at) {
                (Kind::Writer, Waiter::Ready | Waiter::Again) if free => actions.push(ShareWakeupAction::WriterAttempt),
                (Kind::Writer, Waiter::Locked { .. }) => actions.push(ShareWakeupAction::WriterCommit),
                (Kind::Exclusive, Waiter::Ready | Waiter::Again) => actions.push(ShareWakeupAction::Snapshot),
                (Kind::Exclusive, Waiter::Snapped(seen)) if free || seen.holder.live() && seen.wanted => {
                    actions.push(ShareWakeupAction::Write)
                }
                (k, Waiter::Asleep) if w.heard => actions.push(ShareWakeupAction::Wake(k)),
                (k, Waiter::Holding) if self.waiters_release && free => actions.push(ShareWakeupAction::Leave(k)),
                _ => {}
            }
        }
    }

    fn next_state(&self, s: &ShareWakeupState, action: ShareWakeupAction) -> Option<ShareWakeupState> {
        let mut n = s.clone();
        let slot = |kind| s.waiters.iter().position(|w| w.kind == kind);
        match action {
            ShareWakeupAction::Release(i) => self.release_step(&mut n, usize::from(i))?,
            ShareWakeupAction::Stop(i) => {
                let Share::DeleteCommitted { sent } = s.shares[usize::from(i)] else { return None };
                n.shares[usize::from(i)] = Share::Stopped { sent };
            }
            ShareWakeupAction::WriterAttempt => self.writer_attempt(&mut n, slot(Kind::Writer)?)?,
            ShareWakeupAction::WriterCommit => {
                let w = slot(Kind::Writer)?;
                let Waiter::Locked { granted, .. } = s.waiters[w].at else { return None };
                n.gate = n.latest();
                n.pending = None;
                n.lock = None;
                n.waiters[w].at = if granted { Waiter::Holding } else { Waiter::Asleep };
                n.waiters[w].heard &= !granted;
            }
            ShareWakeupAction::Snapshot => {
                let w = slot(Kind::Exclusive)?;
                n.waiters[w].at = Waiter::Snapped(s.gate);
            }
            ShareWakeupAction::Write => self.exclusive_write(&mut n, slot(Kind::Exclusive)?)?,
            ShareWakeupAction::Wake(kind) => {
                let w = slot(kind)?;
                n.waiters[w] = Slot { kind, at: Waiter::Ready, heard: false };
            }
            ShareWakeupAction::Leave(kind) => {
                let w = slot(kind)?;
                if s.lock.is_some() || s.waiters[w].at != Waiter::Holding {
                    return None;
                }
                n.gate.holder = Holder::Released;
                n.waiters[w].at = Waiter::Done;
                if n.gate.wanted {
                    n.deliver();
                }
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_LOST_WAKEUP, |_, s: &ShareWakeupState| s.lost_wakeup().is_none()),
            Property::always(EXCLUSION, |m: &Self, s: &ShareWakeupState| {
                !(s.waiter_holds() && m.others_present(s, None))
            }),
            Property::sometimes(SILENT_RELEASE, |_, s: &ShareWakeupState| {
                s.shares.contains(&Share::Done { sent: false })
            }),
            Property::sometimes(WOKEN, |_, s: &ShareWakeupState| {
                s.waiters.iter().any(|w| w.at == Waiter::Asleep && w.heard)
            }),
            Property::sometimes(RECHECK_FAILS, |_, s: &ShareWakeupState| {
                s.waiters.iter().any(|w| w.at == Waiter::Again)
            }),
            Property::sometimes(WRITER_GRANTED, |_, s: &ShareWakeupState| {
                s.gate.holder == Holder::Waiter(Kind::Writer)
            }),
            Property::sometimes(EXCLUSIVE_GRANTED, |_, s: &ShareWakeupState| {
                s.gate.holder == Holder::Waiter(Kind::Exclusive)
            }),
            Property::sometimes(REFUSED_BY_UNCOMMITTED_DELETE, |_, s: &ShareWakeupState| {
                s.waiters.iter().any(|w| w.at == Waiter::Locked { granted: false, behind_deletes: true })
            }),
            Property::sometimes(TAKEN_FROM_UP_GATE, |_, s: &ShareWakeupState| {
                s.waiters.iter().any(|w| matches!(w.at, Waiter::Locked { granted: true, .. }))
                    && s.gate.holder == Holder::Up
            }),
        ]
    }
}
