//! Checks the PostgreSQL share gate model: a shared acquire that locks the
//! gate row and then reads the shares in a snapshot of its own (the shipped
//! function) never admits beyond the limit, over a complete exploration;
//! one statement whose snapshot is taken before the lock, a read before
//! the lock, and no lock each admit two permits in a semaphore of one.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::pg_share_gate::{
    REFUSED, ShareGateModel, ShareGateVariant, TWO_GRANTED, WAITS_ON_GATE, WITHIN_LIMIT,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

fn assert_counterexample(variant: ShareGateVariant) {
    let model = ShareGateModel::new(variant);
    assert_shortest_counterexamples(
        &model,
        model.clone(),
        Clone::clone,
        &format!("pg_share_gate {variant:?}"),
        &[WITHIN_LIMIT],
    );
}

#[test]
fn a_the_shares_read_under_the_gate_lock_never_admit_beyond_the_limit() {
    for (clients, limit) in [(2, 1), (3, 1), (3, 2), (4, 2)] {
        let started = Instant::now();
        let model = ShareGateModel { clients, limit, ..ShareGateModel::new(ShareGateVariant::Shipped) };
        let checker = model.checker().spawn_dfs().join();
        println!(
            "pg_share_gate Shipped, {clients} clients, limit {limit}: complete={} unique states={} in {:.1?}",
            checker.is_done(),
            checker.unique_state_count(),
            started.elapsed()
        );
        assert!(checker.is_done());
        assert!(checker.discovery(WITHIN_LIMIT).is_none(), "more than {limit} permits held");
        for property in [TWO_GRANTED, WAITS_ON_GATE, REFUSED] {
            assert!(checker.discovery(property).is_some(), "never reached: {property}");
        }
    }
}

#[test]
fn b_one_statement_reads_the_shares_in_its_snapshot_from_before_the_lock() {
    assert_counterexample(ShareGateVariant::OneStatement);
}

#[test]
fn c_the_shares_read_before_the_gate_lock_admit_twice() {
    assert_counterexample(ShareGateVariant::ReadBeforeLock);
}

#[test]
fn d_without_the_gate_lock_two_acquires_admit_each_other() {
    assert_counterexample(ShareGateVariant::NoGateLock);
}
