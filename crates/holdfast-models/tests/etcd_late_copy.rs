//! Checks the etcd late-copy model: with a session epoch compared by every
//! copy of a first write and bumped by the release of an uncertain attempt
//! (the design to ship), a copy the client gave up on that lands after the
//! release writes nothing; deleting the key once (the design before), or a
//! few more times (the design shipped now), or the epoch without the
//! nested compare in `Enqueue`'s else branch, leaves an orphan key that
//! refuses the next client; a tombstone per attempt is safe but piles up.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::etcd_late_copy::{
    ENDS_FREE, Kind, LATE_COPY_REFUSED, LateCopyModel, LateCopyVariant, NO_KEY_PILE, NO_REVIVAL, ONE_HOLDER,
    RESENT_AFTER_EPOCH_MOVED,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

fn model(variant: LateCopyVariant, kinds: &[Kind]) -> LateCopyModel {
    LateCopyModel { kinds: kinds.to_vec(), ..LateCopyModel::new(variant) }
}

fn explore(variant: LateCopyVariant, kinds: &[Kind]) -> impl Checker<LateCopyModel> {
    let started = Instant::now();
    let checker = model(variant, kinds).checker().spawn_dfs().join();
    println!(
        "etcd_late_copy {variant:?}, A's attempts {kinds:?}: complete={} unique states={} in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    for property in [NO_REVIVAL, ENDS_FREE, ONE_HOLDER] {
        assert!(checker.discovery(property).is_none(), "{variant:?} {kinds:?}: {property} violated");
    }
    checker
}

#[test]
fn a_with_the_session_epoch_a_late_copy_writes_nothing_and_the_lock_ends_free() {
    let configurations: [&[Kind]; 4] = [
        &[Kind::Try, Kind::Enqueue],
        &[Kind::Enqueue, Kind::Enqueue],
        &[Kind::Try, Kind::Try],
        &[Kind::Try, Kind::Enqueue, Kind::Enqueue],
    ];
    for kinds in configurations {
        let checker = explore(LateCopyVariant::Epoch, kinds);
        assert!(checker.discovery(NO_KEY_PILE).is_none(), "{kinds:?}: more than the epoch key left");
        assert!(checker.discovery(LATE_COPY_REFUSED).is_some(), "{kinds:?}: no late copy was refused");
        assert!(checker.discovery(RESENT_AFTER_EPOCH_MOVED).is_some(), "{kinds:?}: no attempt resent");
    }
}

fn counterexamples(model: LateCopyModel, expected: &[&'static str]) {
    let label = format!("etcd_late_copy {:?} {:?} (B late: {})", model.variant, model.kinds, model.b_late);
    assert_shortest_counterexamples(&model, model.clone(), Clone::clone, &label, expected);
}

const TRY_ENQUEUE: &[Kind] = &[Kind::Try, Kind::Enqueue];

#[test]
fn b_a_single_delete_at_the_release_leaves_a_late_copy_on_the_session() {
    counterexamples(model(LateCopyVariant::PlainDelete, TRY_ENQUEUE), &[NO_REVIVAL, ENDS_FREE]);
}

#[test]
fn c_deletes_repeated_after_the_release_miss_a_copy_later_than_the_last() {
    // B refused by a late key the next re-delete would have removed.
    counterexamples(model(LateCopyVariant::TimedDeletes, TRY_ENQUEUE), &[NO_REVIVAL, ENDS_FREE]);
    // B after the last re-delete: the copy landed later than it, for good.
    let late_b = LateCopyModel { b_late: true, ..model(LateCopyVariant::TimedDeletes, TRY_ENQUEUE) };
    counterexamples(late_b, &[ENDS_FREE]);
}

#[test]
fn d_the_epoch_with_a_flat_else_puts_a_late_enqueue_copy() {
    counterexamples(model(LateCopyVariant::EpochFlatElse, TRY_ENQUEUE), &[NO_REVIVAL, ENDS_FREE]);
    // Without an `Enqueue`, the flat else branch is never run.
    explore(LateCopyVariant::EpochFlatElse, &[Kind::Try, Kind::Try]);
}

#[test]
fn e_a_tombstone_per_attempt_is_safe_but_piles_up_on_the_session() {
    for kinds in [TRY_ENQUEUE, &[Kind::Enqueue, Kind::Enqueue]] {
        explore(LateCopyVariant::Tombstone, kinds);
    }
    counterexamples(model(LateCopyVariant::Tombstone, TRY_ENQUEUE), &[NO_KEY_PILE]);
}

#[test]
fn f_the_rejected_designs_break_nothing_else() {
    // Each fails only what its test above says: no double holder, and no
    // key pile but the tombstones'.
    for variant in [LateCopyVariant::PlainDelete, LateCopyVariant::TimedDeletes, LateCopyVariant::EpochFlatElse] {
        let started = Instant::now();
        let checker = model(variant, TRY_ENQUEUE).checker().spawn_dfs().join();
        println!(
            "etcd_late_copy {variant:?}: complete={} unique states={} in {:.1?}",
            checker.is_done(),
            checker.unique_state_count(),
            started.elapsed()
        );
        assert!(checker.is_done());
        for property in [ONE_HOLDER, NO_KEY_PILE] {
            assert!(checker.discovery(property).is_none(), "{variant:?}: {property} violated");
        }
    }
}
