//! Model 4: downgrading a write lock to a read lock (`WriteGuard::downgrade`,
//! `Backend::shrink`), and why it is one store step.
//!
//! One store decides atomically by the lease model's admission rule for a
//! read-write lock: a writer is granted only when no lease is held (writers
//! may pass waiting readers, as a mutex's waiters do); a reader only when no
//! writer holds and no writer's reservation is older than its own (writer
//! preference). A refused request leaves a reservation that keeps its place.
//!
//! Three clients: the downgrader `H` starts holding the write lease, a writer
//! `W` and a reader `R` each make one acquisition at any moment the checker
//! picks, retry while they wait, and release once they hold. `H` downgrades,
//! as the [`DowngradeVariant`] says, then releases its read lease.
//!
//! There is no network and no clock here: the hazard is the interleaving of
//! store steps alone (a lost reply or an expiry only adds runs), so the space
//! is small enough to explore completely in milliseconds.

mod state;

pub use state::{Client, DowngradeState, Lease, Phase};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DowngradeVariant {
    /// Rejected: release the write lease, then acquire a read lease (two
    /// store steps, as a client without `shrink` would do it).
    ReleaseThenAcquire,
    /// Shipped: the held write lease becomes a read lease in one store step
    /// (`Backend::shrink`), keeping its place.
    InPlace,
}

/// Name of the read-write exclusion property.
pub const EXCLUSION: &str = "a writer holds alone";
/// Name of the downgrade's promise.
pub const NO_WRITER_BETWEEN: &str = "no writer is granted between the downgrader's write and read leases";
/// Name of a reachability check: a waiting reader is admitted while the
/// downgraded read lease is held (so "no counterexample" is not vacuous, and
/// readers do get in after a downgrade).
pub const READER_SHARES_AFTER_DOWNGRADE: &str = "a reader shares the key with the downgraded read lease";

/// The model.
#[derive(Clone, Debug)]
pub struct DowngradeModel {
    /// Which design.
    pub variant: DowngradeVariant,
}

impl DowngradeModel {
    /// The model of `variant`.
    pub fn new(variant: DowngradeVariant) -> Self {
        DowngradeModel { variant }
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DowngradeAction {
    /// `H` downgrades: in place, or (rejected) releases its write lease.
    Downgrade,
    /// `H` (rejected variant) asks for its read lease after releasing.
    AcquireRead,
    /// A client asks the store for its lease (first time, or again while waiting).
    Attempt(Client),
    /// A holder releases its lease.
    Release(Client),
}

impl fmt::Display for DowngradeAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Downgrade => write!(f, "H downgrades"),
            Self::AcquireRead => write!(f, "H asks for a read lease"),
            Self::Attempt(c) => write!(f, "{c} asks for its lease"),
            Self::Release(c) => write!(f, "{c} releases"),
        }
    }
}

impl Model for DowngradeModel {
    type State = DowngradeState;
    type Action = DowngradeAction;

    fn init_states(&self) -> Vec<DowngradeState> {
        vec![DowngradeState::initial()]
    }

    fn actions(&self, state: &DowngradeState, actions: &mut Vec<DowngradeAction>) {
        match state.phase(Client::H) {
            Phase::Holding(Lease::Write) => actions.push(DowngradeAction::Downgrade),
            Phase::Between | Phase::Waiting(_) => actions.push(DowngradeAction::AcquireRead),
            Phase::Holding(Lease::Read) => actions.push(DowngradeAction::Release(Client::H)),
            _ => {}
        }
        for c in [Client::W, Client::R] {
            match state.phase(c) {
                Phase::Idle | Phase::Waiting(_) => actions.push(DowngradeAction::Attempt(c)),
                Phase::Holding(_) => actions.push(DowngradeAction::Release(c)),
                _ => {}
            }
        }
    }

    fn next_state(&self, state: &DowngradeState, action: DowngradeAction) -> Option<DowngradeState> {
        let mut next = state.clone();
        match action {
            DowngradeAction::Downgrade => match self.variant {
                DowngradeVariant::InPlace => next.shrink(Client::H),
                DowngradeVariant::ReleaseThenAcquire => {
                    next.release(Client::H);
                    next.set_phase(Client::H, Phase::Between);
                }
            },
            DowngradeAction::AcquireRead => next.attempt(Client::H, Lease::Read),
            DowngradeAction::Attempt(c) => next.attempt(c, c.wants()),
            DowngradeAction::Release(c) => {
                next.release(c);
                next.set_phase(c, Phase::Done);
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(EXCLUSION, |_, s: &DowngradeState| s.writer_alone()),
            Property::always(NO_WRITER_BETWEEN, |_, s: &DowngradeState| !s.writer_between),
            Property::sometimes(READER_SHARES_AFTER_DOWNGRADE, |_, s: &DowngradeState| {
                s.phase(Client::H) == Phase::Holding(Lease::Read) && s.phase(Client::R) == Phase::Holding(Lease::Read)
            }),
        ]
    }
}
