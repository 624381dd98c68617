//! What the fenced-RedLock model remembers: stores, clients, messages, history.

use std::fmt;

use crate::clock::ClockGain;
use crate::grant_log::GrantLog;
use crate::network::Network;
use crate::register::FencedRegister;

/// Number of independent stores.
pub const STORES: usize = 3;
/// Number of clients competing for the key.
pub const CLIENTS: usize = 2;
/// Stores that must grant (and acknowledge the write-back) for a client to hold.
pub const MAJORITY: usize = STORES / 2 + 1;

/// A message between a client and a store, or a client and the register.
///
/// A request names its sender only while the sender's attempt is in progress
/// (`from: Some(client)`); once the attempt is over nobody waits for the
/// answer, the store's effect is all that is left, and the request is marked
/// `from: None` so that stale requests of different attempts are alike.
/// A store that refuses sends nothing: a refusal changes nothing at a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Message {
    /// Take the key if it is free or expired, with a fence of at least `floor`.
    Acquire {
        /// The client whose attempt is waiting for the answer.
        from: Option<u8>,
        /// The store asked.
        store: u8,
        /// The fence floor (0: none).
        floor: u8,
    },
    /// The store granted: its fence, which its counter now stands at.
    AcquireReply {
        /// The client answered.
        client: u8,
        /// The store answering.
        store: u8,
        /// The counter.
        counter: u8,
    },
    /// Raise (or, in one rejected variant, set) the store's counter to `fence`.
    WriteBack {
        /// The client whose attempt is waiting for the acknowledgement.
        from: Option<u8>,
        /// The store written.
        store: u8,
        /// The chosen fence.
        fence: u8,
    },
    /// The store applied the write-back.
    WriteBackAck {
        /// The client answered.
        client: u8,
        /// The store answering.
        store: u8,
    },
    /// A holder's write to the fenced register.
    RegisterWrite {
        /// The writer's number in grant order.
        grant: u8,
        /// The writer's fence.
        fence: u8,
    },
}

/// One store's lock key and fence counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Store {
    /// Store-clock ticks until the key expires; zero when free. Who holds it
    /// is not kept: no store operation in the model depends on it.
    pub remaining: u8,
    /// The key's fence counter: bumped by every grant, raised by write-backs.
    pub counter: u8,
    /// How far this store's clock ran ahead.
    pub clock: ClockGain,
}

/// Where a client is in its current attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Not trying, not holding.
    Idle,
    /// Acquire sent to every store; replies collected.
    Acquiring {
        /// Client-clock ticks since the acquire was sent (capped at the TTL).
        elapsed: u8,
        /// Each store's grant (its counter) once it arrived.
        granted: [Option<u8>; STORES],
        /// Whether it sent a floor and will trust it (variant g only; false
        /// elsewhere, so that the floor adds no states where it is not read).
        trusts_floor: bool,
    },
    /// A majority granted; the chosen fence is being written back to it.
    WritingBack {
        /// Client-clock ticks since the acquire was sent (capped at the TTL).
        elapsed: u8,
        /// The chosen fence.
        fence: u8,
        /// Stores written to.
        written: [bool; STORES],
        /// Stores that acknowledged.
        acked: [bool; STORES],
    },
    /// The client believes it holds the lock.
    Holding {
        /// Client-clock ticks left of its validity.
        remaining: u8,
        /// The fence it holds.
        fence: u8,
        /// Its number in grant order.
        grant: u8,
    },
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RedlockState {
    /// The stores.
    pub stores: [Store; STORES],
    /// The clients, by where their current attempt is.
    pub clients: [Phase; CLIENTS],
    /// Attempts the clients may still start, all together.
    pub attempts_left: u8,
    /// Messages in flight.
    pub network: Network<Message>,
    /// Grants in the order clients counted themselves granted.
    pub grants: GrantLog<u8>,
    /// The fenced resource.
    pub register: FencedRegister<u8>,
    /// Whether the one permitted store restart happened.
    pub restarted: bool,
}

impl RedlockState {
    /// No key held anywhere, every counter at zero, nothing in flight.
    pub fn initial(attempts: u8) -> Self {
        Self {
            stores: [Store::default(); STORES],
            clients: [Phase::Idle; CLIENTS],
            attempts_left: attempts,
            network: Network::default(),
            grants: GrantLog::default(),
            register: FencedRegister::default(),
            restarted: false,
        }
    }

    /// Clients that believe, right now, that they hold the lock.
    pub fn believed_holders(&self) -> usize {
        self.clients.iter().filter(|phase| matches!(phase, Phase::Holding { .. })).count()
    }
}

/// A client's name in traces.
pub fn client_name(client: u8) -> char {
    char::from(b'A' + client)
}

fn sender(from: Option<u8>) -> String {
    from.map_or_else(|| "(abandoned)".to_owned(), |client| client_name(client).to_string())
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Message::Acquire { from, store, floor: 0 } => {
                write!(f, "acquire {}->S{}", sender(from), store + 1)
            }
            Message::Acquire { from, store, floor } => {
                write!(f, "acquire floor {floor} {}->S{}", sender(from), store + 1)
            }
            Message::AcquireReply { client, store, counter } => {
                write!(f, "S{} grants {} counter {counter}", store + 1, client_name(client))
            }
            Message::WriteBack { from, store, fence } => {
                write!(f, "write-back {fence} {}->S{}", sender(from), store + 1)
            }
            Message::WriteBackAck { client, store } => {
                write!(f, "S{} acks write-back ->{}", store + 1, client_name(client))
            }
            Message::RegisterWrite { grant, fence } => {
                write!(f, "register write by grant {} fence {fence}", grant + 1)
            }
        }
    }
}

impl fmt::Display for RedlockState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, store) in self.stores.iter().enumerate() {
            write!(f, "S{}[ctr {}", index + 1, store.counter)?;
            if store.remaining > 0 {
                write!(f, " held for {}", store.remaining)?;
            }
            write!(f, "] ")?;
        }
        for (index, phase) in self.clients.iter().enumerate() {
            let name = client_name(index as u8);
            match *phase {
                Phase::Idle => write!(f, "{name}:idle ")?,
                Phase::Acquiring { elapsed, granted, .. } => {
                    let grants: Vec<String> = (0..STORES)
                        .filter_map(|store| granted[store].map(|counter| format!("S{}:{counter}", store + 1)))
                        .collect();
                    write!(f, "{name}:acquiring(t+{elapsed}, grants [{}]) ", grants.join(" "))?
                }
                Phase::WritingBack { elapsed, fence, acked, .. } => {
                    let acks: Vec<String> =
                        (0..STORES).filter(|store| acked[*store]).map(|store| format!("S{}", store + 1)).collect();
                    write!(f, "{name}:writing back {fence}(t+{elapsed}, acks [{}]) ", acks.join(" "))?
                }
                Phase::Holding { remaining, fence, grant, .. } => {
                    write!(f, "{name}:HOLDS grant {} fence {fence} for {remaining} ", grant + 1)?
                }
            }
        }
        let in_flight: Vec<String> = self.network.iter().map(ToString::to_string).collect();
        write!(f, "| in flight: {}", in_flight.join(", "))
    }
}
