//! Checks the MySQL per-key fence model (issue 33 item 4): the shipped
//! layout (fences kept in the lease row, the released marker kept, a sweep
//! and a forced release that raise the counter, shares that keep the gate's
//! fence the greatest, old clients stopped by the renamed expiry column) has
//! no counterexample over a complete exploration; each variant weighed
//! against it has one.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times.

use std::time::Instant;

use holdfast_models::mysql_fence::{
    FENCES_INCREASE, FenceModel, FenceVariant, GRANT_AFTER_SWEEP, GRANT_OVER_MARKER, Kind, MUTUAL_EXCLUSION,
    SHARE_OVER_RAISED_ROW,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

fn assert_counterexamples(model: FenceModel, expected: &[&'static str]) {
    let label = format!("mysql_fence {:?}", model.variant);
    let searched = model.clone().checking(expected);
    assert_shortest_counterexamples(&model, searched, Clone::clone, &label, expected);
}

#[test]
fn a_the_shipped_layout_holds_over_a_complete_exploration() {
    let started = Instant::now();
    let checker = FenceModel::new(FenceVariant::Shipped).checker().spawn_dfs().join();
    println!(
        "mysql_fence Shipped: complete={} unique states={} in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    for property in [MUTUAL_EXCLUSION, FENCES_INCREASE] {
        assert!(checker.discovery(property).is_none(), "Shipped: {property} violated");
    }
    assert!(checker.discovery(GRANT_AFTER_SWEEP).is_some(), "never granted after a sweep");
    assert!(checker.discovery(GRANT_OVER_MARKER).is_some(), "never granted over the released marker");
    assert!(checker.discovery(SHARE_OVER_RAISED_ROW).is_some(), "no share over a row above the counter");
}

#[test]
fn a_the_layout_shipped_before_holds_too() {
    let checker = FenceModel::new(FenceVariant::SharesUnderCounter).checker().spawn_dfs().join();
    assert!(checker.is_done());
    for property in [MUTUAL_EXCLUSION, FENCES_INCREASE] {
        assert!(checker.discovery(property).is_none(), "SharesUnderCounter: {property} violated");
    }
}

#[test]
fn b_a_sweep_without_the_counter_raise_repeats_a_fence() {
    let model = FenceModel::new(FenceVariant::SweepWithoutRaise).with_kinds(&[Kind::New], 3, 0);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}

#[test]
fn c_a_forced_release_without_the_counter_raise_repeats_a_fence() {
    let model = FenceModel::new(FenceVariant::ForceWithoutRaise).with_kinds(&[Kind::New], 3, 0);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}

#[test]
fn d_shares_from_the_counter_go_below_the_key_fence() {
    let model = FenceModel::new(FenceVariant::SharesFromCounter).with_kinds(&[Kind::New, Kind::New], 2, 0);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}

#[test]
fn e_a_gate_overwritten_by_an_older_share_repeats_a_fence() {
    let model = FenceModel::new(FenceVariant::GateOverwrite).with_kinds(&[Kind::New, Kind::New], 2, 0);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}

#[test]
fn e_a_gate_not_raised_to_a_share_from_it_repeats_a_fence() {
    let model = FenceModel::new(FenceVariant::GateNotRaised).with_kinds(&[Kind::New, Kind::New, Kind::New], 1, 0);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}

#[test]
fn f_old_clients_without_the_rename_go_below_the_key_fence() {
    let model = FenceModel::new(FenceVariant::NoRename).with_kinds(&[Kind::New, Kind::Old], 2, 0);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}

#[test]
fn g_a_release_that_deletes_the_row_repeats_a_fence() {
    let model = FenceModel::new(FenceVariant::ReleaseDeletes).with_kinds(&[Kind::New], 3, 0);
    assert_counterexamples(model, &[FENCES_INCREASE]);
}
