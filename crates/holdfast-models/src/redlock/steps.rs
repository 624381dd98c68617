//! The fenced-RedLock model's transitions: what each node does with each event.

use crate::clock::{count_down, count_up};

use super::state::{MAJORITY, Message, Phase, RedlockState, STORES, Store};
use super::{RedlockAction, RedlockModel, RedlockVariant};

/// The state after `action`, or `None` when the action changes nothing.
pub fn next_state(model: &RedlockModel, state: &RedlockState, action: RedlockAction) -> Option<RedlockState> {
    let mut next = state.clone();
    match action {
        RedlockAction::Tick => {
            for store in &mut next.stores {
                count_down(&mut store.remaining);
            }
            for phase in &mut next.clients {
                match phase {
                    Phase::Idle => {}
                    Phase::Acquiring { elapsed, .. } | Phase::WritingBack { elapsed, .. } => {
                        count_up(elapsed, model.validity());
                    }
                    Phase::Holding { remaining, .. } => count_down(remaining),
                }
            }
        }
        RedlockAction::StoreClockRunsAhead(store) => {
            let store = &mut next.stores[usize::from(store)];
            store.clock.run_ahead();
            count_down(&mut store.remaining);
        }
        RedlockAction::StartAttempt(client, floor) => {
            next.attempts_left = next.attempts_left.checked_sub(1)?;
            let trusts_floor = floor > 0 && model.variant.trusts_its_floor();
            next.clients[usize::from(client)] = Phase::Acquiring { elapsed: 0, granted: [None; STORES], trusts_floor };
            for store in 0..STORES as u8 {
                next.network.send(Message::Acquire { from: Some(client), store, floor });
            }
        }
        RedlockAction::Deliver(message) => {
            if !next.network.take(&message) {
                return None;
            }
            deliver(model, &mut next, message);
        }
        RedlockAction::RestartStore(store) => {
            let store = &mut next.stores[usize::from(store)];
            // Everything in memory is gone; the clock keeps running at its rate.
            *store = Store { clock: store.clock, ..Store::default() };
            next.restarted = true;
        }
    }
    normalize(model, &mut next);
    (next != *state).then_some(next)
}

fn deliver(model: &RedlockModel, state: &mut RedlockState, message: Message) {
    match message {
        Message::Acquire { from, store, floor } => {
            let entry = &mut state.stores[usize::from(store)];
            if entry.remaining == 0 {
                entry.remaining = model.ttl;
                entry.counter = if model.variant.floor_sets_counter() && floor > 0 {
                    floor
                } else {
                    (entry.counter + 1).max(floor)
                };
                if let Some(client) = from {
                    let counter = entry.counter;
                    state.network.send(Message::AcquireReply { client, store, counter });
                }
            }
        }
        Message::AcquireReply { client, store, counter } => receive_grant(model, state, client, store, counter),
        Message::WriteBack { from, store, fence } => {
            let entry = &mut state.stores[usize::from(store)];
            entry.counter = if model.variant.write_back_overwrites() { fence } else { entry.counter.max(fence) };
            if let Some(client) = from {
                state.network.send(Message::WriteBackAck { client, store });
            }
        }
        Message::WriteBackAck { client, store } => receive_ack(model, state, client, store),
        Message::RegisterWrite { grant, fence } => {
            state.register.write(fence, grant);
        }
    }
}

fn receive_grant(model: &RedlockModel, state: &mut RedlockState, client: u8, store: u8, counter: u8) {
    let Phase::Acquiring { elapsed, granted, trusts_floor } = &mut state.clients[usize::from(client)] else {
        return;
    };
    let (elapsed, trusts_floor) = (*elapsed, *trusts_floor);
    granted[usize::from(store)] = Some(counter);
    let granted = *granted;
    if granted.iter().flatten().count() < MAJORITY {
        return;
    }
    // The majority is in: the fence is the highest counter among it.
    let fence = granted.iter().flatten().copied().max().unwrap_or(0);
    if trusts_floor {
        // (g): it sent a floor and believes every member answered it.
        hold_if_valid(model, state, client, elapsed, fence);
        return;
    }
    // A member whose answer was the fence stands at it already: no write to
    // it, and it counts as acknowledged (as `complete` skips it).
    let skip = model.variant.skips_members_at_the_fence();
    let written = granted.map(|grant| grant.is_some_and(|counter| !skip || counter < fence));
    let acked = granted.map(|grant| skip && grant == Some(fence));
    let write_back = |state: &mut RedlockState| {
        for store in 0..STORES as u8 {
            if written[usize::from(store)] {
                state.network.send(Message::WriteBack { from: Some(client), store, fence });
            }
        }
    };
    if model.variant.writes_back_before_holding() {
        if acked.iter().filter(|ack| **ack).count() >= MAJORITY {
            // The majority answered alike (the floor was above its counters):
            // nothing to write back, one round.
            hold_if_valid(model, state, client, elapsed, fence);
            return;
        }
        write_back(state);
        state.clients[usize::from(client)] = Phase::WritingBack { elapsed, fence, written, acked };
        return;
    }
    let holds = hold_if_valid(model, state, client, elapsed, fence);
    if holds && model.variant == RedlockVariant::ValidityBeforeWriteBack {
        write_back(state);
    }
}

fn receive_ack(model: &RedlockModel, state: &mut RedlockState, client: u8, store: u8) {
    let Phase::WritingBack { elapsed, fence, acked, .. } = &mut state.clients[usize::from(client)] else {
        return;
    };
    acked[usize::from(store)] = true;
    if acked.iter().filter(|ack| **ack).count() < MAJORITY {
        return;
    }
    let (elapsed, fence) = (*elapsed, *fence);
    hold_if_valid(model, state, client, elapsed, fence);
}

/// The client counts itself granted if its validity is left; returns whether.
fn hold_if_valid(model: &RedlockModel, state: &mut RedlockState, client: u8, elapsed: u8, fence: u8) -> bool {
    let validity = model.validity();
    if elapsed >= validity {
        state.clients[usize::from(client)] = Phase::Idle;
        return false;
    }
    let grant = state.grants.record(fence);
    state.clients[usize::from(client)] = Phase::Holding { remaining: validity - elapsed, fence, grant };
    // The holder writes to the register now. Writing later within its belief
    // is the same to the register as this write delivered later, which the
    // network already allows, so one write per grant, sent at once, covers it.
    state.network.send(Message::RegisterWrite { grant, fence });
    true
}

/// Collapses states that differ only in ways no node can act on: lapsed
/// beliefs and hopeless attempts are idle clients, replies their receiver
/// would ignore are gone, and requests nobody waits for are anonymous.
fn normalize(model: &RedlockModel, state: &mut RedlockState) {
    let validity = model.validity();
    for phase in &mut state.clients {
        let over = match *phase {
            Phase::Idle => false,
            Phase::Acquiring { elapsed, .. } | Phase::WritingBack { elapsed, .. } => elapsed >= validity,
            Phase::Holding { remaining, .. } => remaining == 0,
        };
        if over {
            *phase = Phase::Idle;
        }
    }
    let clients = state.clients;
    let phase_of = |client: u8| clients[usize::from(client)];
    state.network.retain(|message| match *message {
        Message::AcquireReply { client, store, .. } => matches!(phase_of(client),
            Phase::Acquiring { granted, .. } if granted[usize::from(store)].is_none()),
        Message::WriteBackAck { client, store } => matches!(phase_of(client),
            Phase::WritingBack { acked, .. } if !acked[usize::from(store)]),
        _ => true,
    });
    state.network.rewrite(|message| match message {
        Message::Acquire { from: Some(client), store, floor }
            if !matches!(phase_of(client), Phase::Acquiring { .. }) =>
        {
            Message::Acquire { from: None, store, floor }
        }
        Message::WriteBack { from: Some(client), store, fence }
            if !matches!(phase_of(client), Phase::WritingBack { .. }) =>
        {
            Message::WriteBack { from: None, store, fence }
        }
        other => other,
    });
}
