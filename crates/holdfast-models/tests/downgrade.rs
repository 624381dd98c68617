//! Checks the downgrade model: releasing the write lease and then acquiring a
//! read lease lets a waiting writer in between; the in-place shrink keeps
//! read-write exclusion, never admits a writer between, and admits readers.
//!
//! Run with `--nocapture` to see the counterexample; README.md records it.

use holdfast_models::downgrade::{
    DowngradeModel, DowngradeVariant, EXCLUSION, NO_WRITER_BETWEEN, READER_SHARES_AFTER_DOWNGRADE,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

#[test]
fn a_release_then_acquire_lets_a_writer_in_between() {
    let model = DowngradeModel::new(DowngradeVariant::ReleaseThenAcquire);
    assert_shortest_counterexamples(
        &model,
        model.clone(),
        Clone::clone,
        "downgrade ReleaseThenAcquire",
        &[NO_WRITER_BETWEEN],
    );
}

#[test]
fn b_in_place_holds_over_a_complete_exploration() {
    let checker = DowngradeModel::new(DowngradeVariant::InPlace).checker().spawn_dfs().join();
    println!("downgrade InPlace: complete={} unique states={}", checker.is_done(), checker.unique_state_count());
    assert!(checker.is_done());
    for property in [EXCLUSION, NO_WRITER_BETWEEN] {
        assert!(checker.discovery(property).is_none(), "InPlace: {property} violated");
    }
    assert!(checker.discovery(READER_SHARES_AFTER_DOWNGRADE).is_some(), "no reader was admitted after a downgrade");
}
