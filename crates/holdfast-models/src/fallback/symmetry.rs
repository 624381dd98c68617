//! Symmetry reduction: the clients are interchangeable (the stores are not:
//! the chain orders them), so the checker explores the smaller of a state and
//! its copy with the two clients' names swapped.

use crate::network::Network;

use super::state::{FallbackState, Message};

/// The canonical representative of `state`'s symmetry class.
pub fn representative(state: &FallbackState) -> FallbackState {
    let swapped = swapped(state);
    if swapped < *state { swapped } else { state.clone() }
}

fn swapped(state: &FallbackState) -> FallbackState {
    let other = |client: u8| 1 - client;
    let mut next = state.clone();
    next.clients.swap(0, 1);
    for store in &mut next.stores {
        store.holder = store.holder.map(other);
    }
    let mut network = Network::default();
    for message in state.network.iter() {
        let mut message = *message;
        match &mut message {
            Message::Acquire { client, .. }
            | Message::AcquireReply { client, .. }
            | Message::ReadMode { client, .. }
            | Message::ModeReply { client, .. }
            | Message::Switch { client, .. } => *client = other(*client),
        }
        network.send(message);
    }
    next.network = network;
    next
}
