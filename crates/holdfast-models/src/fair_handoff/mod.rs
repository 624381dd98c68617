//! Model 3: the Redis store's fair mode, and whether a waiter handed the lock
//! by a release may count itself granted from the hand-off message alone.
//!
//! One Redis server runs the scripts atomically. `fair_acquire(token)` regrants
//! to the token that owns the lock, grants a free lock to the live head of the
//! queue (or when the queue is empty) with a new fence and a lease of `ttl`, and
//! otherwise queues the waiter, or refreshes its entry, for `queue_ttl`.
//! `release(token)` by the holder purges dead entries at the head and hands the
//! lock to the live head: new owner, new fence, a lease of the *claim window*
//! `clamp(entry expiry - now, min_claim, ttl)`, and a PUBLISH naming the head.
//! A client counts a granted reply valid for `ttl - drift_margin` from when it
//! sent the request. The [`FairVariant`] decides what a waiter does with the
//! hand-off message.
//!
//! The network is [`crate::network::Network`]: requests, replies and hand-off
//! messages may each be delayed, reordered or lost. Time and drift are
//! [`crate::clock`]'s abstraction (the server's clock may run ahead of the
//! clients'). Each of the [`CLIENTS`] makes one fair acquisition with one
//! token, sends at most `requests_per_client` requests (a waiter may refresh at
//! any moment: refreshing every `queue_ttl / 4`, or on a wake-up, is one of
//! those schedules), and releases or lets its belief lapse; a client that
//! stops sending is a cancelled or crashed one.

mod state;
mod steps;
mod symmetry;

pub use state::{CLIENTS, Client, Entry, FairState, Message, Phase, Server, client_name};

use std::fmt;

use stateright::{CheckerBuilder, Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FairVariant {
    /// (a) Today: the message only wakes the waiter, which claims with
    /// `fair_acquire` and counts itself granted from the claim's reply.
    ClaimEveryHandOff,
    /// (b) Validity from when the message was *received*, for the claim window
    /// it carries (minus the drift margin).
    FromReceipt,
    /// (c) Validity `T_s + min(ttl, queue_ttl) - drift_margin`, `T_s` the send
    /// time of the latest request sent, answered or not.
    FromLatestSend,
    /// (d) Validity `T_q + ttl - drift_margin`, `T_q` the send time of the
    /// latest request answered "queued" (the queue entry's TTL ignored).
    IgnoresQueueTtl,
    /// (e) The proposal: validity `T_q + min(ttl, queue_ttl) - drift_margin`.
    Shipped,
    /// (g) (e), and the message is taken only if its fence is above the lock's
    /// fence that the "queued" reply of `T_q` reported (so the hand-off ran
    /// after that request). What ships: the waiter's grant starts at `T_q`
    /// and is valid for `min(ttl, queue_ttl)` (less the drift margin, as
    /// here); a renewal, not modelled, is a regrant's request.
    FenceChecked,
}

impl FairVariant {
    /// Whether the hand-off message can grant (every variant but today's).
    pub fn message_grants(self) -> bool {
        self != Self::ClaimEveryHandOff
    }

    /// Whether the waiter remembers when it sent its latest "queued" request.
    pub fn tracks_queued(self) -> bool {
        matches!(self, Self::IgnoresQueueTtl | Self::Shipped | Self::FenceChecked)
    }
}

/// Name of the mutual-exclusion property.
pub const MUTUAL_EXCLUSION: &str = "no two clients believe they hold at once";
/// Name of the fence-order property.
pub const FENCES_INCREASE: &str = "each grant's fence is above every earlier grant's";
/// Name of a reachability check: some client counts itself granted from a
/// hand-off message (so "no counterexample" is not vacuous).
pub const HAND_OFF_GRANT_REACHED: &str = "a waiter holds from a hand-off message";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct FairModel {
    /// Which design.
    pub variant: FairVariant,
    /// Lease time-to-live, in ticks.
    pub ttl: u8,
    /// Queue entry time-to-live (`queue_ttl`), in ticks.
    pub queue_ttl: u8,
    /// The claim window's lower clamp (100 ms in the script), in ticks.
    pub min_claim: u8,
    /// Bound on the server clock's gain over a run, in ticks.
    pub drift: u8,
    /// What a client subtracts from a granted reply's validity for drift.
    pub drift_margin: u8,
    /// What a waiter subtracts from a hand-off message's window for drift
    /// (`drift_margin` in every design; zero in the check that it is needed).
    pub message_margin: u8,
    /// `fair_acquire` requests each client may send.
    pub requests_per_client: u8,
    /// Whether successors are replaced by their symmetry representative (for
    /// breadth-first searches of the reduced space).
    pub representatives_only: bool,
}

impl FairModel {
    /// The checked configuration: TTL 4, queue TTL 3 (below the TTL, as (d)
    /// needs), claim clamp 1, drift 1, two requests per client (a waiter's
    /// first request and one refresh or claim).
    pub fn new(variant: FairVariant) -> Self {
        Self {
            variant,
            ttl: 4,
            queue_ttl: 3,
            min_claim: 1,
            drift: 1,
            drift_margin: 1,
            message_margin: 1,
            requests_per_client: 2,
            representatives_only: false,
        }
    }

    /// The checker, exploring one state per symmetry class (clients renamed).
    pub fn symmetric_checker(self) -> CheckerBuilder<Self> {
        self.checker().symmetry_fn(symmetry::representative)
    }

    /// This model with [`Self::representatives_only`] set.
    pub fn over_representatives(self) -> Self {
        Self { representatives_only: true, ..self }
    }

    /// The representative of `state`'s symmetry class.
    pub fn representative(state: &FairState) -> FairState {
        symmetry::representative(state)
    }

    /// Validity of a granted reply: `ttl - drift_margin` client ticks from
    /// sending its request. No window is longer, so ages stop counting there.
    pub fn age_cap(&self) -> u8 {
        self.ttl.saturating_sub(self.drift_margin)
    }

    /// The window a hand-off message grants, counted from `T_q` or `T_s`.
    pub fn message_window(&self) -> u8 {
        let span = match self.variant {
            FairVariant::IgnoresQueueTtl => self.ttl,
            _ => self.ttl.min(self.queue_ttl),
        };
        span.saturating_sub(self.message_margin)
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FairAction {
    /// One tick of real time.
    Tick,
    /// The server's clock runs a tick ahead of the clients' (drift).
    ServerClockRunsAhead,
    /// A client sends `fair_acquire` (its first request, a refresh or a claim).
    SendFairAcquire(u8),
    /// A holder sends `release`, ending its belief.
    SendRelease(u8),
    /// The network delivers a message.
    Deliver(Message),
}

impl fmt::Display for FairAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Tick => write!(f, "tick"),
            Self::ServerClockRunsAhead => write!(f, "the server's clock runs a tick ahead"),
            Self::SendFairAcquire(client) => write!(f, "{} sends fair_acquire", client_name(client)),
            Self::SendRelease(client) => write!(f, "{} sends release", client_name(client)),
            Self::Deliver(message) => write!(f, "deliver: {message}"),
        }
    }
}

impl Model for FairModel {
    type State = FairState;
    type Action = FairAction;

    fn init_states(&self) -> Vec<FairState> {
        vec![FairState::initial(self.requests_per_client)]
    }

    fn actions(&self, state: &FairState, actions: &mut Vec<FairAction>) {
        actions.push(FairAction::Tick);
        let server = &state.server;
        let running = server.lease > 0 || server.queue.iter().any(|entry| entry.remaining > 0);
        if running && server.clock.may_run_ahead(self.drift) {
            actions.push(FairAction::ServerClockRunsAhead);
        }
        for (index, client) in state.clients.iter().enumerate() {
            match client.phase {
                Phase::Idle | Phase::Waiting { .. } if client.requests_left > 0 => {
                    actions.push(FairAction::SendFairAcquire(index as u8));
                }
                Phase::Holding { .. } => actions.push(FairAction::SendRelease(index as u8)),
                _ => {}
            }
        }
        for message in state.network.distinct() {
            actions.push(FairAction::Deliver(*message));
        }
    }

    fn next_state(&self, state: &FairState, action: FairAction) -> Option<FairState> {
        let next = steps::next_state(self, state, action)?;
        Some(if self.representatives_only { symmetry::representative(&next) } else { next })
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(MUTUAL_EXCLUSION, |_, state: &FairState| state.believed_holders() <= 1),
            Property::always(FENCES_INCREASE, |_, state: &FairState| !state.grants.fence_regressed()),
            Property::sometimes(HAND_OFF_GRANT_REACHED, |_, state: &FairState| state.holds_from_hand_off()),
        ]
    }
}
