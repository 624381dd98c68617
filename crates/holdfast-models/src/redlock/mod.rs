//! Model 1: a fenced RedLock over [`STORES`] independent stores.
//!
//! Each store keeps, for the one key, a holder token with an expiry (by the
//! store's clock) and a fence counter. A client sends one token to every store
//! at once (the first round of `acquire` and `try_acquire` alike), with a
//! fence floor: any floor, stale or too low included, as a client's cache of
//! the last fence it saw may be. A store grants when the key is free or
//! expired and answers with its fence, `max(counter + 1, floor)`, which its
//! counter becomes. Once a majority granted, the client picks the fence as
//! the maximum of their answers and (depending on the [`RedlockVariant`])
//! writes it back to the members whose answer was lower, then counts itself
//! granted if its validity, `ttl - elapsed - drift` by its own clock from
//! before it sent the acquire, is still positive.
//!
//! The network is [`crate::network::Network`] (lossy, reordering); time and drift
//! are [`crate::clock`]'s abstraction (store clocks run ahead of the clients'). The model is hand-written rather than built
//! on stateright's actor framework: the protocol is a handful of request/reply
//! pairs, and owning the state lets it drop replies the receiver would ignore and
//! keep timers relative, which keeps complete exploration within CI's budget.
//! There is no release: a release only ends a lease early, which expiry already
//! covers for safety.

mod state;
mod steps;
mod symmetry;

pub use state::{CLIENTS, MAJORITY, Message, Phase, RedlockState, STORES, Store, client_name};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedlockVariant {
    /// (a) Fence = max over the granting majority, nothing written back.
    NaiveMaxFence,
    /// (b) The fence is written back to the majority, but the store *sets* its
    /// counter to it instead of raising it (never lowering).
    OverwritingWriteBack,
    /// (c) The fence is written back with max, but the client counts itself
    /// granted before the write-back was acknowledged.
    ValidityBeforeWriteBack,
    /// (d) The shipped design: max write-back to the members of the granting
    /// majority whose answer was below the fence (a member that answered the
    /// fence already stands there), validity checked after a majority stands
    /// at the fence; acquires carry any floor.
    Shipped,
    /// (e) The shipped design, with one store restarting without persistence
    /// (losing its key and counter) at any moment.
    ShippedWithRestart,
    /// (g) The shipped design, but a client that sent a floor skips the
    /// write-back, believing every member's counter was below its floor (so
    /// that all answered the floor), instead of reading it in the answers.
    ClientTrustsFloor,
    /// (h) The shipped design, but a store given a floor *sets* its counter
    /// to the floor instead of `max(counter + 1, floor)`.
    FloorSetsCounter,
}

impl RedlockVariant {
    /// Whether the client writes the chosen fence back before it holds.
    pub fn writes_back_before_holding(self) -> bool {
        matches!(
            self,
            Self::OverwritingWriteBack
                | Self::Shipped
                | Self::ShippedWithRestart
                | Self::ClientTrustsFloor
                | Self::FloorSetsCounter
        )
    }

    /// Whether the write-back skips the members whose answer was the fence
    /// (they count as acknowledged at once): the shipped design and the
    /// variants of it; the older variants write back to the whole majority.
    pub fn skips_members_at_the_fence(self) -> bool {
        matches!(self, Self::Shipped | Self::ShippedWithRestart | Self::ClientTrustsFloor | Self::FloorSetsCounter)
    }

    /// Whether a client that sent a floor skips the write-back (g).
    pub fn trusts_its_floor(self) -> bool {
        matches!(self, Self::ClientTrustsFloor)
    }

    /// Whether a store sets its counter to a floor instead of raising it (h).
    pub fn floor_sets_counter(self) -> bool {
        matches!(self, Self::FloorSetsCounter)
    }

    /// Whether a write-back sets the counter (true) or raises it (false).
    pub fn write_back_overwrites(self) -> bool {
        matches!(self, Self::OverwritingWriteBack)
    }

    /// Whether a store may restart without persistence.
    pub fn store_may_restart(self) -> bool {
        matches!(self, Self::ShippedWithRestart)
    }
}

/// Name of the mutual-exclusion property.
pub const MUTUAL_EXCLUSION: &str = "no two clients believe they hold at once";
/// Name of the fence-order property.
pub const FENCES_INCREASE: &str = "each grant's fence is above every earlier grant's";
/// Name of the fenced-register property.
pub const NO_STALE_WRITE: &str = "the register accepts no write from an older grant";

/// Name of a reachability check: the exploration reaches a third grant (the
/// fence hazards need three grants, so a configuration that never made three
/// would prove nothing about them).
pub const THIRD_GRANT_REACHED: &str = "a third grant is made";

/// The highest floor a client sends in the checked configuration: with three
/// attempts no counter passes 3 by grants alone, so floors 0 to 2 are below,
/// at and above the counters a grant meets (a floor of 2 against counters
/// 0 and 1 makes a majority answer alike; against counters 2 and 3 it is
/// stale). Floors up to 3 add no new ordering and multiply the space.
pub const FLOORS: u8 = 2;

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct RedlockModel {
    /// Which design.
    pub variant: RedlockVariant,
    /// Lease time-to-live, in ticks.
    pub ttl: u8,
    /// Bound on clock drift between any two nodes over a run, in ticks.
    pub drift: u8,
    /// What the client subtracts from its validity for drift; `drift` in the
    /// design, zero in a check that the margin is needed.
    pub drift_margin: u8,
    /// Acquisition attempts all clients together may make.
    pub attempts: u8,
    /// The highest fence floor a client may send; it sends any floor from 0
    /// (none) up to this one, so stale and too-low floors are covered.
    pub floors: u8,
    /// Whether every successor state is replaced by its symmetry class's
    /// representative, so that a breadth-first search (which stateright runs
    /// without symmetry reduction) explores the reduced space too.
    pub representatives_only: bool,
}

impl RedlockModel {
    /// The checked configuration: TTL 2 ticks, drift 1 tick (a validity window
    /// of one tick), three attempts in total (the fence hazards need three
    /// grants; TTL 3 makes the space about five times larger), floors up to
    /// [`FLOORS`] (see there) for the designs that send floors, none for the
    /// older variants (a, b, c, e), which predate them.
    pub fn new(variant: RedlockVariant) -> Self {
        let floors = match variant {
            RedlockVariant::Shipped | RedlockVariant::ClientTrustsFloor | RedlockVariant::FloorSetsCounter => FLOORS,
            _ => 0,
        };
        Self { variant, ttl: 2, drift: 1, drift_margin: 1, attempts: 3, floors, representatives_only: false }
    }

    /// The checker for this model, exploring one state per symmetry class
    /// (stores and clients renamed; see `symmetry.rs`) depth-first.
    pub fn symmetric_checker(self) -> stateright::CheckerBuilder<Self> {
        self.checker().symmetry_fn(symmetry::representative)
    }

    /// This model with [`Self::representatives_only`] set: for breadth-first
    /// searches of the reduced space (shortest counterexamples, as
    /// representatives; [`crate::trace::concrete_trace`] renames them back).
    pub fn over_representatives(self) -> Self {
        Self { representatives_only: true, ..self }
    }

    /// The representative of `state`'s symmetry class.
    pub fn representative(state: &RedlockState) -> RedlockState {
        symmetry::representative(state)
    }

    /// Client-clock ticks after sending the acquire during which a grant may
    /// still be counted: `ttl - drift_margin`.
    pub fn validity(&self) -> u8 {
        self.ttl.saturating_sub(self.drift_margin)
    }
}

/// A node whose clock may run ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// A store, by index.
    Store(u8),
    /// A client, by index.
    Client(u8),
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedlockAction {
    /// One tick of real time: every clock advances.
    Tick,
    /// One store's clock runs a tick ahead of the clients' (drift).
    StoreClockRunsAhead(u8),
    /// A client starts an acquisition attempt with a fresh token and a fence
    /// floor (0: none).
    StartAttempt(u8, u8),
    /// The network delivers a message.
    Deliver(Message),
    /// A store restarts without persistence.
    RestartStore(u8),
}

impl fmt::Display for RedlockAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Tick => write!(f, "tick"),
            Self::StoreClockRunsAhead(store) => {
                write!(f, "S{}'s clock runs a tick ahead", store + 1)
            }
            Self::StartAttempt(client, 0) => write!(f, "{} sends acquire to all stores", client_name(client)),
            Self::StartAttempt(client, floor) => {
                write!(f, "{} sends acquire, floor {floor}, to all stores", client_name(client))
            }
            Self::Deliver(message) => write!(f, "deliver: {message}"),
            Self::RestartStore(store) => write!(f, "S{} restarts empty", store + 1),
        }
    }
}

impl Model for RedlockModel {
    type State = RedlockState;
    type Action = RedlockAction;

    fn init_states(&self) -> Vec<RedlockState> {
        vec![RedlockState::initial(self.attempts)]
    }

    fn actions(&self, state: &RedlockState, actions: &mut Vec<RedlockAction>) {
        actions.push(RedlockAction::Tick);
        // Running ahead matters only while a key's timer runs; offering it
        // otherwise would spend drift budget for nothing and add states.
        for (index, store) in state.stores.iter().enumerate() {
            if store.remaining > 0 && store.clock.may_run_ahead(self.drift) {
                actions.push(RedlockAction::StoreClockRunsAhead(index as u8));
            }
        }
        for (index, phase) in state.clients.iter().enumerate() {
            // A new attempt starts once the last one is over (granted and
            // lapsed, or past its validity, when it is abandoned): abandoning
            // earlier only moves the next attempt's start earlier, and its
            // messages can be delayed to land just as late.
            if *phase == Phase::Idle && state.attempts_left > 0 {
                for floor in 0..=self.floors {
                    actions.push(RedlockAction::StartAttempt(index as u8, floor));
                }
            }
        }
        for message in state.network.distinct() {
            actions.push(RedlockAction::Deliver(*message));
        }
        if self.variant.store_may_restart() && !state.restarted {
            for store in 0..STORES {
                actions.push(RedlockAction::RestartStore(store as u8));
            }
        }
    }

    fn next_state(&self, state: &RedlockState, action: RedlockAction) -> Option<RedlockState> {
        let next = steps::next_state(self, state, action)?;
        Some(if self.representatives_only { symmetry::representative(&next) } else { next })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(MUTUAL_EXCLUSION, |_, state: &RedlockState| state.believed_holders() <= 1),
            Property::always(FENCES_INCREASE, |_, state: &RedlockState| !state.grants.fence_regressed()),
            Property::sometimes(THIRD_GRANT_REACHED, |_, state: &RedlockState| state.grants.grants() >= 3),
            Property::always(NO_STALE_WRITE, |_, state: &RedlockState| !state.register.stale_write_accepted()),
        ]
    }
}
