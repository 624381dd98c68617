//! The fallback-chain model's actions and transitions.

use crate::clock::{count_down, count_up};

use super::state::{ARBITER, FallbackState, Holding, Message, ModeLease, Pending, STORES};
use super::{FallbackAction, FallbackModel, FallbackVariant};

/// The actions enabled in `state`.
pub fn actions(model: &FallbackModel, state: &FallbackState, actions: &mut Vec<FallbackAction>) {
    actions.push(FallbackAction::Tick);
    for (index, store) in state.stores.iter().enumerate() {
        let timer_runs = store.holder.is_some() || (index == usize::from(ARBITER) && state.record.ready_in > 0);
        if timer_runs && store.clock.may_run_ahead(model.drift) {
            actions.push(FallbackAction::StoreClockRunsAhead(index as u8));
        }
    }
    let naive = model.variant == FallbackVariant::NaiveChain;
    for (index, client) in state.clients.iter().enumerate() {
        let client_id = index as u8;
        if client.pending.is_some() {
            actions.push(FallbackAction::TimeOut(client_id));
            continue;
        }
        if client.requests >= model.requests_per_client || client.holding.is_some() {
            continue;
        }
        let mode_valid = client.mode.is_some_and(|mode| mode.remaining > 0);
        if naive || mode_valid {
            actions.push(FallbackAction::SendAcquire(client_id));
        }
        if !naive {
            actions.push(FallbackAction::SendRead(client_id));
            if client.mode.is_some_and(|mode| mode.epoch < model.max_epoch) {
                actions.push(FallbackAction::SendSwitch(client_id));
            }
        }
    }
    if model.variant == FallbackVariant::SharedCounter && !state.tenant_moved && state.record.epoch < model.max_epoch {
        actions.push(FallbackAction::TenantMovesCounter);
    }
    for message in state.network.distinct() {
        actions.push(FallbackAction::Deliver(*message));
    }
}

/// The state after `action`, or `None` when it changes nothing.
pub fn next_state(model: &FallbackModel, state: &FallbackState, action: FallbackAction) -> Option<FallbackState> {
    let mut next = state.clone();
    match action {
        FallbackAction::Tick => {
            for store in 0..STORES {
                advance_store(&mut next, store);
            }
            for client in &mut next.clients {
                match &mut client.pending {
                    Some(Pending::Acquire { elapsed, .. } | Pending::Read { elapsed }) => {
                        count_up(elapsed, model.ttl.max(model.mode_lease));
                    }
                    None => {}
                }
                if let Some(mode) = &mut client.mode {
                    count_down(&mut mode.remaining);
                }
                if let Some(holding) = &mut client.holding {
                    count_down(&mut holding.remaining);
                }
            }
        }
        FallbackAction::StoreClockRunsAhead(store) => {
            let store = usize::from(store);
            next.stores[store].clock.run_ahead();
            advance_store(&mut next, store);
        }
        FallbackAction::SendAcquire(client) => {
            let entry = &mut next.clients[usize::from(client)];
            let store = match (model.variant, entry.mode) {
                (FallbackVariant::NaiveChain, _) => entry.next_store,
                (_, Some(mode)) => mode.active,
                (_, None) => return None,
            };
            let request = entry.requests;
            entry.requests += 1;
            entry.pending = Some(Pending::Acquire { store, elapsed: 0 });
            next.network.send(Message::Acquire { client, request, store });
        }
        FallbackAction::SendRead(client) => {
            let entry = &mut next.clients[usize::from(client)];
            let request = entry.requests;
            entry.requests += 1;
            entry.pending = Some(Pending::Read { elapsed: 0 });
            next.network.send(Message::ReadMode { client, request });
        }
        FallbackAction::SendSwitch(client) => {
            let entry = &mut next.clients[usize::from(client)];
            let mode = entry.mode?;
            entry.requests += 1;
            // The client believes the active store is down: it stops granting
            // from it and asks for the next one, then reads until that is ready.
            entry.mode = None;
            next.network.send(Message::Switch {
                client,
                from_epoch: mode.epoch,
                to_store: (mode.active + 1) % STORES as u8,
            });
        }
        FallbackAction::TenantMovesCounter => {
            // The counter now reads as a later epoch naming the other store,
            // at once: no wait for this chain's mode leases.
            next.tenant_moved = true;
            let record = &mut next.record;
            record.epoch += 1;
            record.active = (record.active + 1) % STORES as u8;
            record.ready_in = 0;
        }
        FallbackAction::TimeOut(client) => {
            let entry = &mut next.clients[usize::from(client)];
            if let Some(Pending::Acquire { store, .. }) = entry.pending.take() {
                if model.variant == FallbackVariant::NaiveChain {
                    // The naive chain's whole idea: no answer means "down", so
                    // the next store in the chain is asked.
                    entry.next_store = (store + 1).min(STORES as u8 - 1);
                }
            }
        }
        FallbackAction::Deliver(message) => {
            if !next.network.take(&message) {
                return None;
            }
            deliver(model, &mut next, message);
        }
    }
    normalize(model, &mut next);
    (next != *state).then_some(next)
}

fn advance_store(state: &mut FallbackState, store: usize) {
    count_down(&mut state.stores[store].remaining);
    if store == usize::from(ARBITER) {
        count_down(&mut state.record.ready_in);
    }
}

fn deliver(model: &FallbackModel, state: &mut FallbackState, message: Message) {
    match message {
        Message::Acquire { client, request, store } => {
            let entry = &mut state.stores[usize::from(store)];
            let counter = if entry.holder.is_none() {
                entry.holder = Some(client);
                entry.remaining = model.ttl;
                entry.counter += 1;
                Some(entry.counter)
            } else {
                None
            };
            state.network.send(Message::AcquireReply { client, request, counter });
        }
        Message::AcquireReply { client, counter: Some(counter), .. } => receive_grant(model, state, client, counter),
        Message::AcquireReply { .. } => {}
        Message::ReadMode { client, request } => {
            let record = state.record;
            state.network.send(Message::ModeReply {
                client,
                request,
                epoch: record.epoch,
                active: record.active,
                ready: record.ready_in == 0,
            });
        }
        Message::ModeReply { client, epoch, active, ready, .. } => {
            let entry = &mut state.clients[usize::from(client)];
            let Some(Pending::Read { elapsed }) = entry.pending.take() else {
                return;
            };
            // The lease counts from before the read was sent, less the drift.
            let lease = model.mode_lease.saturating_sub(model.drift);
            if ready && elapsed < lease {
                entry.mode = Some(ModeLease { epoch, active, remaining: lease - elapsed });
            }
        }
        Message::Switch { from_epoch, to_store, .. } => {
            let record = &mut state.record;
            if record.epoch == from_epoch {
                record.epoch += 1;
                record.active = to_store;
                record.ready_in = model.switch_wait();
            }
        }
    }
}

fn receive_grant(model: &FallbackModel, state: &mut FallbackState, client: u8, counter: u8) {
    let entry = &mut state.clients[usize::from(client)];
    let Some(Pending::Acquire { store, elapsed }) = entry.pending.take() else {
        return;
    };
    let validity = model.ttl.saturating_sub(model.drift);
    if elapsed >= validity {
        return;
    }
    let lock_left = validity - elapsed;
    let (remaining, fence) = match model.variant {
        // The naive chain's natural fence: a later store ranks above an earlier one.
        FallbackVariant::NaiveChain => (lock_left, (store, counter)),
        _ => match entry.mode {
            // The belief never outlives the mode lease it was granted under.
            Some(mode) if mode.remaining > 0 && mode.active == store => {
                (lock_left.min(mode.remaining), (mode.epoch, counter))
            }
            _ => return,
        },
    };
    entry.holding = Some(Holding { remaining, fence });
    state.grants.record(fence);
}

/// Collapses states no node can tell apart: expired keys are free, lapsed
/// beliefs are gone, hopeless requests are abandoned, ignored replies dropped.
fn normalize(model: &FallbackModel, state: &mut FallbackState) {
    for store in &mut state.stores {
        if store.remaining == 0 {
            store.holder = None;
        }
    }
    let validity = model.ttl.saturating_sub(model.drift);
    let lease = model.mode_lease.saturating_sub(model.drift);
    for client in &mut state.clients {
        if client.holding.is_some_and(|holding| holding.remaining == 0) {
            client.holding = None;
        }
        let hopeless = match client.pending {
            Some(Pending::Acquire { elapsed, .. }) => elapsed >= validity,
            Some(Pending::Read { elapsed }) => elapsed >= lease,
            None => false,
        };
        if hopeless {
            client.pending = None;
        }
    }
    let clients = state.clients;
    state.network.retain(|message| match *message {
        Message::AcquireReply { client, request, counter } => {
            let entry = &clients[usize::from(client)];
            counter.is_some() && entry.requests == request + 1 && matches!(entry.pending, Some(Pending::Acquire { .. }))
        }
        Message::ModeReply { client, request, .. } => {
            let entry = &clients[usize::from(client)];
            entry.requests == request + 1 && matches!(entry.pending, Some(Pending::Read { .. }))
        }
        _ => true,
    });
}
