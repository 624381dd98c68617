//! Checks the pooled-loss model: behind a pooler, where the lost
//! connection's backend cannot be ended, rotating the client's session
//! (`s_old` retiring at the loss, a wait for the attempts in flight under
//! it, the held rows migrated to `s_new`, then `s_old` ended; a regrant
//! moving a row only from a session retiring when its attempt was sent)
//! leaves a late grant free to every client and keeps every lease A
//! holds; the cleanup release alone, ending `s_old` without migrating,
//! migrating without waiting, ending before migrating, a regrant that
//! keeps its row's session and one that always moves it each fail.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::sql_pooled_loss::{
    CLEANUP_DELETED, ENDS_FREE, Key, LATE_REGRANT, LATE_TAKEN_OVER, NO_DOUBLE_HOLDING, NO_REVIVAL, PooledLossModel,
    PooledLossVariant, RETRY_REGRANTED, S2_MIGRATED,
};
use holdfast_models::trace::{readable_trace, shortest_counterexample};
use stateright::{Checker, Model};

/// Explores `variant` completely, breadth-first, on every core; returns
/// the checker and its unique state count.
fn explore(variant: PooledLossVariant) -> (impl Checker<PooledLossModel>, usize) {
    let started = Instant::now();
    let checker =
        PooledLossModel { variant }.checker().threads(holdfast_models::exploration_threads()).spawn_bfs().join();
    let states = checker.unique_state_count();
    println!(
        "sql_pooled_loss {variant:?}: complete={} unique states={states} in {:.1?}",
        checker.is_done(),
        started.elapsed()
    );
    assert!(checker.is_done(), "{variant:?}: not complete");
    (checker, states)
}

#[test]
fn a_rotating_the_session_frees_a_late_grant_and_keeps_every_lease() {
    let (checker, states) = explore(PooledLossVariant::Rotate);
    for property in [NO_DOUBLE_HOLDING, NO_REVIVAL, ENDS_FREE] {
        assert!(checker.discovery(property).is_none(), "Rotate: {property} violated");
    }
    for reached in [LATE_TAKEN_OVER, CLEANUP_DELETED, RETRY_REGRANTED, LATE_REGRANT, S2_MIGRATED] {
        assert!(checker.discovery(reached).is_some(), "Rotate: never \"{reached}\"");
    }
    assert_eq!(states, 1795, "Rotate: state count");
}

/// A shortest counterexample to `property` in `variant`: prints it,
/// checks that its last state breaks `property` on `key` (for
/// [`NO_DOUBLE_HOLDING`]), and returns its length in steps.
fn shortest(variant: PooledLossVariant, property: &'static str, key: Option<Key>) -> usize {
    let model = PooledLossModel { variant };
    let Some(path) = shortest_counterexample(&model, property, 24) else {
        panic!("{variant:?}: no counterexample to {property}")
    };
    let steps = path.clone().into_actions().len();
    println!(
        "sql_pooled_loss {variant:?}: {steps} steps to a counterexample to \"{property}\":\n{}",
        readable_trace(&path)
    );
    if key.is_some() {
        assert_eq!(path.last_state().double_held(), key, "{variant:?}: the key held twice");
    }
    steps
}

#[test]
fn b_the_cleanup_release_alone_leaves_a_late_grant_held() {
    assert_eq!(shortest(PooledLossVariant::NoRotation, NO_REVIVAL, None), 5);
    assert_eq!(shortest(PooledLossVariant::NoRotation, ENDS_FREE, None), 7);
}

#[test]
fn c_ending_s_old_without_migrating_frees_a_held_lease() {
    assert_eq!(shortest(PooledLossVariant::EndWithoutMigrating, NO_DOUBLE_HOLDING, Some(Key::K2)), 4);
}

#[test]
fn d_migrating_without_waiting_misses_an_attempt_in_flight() {
    assert_eq!(shortest(PooledLossVariant::MigrateWithoutWaiting, NO_DOUBLE_HOLDING, Some(Key::K3)), 6);
}

#[test]
fn e_ending_s_old_before_migrating_frees_a_held_lease() {
    assert_eq!(shortest(PooledLossVariant::EndBeforeMigrating, NO_DOUBLE_HOLDING, Some(Key::K2)), 4);
}

#[test]
fn f_a_regrant_that_keeps_its_session_is_ended_with_s_old() {
    assert_eq!(shortest(PooledLossVariant::RegrantKeepsSession, NO_DOUBLE_HOLDING, Some(Key::K)), 10);
}

#[test]
fn g_a_late_regrant_that_moves_the_row_back_to_s_old_is_ended_with_it() {
    assert_eq!(shortest(PooledLossVariant::AnyRegrantMoves, NO_DOUBLE_HOLDING, Some(Key::K)), 10);
}
