//! Checks the PostgreSQL wake-up model (issue 33): a waiting attempt that
//! finds the row already marked `wanted` writes nothing and still hears the
//! release (the shipped design), like the design before it that rewrote the
//! mark every time; telling the waiter "registered" whatever the update
//! found, or marking the row without re-checking its holder, leaves a waiter
//! asleep with no notification on its way.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::pg_wakeup::{
    ALL_SERVED, NO_REWRITE, NO_UNANNOUNCED_SLEEP, ONE_HOLDER, SLEEPS_ON_ANOTHERS_MARK, WakeupModel, WakeupVariant,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

fn explore(variant: WakeupVariant, waiters: u8, together: bool) -> impl Checker<WakeupModel> {
    let started = Instant::now();
    let checker = WakeupModel { variant, waiters, together }.checker().spawn_dfs().join();
    println!(
        "pg_wakeup {variant:?}, {waiters} waiters (P1 and P2 one client: {together}): complete={} unique states={} in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    for property in [ONE_HOLDER, NO_UNANNOUNCED_SLEEP, ALL_SERVED] {
        assert!(checker.discovery(property).is_none(), "{variant:?}: {property} violated");
    }
    checker
}

#[test]
fn a_a_marked_row_is_not_rewritten_and_every_waiter_still_hears_its_release() {
    for (waiters, together) in [(2, false), (3, false), (2, true), (3, true)] {
        let checker = explore(WakeupVariant::Shipped, waiters, together);
        assert!(checker.discovery(NO_REWRITE).is_none(), "a marked row was rewritten");
        assert!(checker.discovery(SLEEPS_ON_ANOTHERS_MARK).is_some(), "no waiter ever slept on another's mark");
    }
}

#[test]
fn b_the_design_before_wakes_every_waiter_but_rewrites_marked_rows() {
    explore(WakeupVariant::Before, 3, true);
    let checker = explore(WakeupVariant::Before, 2, false);
    assert!(checker.discovery(NO_REWRITE).is_some(), "the design before never rewrote a marked row");
}

#[test]
fn c_registered_whatever_the_update_found_sleeps_through_an_unannounced_release() {
    let model = WakeupModel::new(WakeupVariant::ForcedRegistered);
    assert_shortest_counterexamples(
        &model,
        model.clone(),
        Clone::clone,
        "pg_wakeup ForcedRegistered",
        &[NO_UNANNOUNCED_SLEEP, ALL_SERVED],
    );
}

#[test]
fn d_a_mark_without_the_holder_recheck_sleeps_on_a_released_row() {
    let model = WakeupModel::new(WakeupVariant::MarkLatest);
    assert_shortest_counterexamples(
        &model,
        model.clone(),
        Clone::clone,
        "pg_wakeup MarkLatest",
        &[NO_UNANNOUNCED_SLEEP, ALL_SERVED],
    );
}
