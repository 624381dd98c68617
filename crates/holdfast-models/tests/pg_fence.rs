//! Checks the per-key fence model (issue 33 item 4): the shipped layout
//! (fences kept in the lease row, a retry when the snapshot's row is gone,
//! a sweep that raises the counter, old clients refused) has no
//! counterexample over a complete exploration; each variant weighed against
//! it has one.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times.

use std::time::Instant;

use holdfast_models::pg_fence::{
    FENCES_INCREASE, FenceModel, FenceVariant, GRANT_AFTER_SWEEP, Kind, MUTUAL_EXCLUSION, RETRIED,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

fn assert_counterexamples(model: FenceModel, expected: &[&'static str]) {
    let label = format!("pg_fence {:?}", model.variant);
    let searched = model.clone().checking(expected);
    assert_shortest_counterexamples(&model, searched, Clone::clone, &label, expected);
}

#[test]
fn a_the_shipped_layout_holds_over_a_complete_exploration() {
    let started = Instant::now();
    let checker = FenceModel::new(FenceVariant::Shipped).checker().spawn_dfs().join();
    println!(
        "pg_fence Shipped: complete={} unique states={} in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    for property in [MUTUAL_EXCLUSION, FENCES_INCREASE] {
        assert!(checker.discovery(property).is_none(), "Shipped: {property} violated");
    }
    assert!(checker.discovery(GRANT_AFTER_SWEEP).is_some(), "never granted after a sweep");
    assert!(checker.discovery(RETRIED).is_some(), "no acquire ever ran again");
}

#[test]
fn b_inserting_from_the_snapshot_fence_repeats_a_fence() {
    let model = FenceModel::new(FenceVariant::NoRetry).with_kinds(&[Kind::Exclusive, Kind::Exclusive], 3);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}

#[test]
fn c_a_grant_from_the_snapshot_row_repeats_a_fence() {
    let model = FenceModel::new(FenceVariant::SnapshotFence).with_kinds(&[Kind::Exclusive, Kind::Exclusive], 2);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}

#[test]
fn d_a_sweep_without_the_counter_raise_repeats_a_fence() {
    let model = FenceModel::new(FenceVariant::SweepWithoutRaise).with_kinds(&[Kind::Exclusive], 3);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}

#[test]
fn e_shares_from_the_counter_go_below_the_key_fence() {
    let model = FenceModel::new(FenceVariant::SharesFromCounter).with_kinds(&[Kind::Exclusive, Kind::Shared], 2);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}

#[test]
fn f_unguarded_old_clients_go_below_the_key_fence() {
    let model = FenceModel::new(FenceVariant::NoGuard).with_kinds(&[Kind::Exclusive, Kind::OldExclusive], 2);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}

#[test]
fn g_triggers_alone_leave_an_old_shared_client_below_the_key_fence() {
    let model = FenceModel::new(FenceVariant::TriggersOnly).with_kinds(&[Kind::Exclusive, Kind::OldShared], 2);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}

#[test]
fn h_triggers_alone_hold_for_old_exclusive_clients() {
    // Option (T) is sound for the old mutex statements alone: what sinks it
    // is the old shared transaction (test g).
    let model = FenceModel::new(FenceVariant::TriggersOnly).with_kinds(&[Kind::Exclusive, Kind::OldExclusive], 2);
    let checker = model.checker().spawn_dfs().join();
    assert!(checker.is_done());
    assert!(checker.discovery(FENCES_INCREASE).is_none());
    assert!(checker.discovery(MUTUAL_EXCLUSION).is_none());
}
