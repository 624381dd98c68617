//! Checks the local hand-over model (issue 33, item 2): the shipped design
//! (the store checks the releaser's unexpired lease, a new fence, at most
//! `bound` hand-overs in a row; the waiter counts the lease from the
//! releaser's send; after a call without a reply the releaser's own release
//! comes before anything it tells the waiter) has no counterexample over a
//! complete exploration; each rejected variant has one.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::handover::{
    BOUND_REFUSES, BOUNDED_BYPASS, FENCES_INCREASE, HAND_OVER_HAPPENS, HandOverModel, HandOverVariant,
    MUTUAL_EXCLUSION, NO_LEAKED_GRANT,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

fn assert_counterexamples(variant: HandOverVariant, expected: &[&'static str]) {
    let model = HandOverModel::new(variant);
    assert_shortest_counterexamples(&model, model.clone(), Clone::clone, &format!("handover {variant:?}"), expected);
}

#[test]
fn a_the_shipped_hand_over_holds_over_a_complete_exploration() {
    let started = Instant::now();
    let checker = HandOverModel::new(HandOverVariant::Shipped).checker().spawn_dfs().join();
    println!(
        "handover Shipped: complete={} unique states={} in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    for property in [MUTUAL_EXCLUSION, FENCES_INCREASE, NO_LEAKED_GRANT, BOUNDED_BYPASS] {
        assert!(checker.discovery(property).is_none(), "Shipped: {property} violated");
    }
    assert!(checker.discovery(HAND_OVER_HAPPENS).is_some(), "no hand-over ever reached a task");
    assert!(checker.discovery(BOUND_REFUSES).is_some(), "the bound never refused a hand-over");
}

#[test]
fn b_without_a_bound_another_process_is_passed_over() {
    assert_counterexamples(HandOverVariant::NoBound, &[BOUNDED_BYPASS]);
}

#[test]
fn c_without_the_lease_check_a_released_lock_is_handed_on() {
    assert_counterexamples(HandOverVariant::NoLeaseCheck, &[NO_LEAKED_GRANT]);
}

#[test]
fn d_keeping_the_fence_breaks_fence_order() {
    assert_counterexamples(HandOverVariant::KeepFence, &[FENCES_INCREASE]);
}

#[test]
fn e_a_lease_counted_from_the_reply_grants_twice() {
    assert_counterexamples(HandOverVariant::LeaseFromReply, &[MUTUAL_EXCLUSION]);
}

#[test]
fn f_telling_the_waiter_before_the_own_release_leaks_a_grant() {
    assert_counterexamples(HandOverVariant::TellBeforeRelease, &[NO_LEAKED_GRANT]);
}
