//! Checks the share lanes model (issue 33): shared waiters of one process
//! asking the store side by side, where a waiter granted after a refusal
//! passes a wake-up on (the shipped design), like the one local head before
//! it, has no counterexample over a complete exploration; without the
//! passed-on wake-up a waiter sleeps beside free room.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::share_lanes::{
    ALL_SERVED, CASCADE_GRANTS, LanesModel, LanesVariant, NO_SLEEP_BESIDE_ROOM, WITHIN_LIMIT,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

fn assert_sound(variant: LanesVariant) -> bool {
    let started = Instant::now();
    let checker = LanesModel::new(variant).checker().spawn_dfs().join();
    println!(
        "share_lanes {variant:?}: complete={} unique states={} in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    for property in [WITHIN_LIMIT, NO_SLEEP_BESIDE_ROOM, ALL_SERVED] {
        assert!(checker.discovery(property).is_none(), "{variant:?}: {property} violated");
    }
    checker.discovery(CASCADE_GRANTS).is_some()
}

#[test]
fn a_lanes_side_by_side_with_a_passed_on_wake_up_hold_over_a_complete_exploration() {
    assert!(assert_sound(LanesVariant::Shipped), "no passed-on wake-up ever led to a grant");
}

#[test]
fn b_one_lane_holds_too() {
    assert!(!assert_sound(LanesVariant::OneLane), "one lane passed a wake-up on");
}

#[test]
fn c_lanes_that_pass_nothing_on_leave_a_waiter_asleep_beside_free_room() {
    let model = LanesModel::new(LanesVariant::NoCascade);
    assert_shortest_counterexamples(
        &model,
        model.clone(),
        Clone::clone,
        "share_lanes NoCascade",
        &[NO_SLEEP_BESIDE_ROOM],
    );
}
