//! Checks the session model (issue 33 item 4): SQL leases that live with
//! their client's session row, renewed by one statement per client and
//! period, have no counterexample over a complete exploration; each variant
//! weighed against the shipped design has one.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::sql_session::{
    MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH, SessionModel, SessionVariant, TAKEOVER_HAPPENS,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

fn assert_counterexamples(variant: SessionVariant, expected: &[&'static str]) {
    let model = SessionModel::new(variant);
    assert_shortest_counterexamples(&model, model.clone(), Clone::clone, &format!("sql_session {variant:?}"), expected);
}

#[test]
fn a_leases_living_with_the_session_row_hold_over_a_complete_exploration() {
    let started = Instant::now();
    let checker = SessionModel::new(SessionVariant::Shipped)
        .checker()
        .threads(holdfast_models::exploration_threads())
        .spawn_dfs()
        .join();
    println!(
        "sql_session Shipped: complete={} unique states={} in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    for property in [MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH] {
        assert!(checker.discovery(property).is_none(), "Shipped: {property} violated");
    }
    assert!(checker.discovery(TAKEOVER_HAPPENS).is_some(), "no key was ever taken over from a lapsed session");
}

#[test]
fn b_a_takeover_that_does_not_count_grants_twice_after_a_clock_step() {
    assert_counterexamples(SessionVariant::TakeoverWithoutCount, &[MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH]);
}

#[test]
fn c_a_forced_release_that_does_not_count_goes_unnoticed() {
    assert_counterexamples(SessionVariant::ForceWithoutCount, &[MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH]);
}

#[test]
fn d_reading_only_the_renewed_rows_misses_the_others() {
    assert_counterexamples(SessionVariant::ReadListedOnly, &[MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH]);
}

#[test]
fn e_without_the_incarnation_an_old_lease_is_confirmed() {
    assert_counterexamples(SessionVariant::NoIncarnation, &[MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH]);
}
