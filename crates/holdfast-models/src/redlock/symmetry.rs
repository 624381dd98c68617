//! Symmetry reduction: stores are interchangeable, and so are clients.
//!
//! Renaming the stores (or the clients) of a state gives a state that behaves
//! the same and satisfies the same properties, since no property names a store
//! or a client. The checker therefore explores one representative per class:
//! the smallest state among all 3! x 2! renamings. That divides the explored
//! states by up to twelve, which is what lets the complete exploration fit
//! CI's budget.

use super::state::{CLIENTS, Message, Phase, RedlockState, STORES};

/// Every ordering of three stores.
const STORE_ORDERS: [[usize; STORES]; 6] = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
/// Every ordering of two clients.
const CLIENT_ORDERS: [[usize; CLIENTS]; 2] = [[0, 1], [1, 0]];

/// The canonical representative of `state`'s symmetry class.
pub fn representative(state: &RedlockState) -> RedlockState {
    let mut best: Option<RedlockState> = None;
    for stores in &STORE_ORDERS {
        for clients in &CLIENT_ORDERS {
            let candidate = renamed(state, stores, clients);
            if best.as_ref().is_none_or(|best| candidate < *best) {
                best = Some(candidate);
            }
        }
    }
    best.unwrap_or_else(|| state.clone())
}

/// `state` with store `i` renamed `stores[i]` and client `c` renamed `clients[c]`.
fn renamed(state: &RedlockState, stores: &[usize; STORES], clients: &[usize; CLIENTS]) -> RedlockState {
    let client_id = |client: u8| clients[usize::from(client)] as u8;
    let store_id = |store: u8| stores[usize::from(store)] as u8;
    let mut next = state.clone();
    for (old, store) in state.stores.iter().enumerate() {
        next.stores[stores[old]] = *store;
    }
    for (old, phase) in state.clients.iter().enumerate() {
        next.clients[clients[old]] = match *phase {
            Phase::Acquiring { elapsed, granted, trusts_floor } => {
                Phase::Acquiring { elapsed, granted: permute(&granted, stores), trusts_floor }
            }
            Phase::WritingBack { elapsed, fence, written, acked } => Phase::WritingBack {
                elapsed,
                fence,
                written: permute(&written, stores),
                acked: permute(&acked, stores),
            },
            other => other,
        };
    }
    next.network.rewrite(|message| match message {
        Message::Acquire { from, store, floor } => {
            Message::Acquire { from: from.map(client_id), store: store_id(store), floor }
        }
        Message::AcquireReply { client, store, counter } => {
            Message::AcquireReply { client: client_id(client), store: store_id(store), counter }
        }
        Message::WriteBack { from, store, fence } => {
            Message::WriteBack { from: from.map(client_id), store: store_id(store), fence }
        }
        Message::WriteBackAck { client, store } => {
            Message::WriteBackAck { client: client_id(client), store: store_id(store) }
        }
        register_write @ Message::RegisterWrite { .. } => register_write,
    });
    next
}

fn permute<T: Copy>(values: &[T; STORES], stores: &[usize; STORES]) -> [T; STORES] {
    let mut permuted = *values;
    for (old, value) in values.iter().enumerate() {
        permuted[stores[old]] = *value;
    }
    permuted
}
