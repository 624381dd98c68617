//! Checks the ZooKeeper join model (issue 33): a new queue node that learns
//! it is first from the parent's child count inside its create's
//! transaction (the shipped design), like one that lists the queue behind
//! the create (the design before), has no counterexample over a complete
//! exploration; each rejected variant has one.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::trace::assert_shortest_counterexamples;
use holdfast_models::zk_join::{
    FENCES_INCREASE, GRANT_AFTER_RECREATE, GRANT_AT_HEAD, GRANT_FROM_REPLY, JoinModel, JoinVariant, MUTUAL_EXCLUSION,
};
use stateright::{Checker, Model};

fn assert_sound(variant: JoinVariant) -> usize {
    let started = Instant::now();
    let checker = JoinModel::new(variant).checker().spawn_dfs().join();
    println!(
        "zk_join {variant:?}: complete={} unique states={} in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    for property in [MUTUAL_EXCLUSION, GRANT_AT_HEAD, FENCES_INCREASE] {
        assert!(checker.discovery(property).is_none(), "{variant:?}: {property} violated");
    }
    assert!(checker.discovery(GRANT_AFTER_RECREATE).is_some(), "{variant:?}: no grant in a recreated parent");
    usize::from(checker.discovery(GRANT_FROM_REPLY).is_some())
}

fn assert_counterexamples(variant: JoinVariant, expected: &[&'static str]) {
    let model = JoinModel::new(variant);
    assert_shortest_counterexamples(&model, model.clone(), Clone::clone, &format!("zk_join {variant:?}"), expected);
}

#[test]
fn a_the_count_in_the_creates_transaction_holds_over_a_complete_exploration() {
    assert_eq!(assert_sound(JoinVariant::Shipped), 1, "no grant was ever decided from the join's reply");
}

#[test]
fn b_a_listing_behind_every_create_holds_too() {
    assert_eq!(assert_sound(JoinVariant::Listed), 0, "the listing design decided a grant without a listing");
}

#[test]
fn c_a_sequence_number_two_past_the_last_grants_twice_in_a_recreated_parent() {
    assert_counterexamples(JoinVariant::SeqFromMemory, &[MUTUAL_EXCLUSION, GRANT_AT_HEAD]);
}

#[test]
fn d_a_count_read_after_the_create_grants_a_node_that_is_gone() {
    assert_counterexamples(JoinVariant::StatAfterCreate, &[GRANT_AT_HEAD]);
}
