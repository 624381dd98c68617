//! Model 15: how a PostgreSQL shared acquire sees the permits held, under
//! `READ COMMITTED` (the shared acquire as one call of the server-side
//! function `<table>_share`, `stores/postgres/share_fns.rs`), against the
//! orders weighed.
//!
//! A semaphore keeps each held permit as a row of `<table>_shares`; the
//! key's lease row is the **gate**. A shared acquire is one transaction
//! whose steps are atomic here: it takes the gate row's lock (`SELECT ...
//! FOR UPDATE`, held to its commit; it waits while another transaction
//! holds it), reads the key's shares in a snapshot, decides (admitted if
//! the permits held, plus its own one, are within the limit), inserts its
//! share row if admitted, and commits. A snapshot shows the share rows
//! committed when it was taken: another transaction's uncommitted insert
//! is invisible, and what commits later too. A statement takes its
//! snapshot when it starts; a row lock it had to wait for is re-checked
//! on the row's latest version (PostgreSQL's `EvalPlanQual`), but that
//! re-reads only the locked row: the other tables the statement reads stay
//! in its snapshot. A release deletes the client's row in a statement of
//! its own (no gate lock, committed at once); a separate call then
//! shrinks the gate, taking its lock (one step here: it writes only the
//! gate row's expiry, which no share's admission reads). Each permit
//! weighs 1; a refused client tries again from its first step.
//!
//! - `Shipped`: the gate's lock, then the shares read by a new statement
//!   (each statement of a `VOLATILE` function takes its own snapshot, as
//!   each statement of a `READ COMMITTED` transaction does: the namespaces
//!   without the functions run the same two statements), so the snapshot
//!   is taken under the lock.
//! - `OneStatement` (rejected): the whole acquire one SQL statement
//!   (CTEs): its snapshot is taken at its start, before the gate's lock.
//! - `ReadBeforeLock` (rejected): the shares read (a fresh snapshot)
//!   before the gate's lock.
//! - `NoGateLock` (rejected): no gate lock at all.

mod state;

pub use state::{AcquireStep, Client, Phase, Row, ShareGateState};

use std::fmt;

use stateright::{Model, Property};

use crate::sql_session::client_name;

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShareGateVariant {
    /// Shipped: the gate's lock, then the shares read in a fresh snapshot.
    Shipped,
    /// Rejected: one statement, its snapshot taken before the gate's lock.
    OneStatement,
    /// Rejected: the shares read before the gate's lock.
    ReadBeforeLock,
    /// Rejected: no gate lock.
    NoGateLock,
}

impl ShareGateVariant {
    /// The steps of one acquire, in order.
    pub fn steps(self) -> &'static [AcquireStep] {
        use AcquireStep::*;
        match self {
            Self::Shipped => &[LockGate, ReadFresh, Insert, Commit],
            Self::OneStatement => &[Snapshot, LockGate, ReadInSnapshot, Insert, Commit],
            Self::ReadBeforeLock => &[ReadFresh, LockGate, Insert, Commit],
            Self::NoGateLock => &[ReadFresh, Insert, Commit],
        }
    }
}

/// Name of the safety property.
pub const WITHIN_LIMIT: &str = "at most limit permits held";
/// Reachability: two clients were each granted a permit.
pub const TWO_GRANTED: &str = "two clients are each granted a permit";
/// Reachability: an acquire waits for the gate's lock.
pub const WAITS_ON_GATE: &str = "an acquire waits for the gate row's lock";
/// Reachability: an acquire is refused (it read the semaphore full).
pub const REFUSED: &str = "an acquire is refused";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct ShareGateModel {
    /// Which design.
    pub variant: ShareGateVariant,
    /// Clients.
    pub clients: u8,
    /// The semaphore's limit (permits of weight 1).
    pub limit: u8,
    /// Acquisitions granted per client (each released before the next).
    pub acquisitions: u8,
}

impl ShareGateModel {
    /// Two clients, a semaphore of 1, two acquisitions each.
    pub fn new(variant: ShareGateVariant) -> Self {
        ShareGateModel { variant, clients: 2, limit: 1, acquisitions: 2 }
    }

    /// A client's next acquire step, if it is acquiring.
    pub fn next_step(client: &Client) -> Option<AcquireStep> {
        let Phase::Acquiring { next } = client.phase else { return None };
        Some(next)
    }

    /// The phase of a client that wants a permit and has taken no step.
    fn wanting(&self) -> Phase {
        Phase::Acquiring { next: self.variant.steps()[0] }
    }

    /// Runs `step`, client `c`'s next, on `s`; `None` if it must wait.
    fn step(&self, s: &mut ShareGateState, c: u8, step: AcquireStep) -> Option<()> {
        let committed = s.committed();
        let client = &mut s.clients[usize::from(c)];
        match step {
            AcquireStep::Snapshot => client.snapshot = Some(committed),
            AcquireStep::LockGate => {
                if s.gate.is_some() {
                    return None;
                }
                s.gate = Some(c);
            }
            AcquireStep::ReadFresh => client.seen = Some(committed.count_ones() as u8),
            AcquireStep::ReadInSnapshot => client.seen = client.snapshot.take().map(|bits| bits.count_ones() as u8),
            AcquireStep::Insert => {
                if client.seen.take().is_some_and(|held| held < self.limit) {
                    client.row = Row::Inserted;
                }
            }
            AcquireStep::Commit => {
                if s.gate == Some(c) {
                    s.gate = None;
                }
                let client = &mut s.clients[usize::from(c)];
                if client.row == Row::Inserted {
                    client.row = Row::Committed;
                    client.left -= 1;
                    client.phase = Phase::Holding;
                } else {
                    client.phase = self.wanting();
                }
                return Some(());
            }
        }
        let steps = self.variant.steps();
        let at = steps.iter().position(|x| *x == step)?;
        s.clients[usize::from(c)].phase = Phase::Acquiring { next: *steps.get(at + 1)? };
        Some(())
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShareGateAction {
    /// Client `c`'s acquire takes its next step.
    Acquire(u8, AcquireStep),
    /// Client `c` releases: its share row deleted, committed at once.
    Release(u8),
    /// Client `c` shrinks the gate (under the gate's lock, at once).
    Shrink(u8),
}

impl fmt::Display for ShareGateAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Acquire(c, step) => write!(f, "{} {step}", client_name(*c)),
            Self::Release(c) => write!(f, "{} releases (deletes its share row)", client_name(*c)),
            Self::Shrink(c) => write!(f, "{} shrinks the gate", client_name(*c)),
        }
    }
}

impl Model for ShareGateModel {
    type State = ShareGateState;
    type Action = ShareGateAction;

    fn init_states(&self) -> Vec<ShareGateState> {
        let client =
            Client { phase: self.wanting(), snapshot: None, seen: None, row: Row::Absent, left: self.acquisitions };
        vec![ShareGateState { gate: None, clients: vec![client; usize::from(self.clients)] }]
    }

    fn actions(&self, s: &ShareGateState, actions: &mut Vec<ShareGateAction>) {
        for (i, client) in s.clients.iter().enumerate() {
            let c = i as u8;
            match client.phase {
                Phase::Acquiring { next } => {
                    if next != AcquireStep::LockGate || s.gate.is_none() {
                        actions.push(ShareGateAction::Acquire(c, next));
                    }
                }
                Phase::Holding => actions.push(ShareGateAction::Release(c)),
                Phase::Released if s.gate.is_none() => actions.push(ShareGateAction::Shrink(c)),
                Phase::Released | Phase::Done => {}
            }
        }
    }

    fn next_state(&self, s: &ShareGateState, action: ShareGateAction) -> Option<ShareGateState> {
        let mut n = s.clone();
        match action {
            ShareGateAction::Acquire(c, step) if Self::next_step(&s.clients[usize::from(c)]) == Some(step) => {
                self.step(&mut n, c, step)?;
            }
            ShareGateAction::Acquire(..) => return None,
            ShareGateAction::Release(c) => {
                let client = &mut n.clients[usize::from(c)];
                client.row = Row::Absent;
                client.phase = Phase::Released;
            }
            ShareGateAction::Shrink(c) => {
                let client = &mut n.clients[usize::from(c)];
                client.phase = if client.left > 0 { self.wanting() } else { Phase::Done };
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(WITHIN_LIMIT, |m: &Self, s: &ShareGateState| s.held() <= u32::from(m.limit)),
            Property::sometimes(TWO_GRANTED, |m: &Self, s: &ShareGateState| s.ever_granted(m.acquisitions) >= 2),
            Property::sometimes(WAITS_ON_GATE, |_, s: &ShareGateState| {
                s.clients.iter().enumerate().any(|(i, client)| {
                    Self::next_step(client) == Some(AcquireStep::LockGate)
                        && s.gate.is_some_and(|g| usize::from(g) != i)
                })
            }),
            Property::sometimes(REFUSED, |_, s: &ShareGateState| {
                s.clients.iter().any(|c| Self::next_step(c) == Some(AcquireStep::Commit) && c.row == Row::Absent)
            }),
        ]
    }
}
