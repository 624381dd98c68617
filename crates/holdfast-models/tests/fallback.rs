//! Checks the fallback-chain model: the naive chain, an epoch switch
//! without a wait, and a mode read from a counter other tenants of the
//! arbiter share grant twice; the shipped construction never does, over a
//! complete exploration.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::collections::BTreeSet;
use std::time::Instant;

use holdfast_models::fallback::{
    FENCES_INCREASE, FallbackModel, FallbackVariant, GRANT_AFTER_SWITCH_REACHED, MUTUAL_EXCLUSION,
};
use holdfast_models::trace::readable_trace;
use stateright::{Checker, HasDiscoveries, Model};

/// Searches `variant` breadth-first (shortest counterexample first) until
/// `property` is violated; prints the counterexample and asserts it exists.
fn assert_counterexample(variant: FallbackVariant, property: &'static str) {
    let started = Instant::now();
    let checker = FallbackModel::new(variant)
        .checker()
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    println!("fallback {variant:?}: searched {} states in {:.1?}", checker.unique_state_count(), started.elapsed());
    let path = checker.discovery(property);
    if let Some(path) = &path {
        println!("fallback {variant:?}: counterexample to \"{property}\":\n{}", readable_trace(path));
    }
    assert!(path.is_some(), "{variant:?}: no counterexample to {property}");
}

#[test]
fn naive_chain_grants_twice() {
    assert_counterexample(FallbackVariant::NaiveChain, MUTUAL_EXCLUSION);
}

#[test]
fn epoch_switch_without_a_wait_grants_twice() {
    assert_counterexample(FallbackVariant::EpochWithoutWait, MUTUAL_EXCLUSION);
}

#[test]
fn a_mode_read_from_a_counter_other_tenants_share_grants_twice() {
    assert_counterexample(FallbackVariant::SharedCounter, MUTUAL_EXCLUSION);
}

#[test]
fn shipped_construction_holds_over_a_complete_exploration() {
    let started = Instant::now();
    let checker = FallbackModel::new(FallbackVariant::Shipped)
        .symmetric_checker()
        .threads(holdfast_models::exploration_threads())
        .spawn_dfs()
        .join();
    println!(
        "fallback Shipped: complete={} unique states={} (one per symmetry class) in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    assert!(checker.unique_state_count() > 1_000_000);
    for property in [MUTUAL_EXCLUSION, FENCES_INCREASE] {
        assert!(checker.discovery(property).is_none(), "{property} violated");
    }
    // The exploration covers what the properties are about.
    assert!(checker.discovery(GRANT_AFTER_SWITCH_REACHED).is_some());
}
