//! Checks the fenced-RedLock model: each rejected design has a counterexample,
//! the shipped design has none over a complete exploration.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::redlock::{
    FENCES_INCREASE, MUTUAL_EXCLUSION, NO_STALE_WRITE, RedlockModel, RedlockVariant, THIRD_GRANT_REACHED,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::Checker;

/// Searches `variant` breadth-first (so each counterexample is a shortest one)
/// until every property in `expected` is violated; prints each counterexample
/// and asserts that all were found.
fn assert_counterexamples(variant: RedlockVariant, expected: &[&'static str]) {
    assert_counterexamples_in(RedlockModel::new(variant), expected);
}

/// [`assert_counterexamples`] for a model configured by the caller.
fn assert_counterexamples_in(model: RedlockModel, expected: &[&'static str]) {
    let label = format!("redlock {:?}", model.variant);
    let searched = model.clone().over_representatives();
    assert_shortest_counterexamples(&model, searched, RedlockModel::representative, &label, expected);
}

#[test]
fn a_naive_max_fence_goes_backwards() {
    assert_counterexamples(RedlockVariant::NaiveMaxFence, &[FENCES_INCREASE, NO_STALE_WRITE]);
}

#[test]
fn b_overwriting_write_back_lowers_a_counter() {
    assert_counterexamples(RedlockVariant::OverwritingWriteBack, &[FENCES_INCREASE, NO_STALE_WRITE]);
}

#[test]
fn c_validity_before_write_back_lets_the_fence_go_backwards() {
    assert_counterexamples(RedlockVariant::ValidityBeforeWriteBack, &[FENCES_INCREASE, NO_STALE_WRITE]);
}

#[test]
fn d_shipped_design_holds_over_a_complete_exploration() {
    let started = Instant::now();
    let model = RedlockModel::new(RedlockVariant::Shipped);
    assert!(model.floors > 0, "the shipped design sends floors: explore them");
    let checker = model.symmetric_checker().threads(holdfast_models::exploration_threads()).spawn_dfs().join();
    println!(
        "redlock Shipped (floors 0..={}): complete={} unique states={} (one per symmetry class) in {:.1?}",
        RedlockModel::new(RedlockVariant::Shipped).floors,
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    assert!(checker.unique_state_count() > 1_000_000);
    for property in [MUTUAL_EXCLUSION, FENCES_INCREASE, NO_STALE_WRITE] {
        assert!(checker.discovery(property).is_none(), "{property} violated");
    }
    // The exploration covers what the fence hazards need.
    assert!(checker.discovery(THIRD_GRANT_REACHED).is_some());
}

#[test]
fn e_a_store_restarting_without_persistence_breaks_exclusion() {
    assert_counterexamples(RedlockVariant::ShippedWithRestart, &[MUTUAL_EXCLUSION, FENCES_INCREASE]);
}

#[test]
fn f_shipped_design_without_the_drift_margin_breaks_exclusion() {
    // The validity must subtract the drift: with a store clock running a tick
    // fast, a key expires while its holder still counts on it. Two attempts
    // are enough for that and keep the search short.
    let model = RedlockModel { drift_margin: 0, attempts: 2, floors: 0, ..RedlockModel::new(RedlockVariant::Shipped) };
    assert_counterexamples_in(model, &[MUTUAL_EXCLUSION]);
}

#[test]
fn g_skipping_the_write_back_on_the_clients_belief_lets_the_fence_go_backwards() {
    // The client sent a floor and skips the write-back, believing every
    // member's counter was below it; a stale floor leaves a member behind.
    // Floors 0 and 1 are enough for it (and keep the search short).
    let model = RedlockModel { floors: 1, ..RedlockModel::new(RedlockVariant::ClientTrustsFloor) };
    assert_counterexamples_in(model, &[FENCES_INCREASE, NO_STALE_WRITE]);
}

#[test]
fn h_a_store_that_sets_its_counter_to_the_floor_repeats_a_fence() {
    // `counter = floor` instead of `max(counter + 1, floor)`: a floor at or
    // below the counter issues a fence already granted.
    let model = RedlockModel { floors: 1, ..RedlockModel::new(RedlockVariant::FloorSetsCounter) };
    assert_counterexamples_in(model, &[FENCES_INCREASE, NO_STALE_WRITE]);
}
