//! Checks the fair hand-off model: today's protocol (the head claims) and the
//! fence-checked hand-off have no counterexample over a complete exploration;
//! every other way of counting a waiter granted from the hand-off message,
//! including the proposal as first written (`Shipped`), grants twice.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::collections::BTreeSet;
use std::time::Instant;

use holdfast_models::fair_handoff::{
    FENCES_INCREASE, FairModel, FairVariant, HAND_OFF_GRANT_REACHED, MUTUAL_EXCLUSION,
};
use holdfast_models::trace::concrete_trace;
use stateright::{Checker, HasDiscoveries, Model};

/// Searches `model` breadth-first over symmetry representatives (so each
/// counterexample is a shortest one) until every property in `expected` is
/// violated; prints each counterexample as a concrete run and asserts that all
/// were found.
fn assert_counterexamples(model: FairModel, label: &str, expected: &[&'static str]) {
    let started = Instant::now();
    let checker = model
        .clone()
        .over_representatives()
        .checker()
        .finish_when(HasDiscoveries::AllOf(expected.iter().copied().collect::<BTreeSet<_>>()))
        .spawn_bfs()
        .join();
    println!("fair {label}: searched {} states in {:.1?}", checker.unique_state_count(), started.elapsed());
    for property in expected {
        let trace = checker.discovery(property).map(|path| concrete_trace(&model, &path, FairModel::representative));
        match trace {
            Some(Some(trace)) => println!("fair {label}: counterexample to \"{property}\":\n{trace}"),
            Some(None) => panic!("{label}: the counterexample does not replay"),
            None => panic!("{label}: no counterexample to {property}"),
        }
    }
}

/// Explores `variant` completely (depth-first, one state per symmetry class)
/// and asserts that no property is violated.
fn assert_no_counterexample(variant: FairVariant) -> impl Checker<FairModel> {
    let started = Instant::now();
    let checker = FairModel::new(variant).symmetric_checker().spawn_dfs().join();
    println!(
        "fair {variant:?}: complete={} unique states={} (one per symmetry class) in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    for property in [MUTUAL_EXCLUSION, FENCES_INCREASE] {
        assert!(checker.discovery(property).is_none(), "{variant:?}: {property} violated");
    }
    checker
}

#[test]
fn a_claim_on_every_hand_off_holds_over_a_complete_exploration() {
    assert_no_counterexample(FairVariant::ClaimEveryHandOff);
}

#[test]
fn b_validity_from_receipt_grants_twice() {
    assert_counterexamples(FairModel::new(FairVariant::FromReceipt), "FromReceipt", &[MUTUAL_EXCLUSION]);
}

#[test]
fn c_validity_from_the_latest_send_grants_twice() {
    assert_counterexamples(FairModel::new(FairVariant::FromLatestSend), "FromLatestSend", &[MUTUAL_EXCLUSION]);
}

#[test]
fn d_validity_ignoring_the_queue_ttl_grants_twice() {
    assert_counterexamples(FairModel::new(FairVariant::IgnoresQueueTtl), "IgnoresQueueTtl", &[MUTUAL_EXCLUSION]);
}

#[test]
fn e_the_proposal_takes_a_stale_hand_off_message() {
    // The proposal as written: a hand-off message older than the "queued"
    // reply it is measured from still grants.
    let model = FairModel::new(FairVariant::Shipped);
    assert_counterexamples(model, "Shipped", &[MUTUAL_EXCLUSION, FENCES_INCREASE]);
}

#[test]
fn e_the_proposal_grants_twice_without_any_drift() {
    // The same hazard with no clock drift at all (and no margin, so that the
    // window is two ticks): the stale message is the cause, not the drift.
    let model = FairModel { drift: 0, drift_margin: 0, ..FairModel::new(FairVariant::Shipped) };
    assert_counterexamples(model, "Shipped, drift 0, margin 0", &[MUTUAL_EXCLUSION]);
}

#[test]
fn f_fence_checked_without_the_drift_margin_grants_twice() {
    let model = FairModel { drift_margin: 0, ..FairModel::new(FairVariant::FenceChecked) };
    assert_counterexamples(model, "FenceChecked, margin 0", &[MUTUAL_EXCLUSION]);
}

#[test]
fn g_fence_checked_hand_off_holds_over_a_complete_exploration() {
    let checker = assert_no_counterexample(FairVariant::FenceChecked);
    // Waiters do count themselves granted from the message in this space.
    assert!(checker.discovery(HAND_OFF_GRANT_REACHED).is_some());
}
