//! Checks the SQL late-statement model: a client that ends the lost
//! connection's backend and waits until the server reports it gone, before
//! it sends any further statement (the design to ship), never leaves a
//! grant nobody tracks; releasing at once (the code before), after a cancel
//! request, or after a termination it does not wait for, fencing only the
//! lost connection's slot while the release may take another (MySQL's
//! pool), or fencing the release but not a retry of the `try_acquire`,
//! each leaves A1's token holding the key after A is done with it.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::sql_late_statement::{
    ABORTED_WAITING, COMMIT_BEFORE_EXIT, DELETED_LATE_GRANT, ENDS_FREE, Holder, LateStatementAction,
    LateStatementModel, LateStatementState, LateStatementVariant, NEVER_READ, NO_REVIVAL, ONE_HOLDER, RETRY_FOUND_OWN,
    Routing,
};
use holdfast_models::trace::{readable_trace, shortest_counterexample};
use stateright::{Checker, Model};

fn model(variant: LateStatementVariant, routing: Routing, signals_in_flight: bool) -> LateStatementModel {
    LateStatementModel { variant, routing, signals_in_flight }
}

/// Explores `model` completely, breadth-first; returns the checker and
/// its unique state count.
fn explore(model: LateStatementModel) -> (impl Checker<LateStatementModel>, usize) {
    let label = format!("{:?}, {:?}, signals in flight: {}", model.variant, model.routing, model.signals_in_flight);
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    let states = checker.unique_state_count();
    println!(
        "sql_late_statement {label}: complete={} unique states={states} in {:.1?}",
        checker.is_done(),
        started.elapsed()
    );
    assert!(checker.is_done(), "{label}: not complete");
    assert!(checker.discovery(ONE_HOLDER).is_none(), "{label}: {ONE_HOLDER} violated");
    (checker, states)
}

/// The shipped configurations: every property holds, every interesting
/// path is taken; `states` is the expected unique state count.
fn shipped(variant: LateStatementVariant, routing: Routing, signals_in_flight: bool, states: usize) {
    let (checker, found) = explore(model(variant, routing, signals_in_flight));
    for property in [NO_REVIVAL, ENDS_FREE] {
        assert!(checker.discovery(property).is_none(), "{variant:?} {routing:?}: {property} violated");
    }
    for reached in [DELETED_LATE_GRANT, ABORTED_WAITING, NEVER_READ, COMMIT_BEFORE_EXIT, RETRY_FOUND_OWN] {
        assert!(checker.discovery(reached).is_some(), "{variant:?} {routing:?}: never \"{reached}\"");
    }
    assert!(
        states == 0 || found == states,
        "{variant:?} {routing:?} (signals in flight: {signals_in_flight}): state count"
    );
}

#[test]
fn a_ending_the_backend_and_waiting_until_it_is_gone_leaves_no_grant_behind() {
    // MySQL/MariaDB: the fence before any statement, on any slot.
    shipped(LateStatementVariant::EndThenWait, Routing::AnySlot, false, 132);
    shipped(LateStatementVariant::EndThenWait, Routing::AnySlot, true, 182);
    // PostgreSQL: the fence before the next statement on the key's slot,
    // which the key's statements always take.
    shipped(LateStatementVariant::FenceOwnSlot, Routing::KeySlot, false, 132);
    shipped(LateStatementVariant::FenceOwnSlot, Routing::KeySlot, true, 182);
}

/// A shortest counterexample to `property`: breadth-first searches bounded
/// one step deeper each time. Prints it and returns its length in steps.
fn shortest(model: &LateStatementModel, property: &'static str) -> usize {
    let Some(path) = shortest_counterexample(model, property, 24) else {
        panic!("{:?}: no counterexample to {property}", model.variant)
    };
    let steps = path.clone().into_actions().len();
    println!(
        "sql_late_statement {:?} {:?} (signals in flight: {}): {steps} steps to a counterexample to \"{property}\":\n{}",
        model.variant,
        model.routing,
        model.signals_in_flight,
        readable_trace(&path)
    );
    steps
}

/// `variant` (any slot) breaks `NO_REVIVAL` and `ENDS_FREE` in at least
/// the given steps, with signals acting when sent and in flight alike.
fn counterexamples(variant: LateStatementVariant, no_revival: usize, ends_free: usize) {
    for signals_in_flight in [false, true] {
        let model = model(variant, Routing::AnySlot, signals_in_flight);
        assert_eq!(shortest(&model, NO_REVIVAL), no_revival, "{variant:?}: steps to {NO_REVIVAL}");
        assert_eq!(shortest(&model, ENDS_FREE), ends_free, "{variant:?}: steps to {ENDS_FREE}");
        // Nothing else breaks: nobody counts itself the holder wrongly.
        explore(model);
    }
}

#[test]
fn b_a_release_at_once_misses_a_statement_applied_after_it() {
    counterexamples(LateStatementVariant::PlainRelease, 5, 6);
    // As short: released while S is still in the network.
    use LateStatementAction as A;
    let model = model(LateStatementVariant::PlainRelease, Routing::AnySlot, false);
    let steps = [A::Lose, A::Release(1), A::ThirdPartyEnds, A::Deliver, A::Commit];
    assert!(replay(&model, &steps).revived(), "the statement read after the release granted nothing");
}

/// Runs `actions` from the initial state with the key free (each must be
/// enabled) and returns the state reached.
fn replay(model: &LateStatementModel, actions: &[LateStatementAction]) -> LateStatementState {
    let mut state = model.init_states().into_iter().find(|s| s.key == Holder::Free).expect("a free key");
    println!("sql_late_statement {:?}: replayed:\nstart: {state}", model.variant);
    for (step, action) in actions.iter().enumerate() {
        let mut enabled = Vec::new();
        model.actions(&state, &mut enabled);
        assert!(enabled.contains(action), "{:?}: step {} ({action}) not enabled", model.variant, step + 1);
        state = model.next_state(&state, *action).expect("a successor");
        println!("{:>2}. {action}\n    -> {state}", step + 1);
    }
    state
}

#[test]
fn c_a_cancel_request_misses_a_statement_not_yet_read_or_committing() {
    // The shortest: the cancel arrives while S commits, and is ignored.
    counterexamples(LateStatementVariant::CancelRequest, 6, 7);
    // As short: the cancel arrives while S is still in the network.
    use LateStatementAction as A;
    let model = model(LateStatementVariant::CancelRequest, Routing::AnySlot, false);
    let steps = [A::Lose, A::SendSignal, A::Release(1), A::ThirdPartyEnds, A::Deliver, A::Commit];
    assert!(replay(&model, &steps).revived(), "the cancel stopped a statement it never saw");
}

#[test]
fn d_a_termination_not_waited_for_misses_a_commit_under_way() {
    counterexamples(LateStatementVariant::TerminateNoWait, 6, 7);
}

#[test]
fn e_fencing_only_the_lost_slot_misses_a_release_on_another_slot() {
    counterexamples(LateStatementVariant::FenceOwnSlot, 5, 6);
}

#[test]
fn f_fencing_the_release_but_not_the_retry_leaves_a_busy_answer_behind() {
    counterexamples(LateStatementVariant::RetryUnfenced, 6, 7);
}
