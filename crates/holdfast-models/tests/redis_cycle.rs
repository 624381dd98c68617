//! Checks the lock-hash model (issue 33): the layout the Redis store keeps
//! (a clock fence, the hash kept `fence_keep` past every lease, renewal
//! moving its expiry, release checking the clock) has no counterexample over
//! a complete exploration; each cheaper layout weighed against it has one.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::redis_cycle::{
    CycleModel, CycleVariant, FENCES_INCREASE, GRANT_AFTER_EXPIRY, MUTUAL_EXCLUSION, RELEASE_TELLS_THE_TRUTH,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

fn assert_counterexamples(variant: CycleVariant, expected: &[&'static str]) {
    let model = CycleModel::new(variant);
    assert_shortest_counterexamples(&model, model.clone(), Clone::clone, &format!("redis_cycle {variant:?}"), expected);
}

#[test]
fn a_the_shipped_layout_holds_over_a_complete_exploration() {
    let started = Instant::now();
    let checker = CycleModel::new(CycleVariant::Shipped).checker().spawn_dfs().join();
    println!(
        "redis_cycle Shipped: complete={} unique states={} in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    for property in [MUTUAL_EXCLUSION, FENCES_INCREASE, RELEASE_TELLS_THE_TRUTH] {
        assert!(checker.discovery(property).is_none(), "Shipped: {property} violated");
    }
    assert!(checker.discovery(GRANT_AFTER_EXPIRY).is_some(), "the hash never expired before a grant");
}

#[test]
fn b_a_counter_fence_goes_back_when_the_hash_expires() {
    assert_counterexamples(CycleVariant::CounterFence, &[FENCES_INCREASE]);
}

#[test]
fn c_a_hash_as_long_as_the_lease_loses_the_fence_to_a_clock_step() {
    assert_counterexamples(CycleVariant::LeaseLongHash, &[FENCES_INCREASE]);
}

#[test]
fn d_renewal_without_pexpireat_grants_twice() {
    assert_counterexamples(CycleVariant::RenewWithoutExpiry, &[MUTUAL_EXCLUSION]);
}

#[test]
fn e_a_release_without_the_clock_hides_a_lost_lease() {
    assert_counterexamples(CycleVariant::ReleaseWithoutClock, &[RELEASE_TELLS_THE_TRUTH]);
}
