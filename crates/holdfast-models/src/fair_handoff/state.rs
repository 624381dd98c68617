//! What the fair hand-off model remembers: the one Redis server, the clients,
//! the messages in flight, the grants.

use std::fmt;

use crate::clock::ClockGain;
use crate::grant_log::GrantLog;
use crate::network::Network;

/// Number of clients, each making one fair acquisition (one token).
pub const CLIENTS: usize = 3;

/// A message between a client and the server.
///
/// Ages are client-clock ticks since the request was sent (capped where no
/// validity is left): the reply carries its request's age on, so the client
/// knows when it sent the request a reply answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Message {
    /// `fair_acquire(token, ttl)`: the first request, a refresh, or a claim.
    FairAcquire {
        /// The sender (its token).
        client: u8,
        /// Ticks since it was sent.
        age: u8,
    },
    /// `release(token)` by a holder.
    Release {
        /// The sender (its token).
        client: u8,
    },
    /// The script granted (new grant or regrant): `{1, fence}`.
    Granted {
        /// The client answered.
        client: u8,
        /// Ticks since its request was sent.
        age: u8,
        /// The fence.
        fence: u8,
    },
    /// The script queued the waiter or refreshed its entry: `{0, ..}`.
    Queued {
        /// The client answered.
        client: u8,
        /// Ticks since its request was sent.
        age: u8,
        /// The lock's last fence when the script ran (only the `FenceChecked`
        /// variant's reply carries it).
        seen: Option<u8>,
    },
    /// A release handed the lock to the head waiter and PUBLISHed its token.
    HandOff {
        /// The client told.
        client: u8,
        /// The hand-off's fence (zero where the message carries none).
        fence: u8,
        /// The claim window in server ticks (only `FromReceipt`'s message
        /// carries it).
        claim: Option<u8>,
    },
}

/// One queued fair waiter: an entry of Q and E.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    /// The waiter (its token).
    pub client: u8,
    /// Server ticks until the entry expires; zero: dead (purged once at the
    /// head, revived in place if its token refreshes first).
    pub remaining: u8,
}

/// The Redis server's lock: H, Q and E.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Server {
    /// The owner token while its lease is live.
    pub owner: Option<u8>,
    /// Server ticks until the owner's lease ends.
    pub lease: u8,
    /// The lock's last fence.
    pub fence: u8,
    /// The queue, head first.
    pub queue: Vec<Entry>,
    /// How far the server's clock ran ahead.
    pub clock: ClockGain,
}

/// Where a client is in its acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Not started.
    Idle,
    /// Sent `fair_acquire` at least once; not granted yet.
    Waiting {
        /// Age of the latest-sent request answered "queued" (the variants
        /// that count from it), capped.
        queued_age: Option<u8>,
        /// The fence that reply saw (`FenceChecked` only).
        queued_seen: Option<u8>,
        /// Age of the latest request sent (`FromLatestSend` only), capped.
        sent_age: Option<u8>,
    },
    /// The client believes it holds the lock.
    Holding {
        /// Client-clock ticks left of its validity.
        remaining: u8,
        /// Its fence.
        fence: u8,
        /// Whether it counted itself granted from a hand-off message.
        from_hand_off: bool,
    },
    /// Released, lapsed or gone: sends nothing any more.
    Done,
}

/// One client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Client {
    /// Its acquisition's progress.
    pub phase: Phase,
    /// `fair_acquire` requests it may still send.
    pub requests_left: u8,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FairState {
    /// The server.
    pub server: Server,
    /// The clients.
    pub clients: [Client; CLIENTS],
    /// Messages in flight.
    pub network: Network<Message>,
    /// Grants in the order clients counted themselves granted.
    pub grants: GrantLog<u8>,
}

impl FairState {
    /// Lock free, queue empty, every client idle with `requests` to send.
    pub fn initial(requests: u8) -> Self {
        Self {
            server: Server::default(),
            clients: [Client { phase: Phase::Idle, requests_left: requests }; CLIENTS],
            network: Network::default(),
            grants: GrantLog::default(),
        }
    }

    /// Clients that believe, right now, that they hold the lock.
    pub fn believed_holders(&self) -> usize {
        self.clients.iter().filter(|client| matches!(client.phase, Phase::Holding { .. })).count()
    }

    /// True if a client holds from a hand-off message, without a claim.
    pub fn holds_from_hand_off(&self) -> bool {
        self.clients.iter().any(|client| matches!(client.phase, Phase::Holding { from_hand_off: true, .. }))
    }
}

/// A client's name in traces.
pub fn client_name(client: u8) -> char {
    char::from(b'A' + client)
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Message::FairAcquire { client, age } => write!(f, "fair_acquire {} (sent t-{age})", client_name(client)),
            Message::Release { client } => write!(f, "release {}", client_name(client)),
            Message::Granted { client, age, fence } => {
                write!(f, "granted {} fence {fence} (request sent t-{age})", client_name(client))
            }
            Message::Queued { client, age, seen } => {
                write!(f, "queued {} (request sent t-{age}", client_name(client))?;
                match seen {
                    Some(seen) => write!(f, ", lock's fence {seen})"),
                    None => write!(f, ")"),
                }
            }
            Message::HandOff { client, fence, claim } => {
                write!(f, "hand-off message to {} fence {fence}", client_name(client))?;
                match claim {
                    Some(claim) => write!(f, " claim {claim}"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl fmt::Display for FairState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let server = &self.server;
        write!(f, "server[fence {}", server.fence)?;
        if let Some(owner) = server.owner {
            write!(f, " owner {} for {}", client_name(owner), server.lease)?;
        }
        let queue: Vec<String> =
            server.queue.iter().map(|entry| format!("{}:{}", client_name(entry.client), entry.remaining)).collect();
        write!(f, " queue [{}]] ", queue.join(" "))?;
        for (index, client) in self.clients.iter().enumerate() {
            let name = client_name(index as u8);
            match client.phase {
                Phase::Idle => write!(f, "{name}:idle ")?,
                Phase::Waiting { queued_age, queued_seen, sent_age } => {
                    write!(f, "{name}:waiting(")?;
                    if let Some(age) = queued_age {
                        write!(f, "T_q=t-{age}, ")?;
                    }
                    if let Some(seen) = queued_seen {
                        write!(f, "its reply saw fence {seen}, ")?;
                    }
                    if let Some(age) = sent_age {
                        write!(f, "last sent t-{age}, ")?;
                    }
                    write!(f, "{} left) ", client.requests_left)?
                }
                Phase::Holding { remaining, fence, from_hand_off } => {
                    let how = if from_hand_off { " from message" } else { "" };
                    write!(f, "{name}:HOLDS fence {fence} for {remaining}{how} ")?
                }
                Phase::Done => write!(f, "{name}:done ")?,
            }
        }
        let in_flight: Vec<String> = self.network.iter().map(ToString::to_string).collect();
        write!(f, "| in flight: {}", in_flight.join(", "))
    }
}
