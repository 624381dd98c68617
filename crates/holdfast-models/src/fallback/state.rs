//! What the fallback-chain model remembers: stores, the mode record, clients,
//! messages and the grants made.

use std::fmt;

use crate::clock::ClockGain;
use crate::grant_log::GrantLog;
use crate::network::Network;

/// Stores in the chain; the last one is also the arbiter keeping the mode record.
pub const STORES: usize = 2;
/// Clients competing for the key.
pub const CLIENTS: usize = 2;
/// Index of the arbiter (the last, most consistent store).
pub const ARBITER: u8 = (STORES - 1) as u8;

/// A fallback grant's fence: (epoch, the granting store's counter), compared
/// lexicographically, so a grant under a later epoch is above every grant under
/// an earlier one whatever the stores' own counters say.
pub type Fence = (u8, u8);

/// A message between a client and a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Message {
    /// Take the key at `store` if free or expired.
    Acquire {
        /// Who asks.
        client: u8,
        /// The client's request number (replies to older requests are stale).
        request: u8,
        /// The store asked.
        store: u8,
    },
    /// The store's answer: its counter after the bump, or `None` (held).
    AcquireReply {
        /// Who asked.
        client: u8,
        /// The request answered.
        request: u8,
        /// `Some(counter)` if granted.
        counter: Option<u8>,
    },
    /// Read the mode record at the arbiter.
    ReadMode {
        /// Who asks.
        client: u8,
        /// The client's request number.
        request: u8,
    },
    /// The mode record, as the arbiter saw it.
    ModeReply {
        /// Who asked.
        client: u8,
        /// The request answered.
        request: u8,
        /// The record's epoch.
        epoch: u8,
        /// The store the epoch grants from.
        active: u8,
        /// Whether the epoch may be used yet.
        ready: bool,
    },
    /// Compare-and-set the record from `from_epoch` to the next epoch on `to_store`.
    Switch {
        /// Who asks.
        client: u8,
        /// The epoch the client last saw.
        from_epoch: u8,
        /// The store the new epoch grants from.
        to_store: u8,
    },
}

/// One store's lock key and fence counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Store {
    /// The client holding the key; `None` when free or expired.
    pub holder: Option<u8>,
    /// Store-clock ticks until the key expires.
    pub remaining: u8,
    /// The store's own fence counter for the key.
    pub counter: u8,
    /// How far this store's clock ran ahead.
    pub clock: ClockGain,
}

/// The arbiter's record of which store the chain grants from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModeRecord {
    /// Bumped by every switch.
    pub epoch: u8,
    /// The store grants come from in this epoch.
    pub active: u8,
    /// Arbiter-clock ticks until the epoch may be used.
    pub ready_in: u8,
}

/// A client's lease on the mode record: it may grant from `active` under
/// `epoch` while `remaining` is above zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModeLease {
    /// The epoch read.
    pub epoch: u8,
    /// The store it names.
    pub active: u8,
    /// Client-clock ticks left.
    pub remaining: u8,
}

/// The request a client waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pending {
    /// An acquire at `store`.
    Acquire {
        /// The store asked.
        store: u8,
        /// Client-clock ticks since it was sent (capped).
        elapsed: u8,
    },
    /// A read of the mode record.
    Read {
        /// Client-clock ticks since it was sent (capped).
        elapsed: u8,
    },
}

/// A grant the client believes it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Holding {
    /// Client-clock ticks left.
    pub remaining: u8,
    /// Its fence.
    pub fence: Fence,
}

/// One client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Client {
    /// Requests sent so far (also the next request's number).
    pub requests: u8,
    /// The request it waits on, if any.
    pub pending: Option<Pending>,
    /// Its lease on the mode record (the shipped construction).
    pub mode: Option<ModeLease>,
    /// The grant it believes it holds.
    pub holding: Option<Holding>,
    /// The store the naive chain tries next.
    pub next_store: u8,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FallbackState {
    /// The chain's stores.
    pub stores: [Store; STORES],
    /// The mode record, kept by the arbiter.
    pub record: ModeRecord,
    /// The clients.
    pub clients: [Client; CLIENTS],
    /// Messages in flight.
    pub network: Network<Message>,
    /// Grants in the order clients counted themselves granted.
    pub grants: GrantLog<Fence>,
    /// Whether another tenant moved the shared counter (`SharedCounter`).
    pub tenant_moved: bool,
}

impl FallbackState {
    /// Nothing held, epoch 0 on the first store (ready), nothing in flight.
    pub fn initial() -> Self {
        Self {
            stores: [Store::default(); STORES],
            record: ModeRecord::default(),
            clients: [Client::default(); CLIENTS],
            network: Network::default(),
            grants: GrantLog::default(),
            tenant_moved: false,
        }
    }

    /// Clients that believe, right now, that they hold the lock.
    pub fn believed_holders(&self) -> usize {
        self.clients.iter().filter(|client| client.holding.is_some()).count()
    }
}

/// A client's name in traces.
pub fn client_name(client: u8) -> char {
    char::from(b'A' + client)
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Message::Acquire { client, store, .. } => {
                write!(f, "acquire {}->S{}", client_name(client), store + 1)
            }
            Message::AcquireReply { client, counter: Some(counter), .. } => {
                write!(f, "grant counter {counter} ->{}", client_name(client))
            }
            Message::AcquireReply { client, .. } => write!(f, "refusal ->{}", client_name(client)),
            Message::ReadMode { client, .. } => write!(f, "read mode {}->arbiter", client_name(client)),
            Message::ModeReply { client, epoch, active, ready, .. } => write!(
                f,
                "mode (epoch {epoch}, S{}, {}) ->{}",
                active + 1,
                if ready { "ready" } else { "not ready" },
                client_name(client)
            ),
            Message::Switch { client, from_epoch, to_store } => write!(
                f,
                "switch epoch {from_epoch}->{} to S{} by {}",
                from_epoch + 1,
                to_store + 1,
                client_name(client)
            ),
        }
    }
}

impl fmt::Display for FallbackState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, store) in self.stores.iter().enumerate() {
            write!(f, "S{}[ctr {}", index + 1, store.counter)?;
            if let Some(holder) = store.holder {
                write!(f, " held by {} for {}", client_name(holder), store.remaining)?;
            }
            write!(f, "] ")?;
        }
        let record = self.record;
        write!(f, "record(epoch {}, S{}", record.epoch, record.active + 1)?;
        if record.ready_in > 0 {
            write!(f, ", ready in {}", record.ready_in)?;
        }
        write!(f, ") ")?;
        for (index, client) in self.clients.iter().enumerate() {
            write!(f, "{}:", client_name(index as u8))?;
            if let Some(mode) = client.mode {
                write!(f, "mode(e{} S{} for {}) ", mode.epoch, mode.active + 1, mode.remaining)?;
            }
            match client.pending {
                Some(Pending::Acquire { store, elapsed }) => write!(f, "awaits S{}(t+{elapsed}) ", store + 1)?,
                Some(Pending::Read { elapsed }) => write!(f, "awaits record(t+{elapsed}) ")?,
                None => {}
            }
            match client.holding {
                Some(holding) => write!(f, "HOLDS fence {:?} for {} ", holding.fence, holding.remaining)?,
                None => write!(f, "- ")?,
            }
        }
        let in_flight: Vec<String> = self.network.iter().map(ToString::to_string).collect();
        write!(f, "| in flight: {}", in_flight.join(", "))
    }
}
