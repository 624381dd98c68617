//! The fair hand-off model's transitions: the scripts `fair_acquire.lua` and
//! `release.lua` as the server runs them, and what a client does with replies
//! and hand-off messages.

use crate::clock::{count_down, count_up};

use super::state::{Entry, FairState, Message, Phase};
use super::{FairAction, FairModel, FairVariant};

/// The state after `action`, or `None` when the action changes nothing.
pub fn next_state(model: &FairModel, state: &FairState, action: FairAction) -> Option<FairState> {
    let mut next = state.clone();
    let cap = model.age_cap();
    match action {
        FairAction::Tick => {
            server_tick(&mut next);
            for client in &mut next.clients {
                match &mut client.phase {
                    Phase::Waiting { queued_age, sent_age, .. } => {
                        for age in [queued_age, sent_age].into_iter().flatten() {
                            count_up(age, cap);
                        }
                    }
                    Phase::Holding { remaining, .. } => count_down(remaining),
                    Phase::Idle | Phase::Done => {}
                }
            }
            next.network.rewrite(|mut message| {
                match &mut message {
                    Message::FairAcquire { age, .. } | Message::Granted { age, .. } | Message::Queued { age, .. } => {
                        count_up(age, cap);
                    }
                    Message::Release { .. } | Message::HandOff { .. } => {}
                }
                message
            });
        }
        FairAction::ServerClockRunsAhead => {
            next.server.clock.run_ahead();
            server_tick(&mut next);
        }
        FairAction::SendFairAcquire(client) => {
            let sender = &mut next.clients[usize::from(client)];
            sender.requests_left = sender.requests_left.checked_sub(1)?;
            let queued = match sender.phase {
                Phase::Idle => (None, None),
                Phase::Waiting { queued_age, queued_seen, .. } => (queued_age, queued_seen),
                Phase::Holding { .. } | Phase::Done => return None,
            };
            let sent_age = (model.variant == FairVariant::FromLatestSend).then_some(0);
            sender.phase = Phase::Waiting { queued_age: queued.0, queued_seen: queued.1, sent_age };
            next.network.send(Message::FairAcquire { client, age: 0 });
        }
        FairAction::SendRelease(client) => {
            let sender = &mut next.clients[usize::from(client)];
            if !matches!(sender.phase, Phase::Holding { .. }) {
                return None;
            }
            sender.phase = Phase::Done;
            next.network.send(Message::Release { client });
        }
        FairAction::Deliver(message) => {
            if !next.network.take(&message) {
                return None;
            }
            deliver(model, &mut next, message);
        }
    }
    normalize(model, &mut next);
    (next != *state).then_some(next)
}

/// One tick of the server's clock: the lease and every queue entry age.
fn server_tick(state: &mut FairState) {
    count_down(&mut state.server.lease);
    for entry in &mut state.server.queue {
        count_down(&mut entry.remaining);
    }
}

fn deliver(model: &FairModel, state: &mut FairState, message: Message) {
    match message {
        Message::FairAcquire { client, age } => fair_acquire(model, state, client, age),
        Message::Release { client } => release(model, state, client),
        Message::Granted { client, age, fence } => {
            if age < model.age_cap() {
                hold(state, client, model.age_cap() - age, fence, false);
            }
        }
        Message::Queued { client, age, seen } => {
            if let Phase::Waiting { queued_age, queued_seen, .. } = &mut state.clients[usize::from(client)].phase {
                // T_q is the send time of the latest-sent request answered "queued".
                if queued_age.is_none_or(|latest| age <= latest) {
                    *queued_age = Some(age);
                    *queued_seen = seen;
                }
            }
        }
        Message::HandOff { client, fence, claim } => receive_hand_off(model, state, client, fence, claim),
    }
}

/// `common.lua`'s purge: drops dead entries at the head; the live head, if any.
fn purge(state: &mut FairState) -> Option<u8> {
    let queue = &mut state.server.queue;
    let dead = queue.iter().take_while(|entry| entry.remaining == 0).count();
    queue.drain(..dead);
    queue.first().map(|entry| entry.client)
}

/// `fair_acquire.lua` (exclusive mode, no shared leases).
fn fair_acquire(model: &FairModel, state: &mut FairState, client: u8, age: u8) {
    let server = &mut state.server;
    if server.owner == Some(client) {
        // regrant: the same fence, the lease counted from now.
        server.lease = model.ttl;
        let fence = server.fence;
        state.network.send(Message::Granted { client, age, fence });
        return;
    }
    let head = purge(state);
    let server = &mut state.server;
    if server.owner.is_none() && head.is_none_or(|head| head == client) {
        if head.is_some() {
            server.queue.remove(0);
        }
        server.fence += 1;
        server.owner = Some(client);
        server.lease = model.ttl;
        let fence = server.fence;
        state.network.send(Message::Granted { client, age, fence });
        return;
    }
    match server.queue.iter_mut().find(|entry| entry.client == client) {
        Some(entry) => entry.remaining = model.queue_ttl,
        None => server.queue.push(Entry { client, remaining: model.queue_ttl }),
    }
    let seen = (model.variant == FairVariant::FenceChecked).then_some(server.fence);
    state.network.send(Message::Queued { client, age, seen });
}

/// `release.lua` for an exclusive holder; a token that does not hold only
/// loses its queue entry (a cancelled waiter; its wake-up of the next head is
/// not modelled, as a waiter may refresh at any moment anyway).
fn release(model: &FairModel, state: &mut FairState, client: u8) {
    if state.server.owner != Some(client) {
        state.server.queue.retain(|entry| entry.client != client);
        return;
    }
    let Some(head) = purge(state) else {
        state.server.owner = None;
        state.server.lease = 0;
        return;
    };
    let server = &mut state.server;
    let entry = server.queue.remove(0);
    let claim = entry.remaining.clamp(model.min_claim, model.ttl);
    server.fence += 1;
    server.owner = Some(head);
    server.lease = claim;
    if model.variant.message_grants() {
        let fence = server.fence;
        let claim = (model.variant == FairVariant::FromReceipt).then_some(claim);
        state.network.send(Message::HandOff { client: head, fence, claim });
    }
}

/// A waiter receives the hand-off message: it holds if the variant's validity
/// is still ahead; otherwise it stays waiting and claims as today.
fn receive_hand_off(model: &FairModel, state: &mut FairState, client: u8, fence: u8, claim: Option<u8>) {
    let Phase::Waiting { queued_age, queued_seen, sent_age } = state.clients[usize::from(client)].phase else {
        return;
    };
    let window = model.message_window();
    let remaining = match model.variant {
        FairVariant::ClaimEveryHandOff => None,
        FairVariant::FromReceipt => claim.map(|claim| claim.saturating_sub(model.message_margin)),
        FairVariant::FromLatestSend => sent_age.map(|age| window.saturating_sub(age)),
        FairVariant::IgnoresQueueTtl | FairVariant::Shipped => queued_age.map(|age| window.saturating_sub(age)),
        FairVariant::FenceChecked => {
            // Only a hand-off that ran after the "queued" request: its fence is
            // above the lock's fence that request's reply reported.
            let after = queued_seen.is_some_and(|seen| fence > seen);
            queued_age.filter(|_| after).map(|age| window.saturating_sub(age))
        }
    };
    if let Some(remaining) = remaining.filter(|remaining| *remaining > 0) {
        hold(state, client, remaining, fence, true);
    }
}

/// A waiting client counts itself granted for `remaining` ticks.
fn hold(state: &mut FairState, client: u8, remaining: u8, fence: u8, from_hand_off: bool) {
    let phase = &mut state.clients[usize::from(client)].phase;
    if matches!(phase, Phase::Waiting { .. }) {
        state.grants.record(fence);
        *phase = Phase::Holding { remaining, fence, from_hand_off };
    }
}

/// Collapses states no node can tell apart: a lapsed lease is a free lock, a
/// lapsed belief is a finished client, replies and messages to a client that
/// no longer waits are gone, ages nobody will read are zero, a dead entry
/// nobody can revive is purged, and what a variant does not read is not kept.
fn normalize(model: &FairModel, state: &mut FairState) {
    if state.server.lease == 0 {
        state.server.owner = None;
    }
    let window = model.message_window();
    let tracks_queued = model.variant.tracks_queued();
    for client in &mut state.clients {
        match &mut client.phase {
            Phase::Holding { remaining: 0, .. } => client.phase = Phase::Done,
            Phase::Waiting { queued_age, queued_seen, sent_age } => {
                // A send time past the message's window grants nothing: as if none.
                if !tracks_queued || queued_age.is_some_and(|age| age >= window) {
                    *queued_age = None;
                    *queued_seen = None;
                }
                if sent_age.is_some_and(|age| age >= window) {
                    *sent_age = None;
                }
            }
            _ => {}
        }
        if client.phase == Phase::Done {
            client.requests_left = 0;
        }
    }
    let clients = state.clients;
    let waiting = |client: u8| matches!(clients[usize::from(client)].phase, Phase::Waiting { .. });
    let age_cap = model.age_cap();
    state.network.retain(|message| match *message {
        Message::Granted { client, age, .. } => waiting(client) && age < age_cap,
        Message::Queued { client, age, .. } => waiting(client) && tracks_queued && age < window,
        Message::HandOff { client, .. } => waiting(client),
        Message::FairAcquire { .. } | Message::Release { .. } => true,
    });
    state.network.rewrite(|message| match message {
        Message::FairAcquire { client, .. } if !waiting(client) => Message::FairAcquire { client, age: 0 },
        other => other,
    });
    let network = &state.network;
    let in_flight = |client: u8| {
        network
            .iter()
            .any(|message| matches!(*message, Message::FairAcquire { client: sender, .. } if sender == client))
    };
    let may_send = |client: u8| {
        let client = clients[usize::from(client)];
        matches!(client.phase, Phase::Waiting { .. }) && client.requests_left > 0
    };
    state.server.queue.retain(|entry| entry.remaining > 0 || in_flight(entry.client) || may_send(entry.client));
}
