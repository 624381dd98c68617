//! Symmetry reduction: the clients are interchangeable (each makes one fair
//! acquisition with the same budget, and no property names a client), so the
//! checker explores one representative per class: the smallest state among
//! the 3! renamings of the clients.

use super::state::{CLIENTS, FairState, Message};

/// Every ordering of three clients.
const CLIENT_ORDERS: [[usize; CLIENTS]; 6] = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];

/// The canonical representative of `state`'s symmetry class.
pub fn representative(state: &FairState) -> FairState {
    let mut best: Option<FairState> = None;
    for clients in &CLIENT_ORDERS {
        let candidate = renamed(state, clients);
        if best.as_ref().is_none_or(|best| candidate < *best) {
            best = Some(candidate);
        }
    }
    best.unwrap_or_else(|| state.clone())
}

/// `state` with client `c` renamed `clients[c]`.
fn renamed(state: &FairState, clients: &[usize; CLIENTS]) -> FairState {
    let id = |client: u8| clients[usize::from(client)] as u8;
    let mut next = state.clone();
    for (old, client) in state.clients.iter().enumerate() {
        next.clients[clients[old]] = *client;
    }
    next.server.owner = state.server.owner.map(id);
    for entry in &mut next.server.queue {
        entry.client = id(entry.client);
    }
    next.network.rewrite(|mut message| {
        match &mut message {
            Message::FairAcquire { client, .. }
            | Message::Release { client }
            | Message::Granted { client, .. }
            | Message::Queued { client, .. }
            | Message::HandOff { client, .. } => *client = id(*client),
        }
        message
    });
    next
}
