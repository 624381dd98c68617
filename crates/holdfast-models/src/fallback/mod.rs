//! Model 2: a fallback chain of stores that must never grant twice when
//! clients disagree about which store is down.
//!
//! Stores are tried in chain order (say Redis, then the database); the last one
//! is also the *arbiter*. In the shipped construction the arbiter keeps a mode
//! record (epoch, active store, ready time). A client grants from a store only
//! while it holds a lease on a *ready* record naming that store, read before it
//! sent the acquire and valid for `mode_lease - drift` ticks by its own clock;
//! its belief never outlives that lease. A client that finds the active store
//! unreachable compare-and-sets the record to the next epoch and store, and the
//! arbiter keeps the new epoch unready for `mode_lease + drift` ticks by its own
//! clock, so every lease on the old epoch has run out before anyone (the
//! switcher or any other reader) can grant under the new one. A grant's fence is
//! `(epoch, store counter)`, compared lexicographically.
//!
//! Partitions: the network is [`crate::network::Network`], where any message may
//! be delayed or lost at any step. Every pattern of client-store partitions that
//! appear and heal (a reachability bit per pair, flipped by the checker) is one
//! of those delivery schedules, so it is covered without modelling the bits,
//! along with asymmetric partitions and replies lost after a request applied.
//! A client's "this store is down" is a timeout, which the checker may fire at
//! any moment: clients may disagree about which store is down in every way.
//!
//! Tenants: the arbiter may serve other chains and plain locks. holdfast keeps
//! the mode in a record of the mode key that only this chain's switches write
//! (under the key's writer lease, owner-checked), so other tenants change
//! nothing the model holds and `Shipped` leaves them out. `SharedCounter`
//! models the old layout, where the mode was read from a fence counter every
//! key of a SQL arbiter shares, and another tenant could move it.
//!
//! A read here is the mode lease and the record's value at one instant. In
//! holdfast the record is read just after the shared lease is granted, and
//! used only if the read's reply arrives within the lease: no switch can
//! write while the lease is held (the switch's writer lease waits for every
//! mode lease to expire), so the value read is the one at the grant.

mod state;
mod steps;
mod symmetry;

pub use state::{
    ARBITER, CLIENTS, Client, FallbackState, Fence, Holding, Message, ModeLease, ModeRecord, Pending, STORES, Store,
    client_name,
};

use std::fmt;

use stateright::{CheckerBuilder, Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FallbackVariant {
    /// Try store 1; when it times out, take the lock on store 2, and so on.
    NaiveChain,
    /// Epoch record and mode leases, but a new epoch is usable at once (no wait
    /// for the old epoch's leases to run out).
    EpochWithoutWait,
    /// The shipped construction: the new epoch is ready only after
    /// `mode_lease + drift` ticks of the arbiter's clock.
    Shipped,
    /// The shipped protocol over the old layout, where the mode was read
    /// from the record key's fence, which on the SQL stores is one counter
    /// shared by every key of the arbiter: another tenant (another chain's
    /// switch, a fence floor raised on another key) moves this chain's mode
    /// once, with no wait for this chain's mode leases (it waited, if at
    /// all, for its own).
    SharedCounter,
}

/// Name of the mutual-exclusion property.
pub const MUTUAL_EXCLUSION: &str = "no two clients believe they hold at once";
/// Name of the fence-order property.
pub const FENCES_INCREASE: &str = "each grant's fence is above every earlier grant's";

/// Name of a reachability check: a grant under a later epoch (another store)
/// follows a grant under epoch 0, so the exploration does cover switches.
pub const GRANT_AFTER_SWITCH_REACHED: &str = "a grant under a later epoch follows one under epoch 0";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct FallbackModel {
    /// Which design.
    pub variant: FallbackVariant,
    /// Lock lease time-to-live at a store, in ticks.
    pub ttl: u8,
    /// Length of a lease on the mode record, in ticks.
    pub mode_lease: u8,
    /// Bound on clock drift, in ticks.
    pub drift: u8,
    /// Requests each client may send (bounds the state space).
    pub requests_per_client: u8,
    /// Highest epoch a switch may create.
    pub max_epoch: u8,
}

impl FallbackModel {
    /// The checked configuration: lock TTL and mode lease 3 ticks, drift 1,
    /// 4 requests per client (enough to read, switch, read and acquire), up to
    /// two switches (S1 to S2 and back to S1, whose own counter is then behind
    /// the epoch's order).
    pub fn new(variant: FallbackVariant) -> Self {
        Self { variant, ttl: 3, mode_lease: 3, drift: 1, requests_per_client: 4, max_epoch: 2 }
    }

    /// Ticks of the arbiter's clock a new epoch stays unready.
    pub fn switch_wait(&self) -> u8 {
        match self.variant {
            FallbackVariant::Shipped | FallbackVariant::SharedCounter => self.mode_lease + self.drift,
            FallbackVariant::NaiveChain | FallbackVariant::EpochWithoutWait => 0,
        }
    }

    /// The checker, exploring one state per symmetry class (clients renamed).
    pub fn symmetric_checker(self) -> CheckerBuilder<Self> {
        self.checker().symmetry_fn(symmetry::representative)
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FallbackAction {
    /// One tick of real time.
    Tick,
    /// One store's clock runs a tick ahead of the clients' (drift).
    StoreClockRunsAhead(u8),
    /// A client sends an acquire (naive: to its next store; else: to the
    /// store its mode lease names).
    SendAcquire(u8),
    /// A client reads the mode record.
    SendRead(u8),
    /// A client asks the arbiter to switch to the next store.
    SendSwitch(u8),
    /// Another tenant of the arbiter moves the shared counter the old
    /// layout read the mode from (`SharedCounter` only).
    TenantMovesCounter,
    /// A client's request times out (it stops waiting; naive: it moves on to
    /// the next store in the chain).
    TimeOut(u8),
    /// The network delivers a message.
    Deliver(Message),
}

impl fmt::Display for FallbackAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Tick => write!(f, "tick"),
            Self::StoreClockRunsAhead(store) => {
                write!(f, "S{}'s clock runs a tick ahead", store + 1)
            }
            Self::SendAcquire(client) => write!(f, "{} sends acquire", client_name(client)),
            Self::SendRead(client) => write!(f, "{} reads the mode record", client_name(client)),
            Self::SendSwitch(client) => write!(f, "{} asks for a switch", client_name(client)),
            Self::TenantMovesCounter => write!(f, "another tenant moves the arbiter's shared counter"),
            Self::TimeOut(client) => write!(f, "{}'s request times out", client_name(client)),
            Self::Deliver(message) => write!(f, "deliver: {message}"),
        }
    }
}

impl Model for FallbackModel {
    type State = FallbackState;
    type Action = FallbackAction;

    fn init_states(&self) -> Vec<FallbackState> {
        vec![FallbackState::initial()]
    }

    fn actions(&self, state: &FallbackState, actions: &mut Vec<FallbackAction>) {
        steps::actions(self, state, actions);
    }

    fn next_state(&self, state: &FallbackState, action: FallbackAction) -> Option<FallbackState> {
        steps::next_state(self, state, action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(MUTUAL_EXCLUSION, |_, state: &FallbackState| state.believed_holders() <= 1),
            Property::always(FENCES_INCREASE, |_, state: &FallbackState| !state.grants.fence_regressed()),
            Property::sometimes(GRANT_AFTER_SWITCH_REACHED, |_, state: &FallbackState| {
                let first_epoch = state.grants.first_fence().map(|(epoch, _)| epoch);
                let last_epoch = state.grants.highest_fence().map(|(epoch, _)| epoch);
                first_epoch == Some(0) && last_epoch.is_some_and(|epoch| epoch > 0)
            }),
        ]
    }
}
