//! Checks the PostgreSQL share release model: the release of today (delete
//! and commit, then the gate's shrink in a call of its own), the fused
//! release (one statement: the delete, the gate's lock, a fresh read that
//! sees the delete, one commit) and the fused release with `SKIP LOCKED`
//! never let an exclusive holder and a held share be at once and never
//! close a cycle of lock waits, over complete explorations with two and
//! three sharing clients; a shrink that reads the statement's snapshot lets
//! the exclusive acquirer in beside a share, and a release that locks the
//! gate before its delete deadlocks with its own renewal.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::pg_share_release::{
    EXCLUSION, EXCLUSIVE_GRANTED, GATE_COVERS, NO_DEADLOCK, RELEASE_WAITS_ON_GATE, RELEASE_WAITS_ON_RENEWAL,
    RENEWAL_WAITS_ON_GATE, RENEWAL_WAITS_ON_RELEASE, SHRINK_SECOND_CALL, ShareReleaseModel, ShareReleaseVariant,
    TWO_SHARES, Txn,
};
use holdfast_models::trace::{readable_trace, shortest_counterexample};
use stateright::{Checker, Model};

const SAFETY: [&str; 3] = [EXCLUSION, NO_DEADLOCK, GATE_COVERS];

/// Explores `variant` with `clients` sharing clients completely,
/// breadth-first, on every core; returns the checker and its unique
/// state count.
fn explore(variant: ShareReleaseVariant, clients: u8) -> (impl Checker<ShareReleaseModel>, usize) {
    let started = Instant::now();
    let model = ShareReleaseModel { variant, clients };
    let checker = model.checker().threads(holdfast_models::exploration_threads()).spawn_bfs().join();
    let states = checker.unique_state_count();
    println!(
        "pg_share_release {variant:?}, {clients} sharing clients: complete={} unique states={states} depth={} in {:.1?}",
        checker.is_done(),
        checker.max_depth(),
        started.elapsed()
    );
    assert!(checker.is_done(), "{variant:?}: not complete");
    (checker, states)
}

/// Explores a design to ship with two and three sharing clients: no
/// counterexample, every case in `reached` reached and none in `never`;
/// returns the state counts.
fn assert_safe(variant: ShareReleaseVariant, reached: &[&'static str], never: &[&'static str]) -> [usize; 3] {
    [2, 3, 4].map(|clients| {
        let (checker, states) = explore(variant, clients);
        for property in SAFETY {
            if let Some(path) = checker.discovery(property) {
                panic!("{variant:?}: {property} violated:\n{}", readable_trace(&path));
            }
        }
        for property in reached {
            assert!(checker.discovery(property).is_some(), "{variant:?}: never \"{property}\"");
        }
        for property in never {
            assert!(checker.discovery(property).is_none(), "{variant:?}: \"{property}\" reached");
        }
        states
    })
}

#[test]
fn a_the_release_and_its_shrink_in_two_transactions_are_safe() {
    let states = assert_safe(
        ShareReleaseVariant::TwoStep,
        &[EXCLUSIVE_GRANTED, TWO_SHARES, RENEWAL_WAITS_ON_GATE, RELEASE_WAITS_ON_RENEWAL, SHRINK_SECOND_CALL],
        // Its delete commits at once: it never holds a share row's lock
        // across a step.
        &[RELEASE_WAITS_ON_GATE, RENEWAL_WAITS_ON_RELEASE],
    );
    assert_eq!(states, [135, 632, 2781], "TwoStep: state counts");
}

#[test]
fn b_the_fused_release_is_safe_and_deadlock_free() {
    let states = assert_safe(
        ShareReleaseVariant::Fused,
        &[
            EXCLUSIVE_GRANTED,
            TWO_SHARES,
            RELEASE_WAITS_ON_GATE,
            RENEWAL_WAITS_ON_GATE,
            RENEWAL_WAITS_ON_RELEASE,
            RELEASE_WAITS_ON_RENEWAL,
        ],
        &[SHRINK_SECOND_CALL],
    );
    assert_eq!(states, [159, 1012, 6265], "Fused: state counts");
}

#[test]
fn c_the_fused_release_with_skip_locked_is_safe_and_deadlock_free() {
    let states = assert_safe(
        ShareReleaseVariant::FusedSkipLocked,
        &[
            EXCLUSIVE_GRANTED,
            TWO_SHARES,
            RENEWAL_WAITS_ON_GATE,
            RENEWAL_WAITS_ON_RELEASE,
            RELEASE_WAITS_ON_RENEWAL,
            SHRINK_SECOND_CALL,
        ],
        // It never waits for the gate while it holds its row.
        &[RELEASE_WAITS_ON_GATE],
    );
    assert_eq!(states, [295, 2148, 15277], "FusedSkipLocked: state counts");
}

/// A shortest counterexample to `property` in `variant` (two sharing
/// clients): prints it and returns it.
fn shortest(
    variant: ShareReleaseVariant,
    property: &'static str,
) -> stateright::Path<<ShareReleaseModel as Model>::State, <ShareReleaseModel as Model>::Action> {
    let started = Instant::now();
    let model = ShareReleaseModel::new(variant);
    let Some(path) = shortest_counterexample(&model, property, 24) else {
        panic!("{variant:?}: no counterexample to {property}")
    };
    println!(
        "pg_share_release {variant:?}: {} steps to a counterexample to \"{property}\" (found in {:.1?}):\n{}",
        path.clone().into_actions().len(),
        started.elapsed(),
        readable_trace(&path)
    );
    path
}

#[test]
fn d_a_shrink_in_the_statements_snapshot_lets_the_exclusive_acquirer_in_beside_a_share() {
    let path = shortest(ShareReleaseVariant::InlineSnapshot, EXCLUSION);
    let last = path.last_state();
    assert!(last.exclusive_holds() && last.held() != 0, "InlineSnapshot: an exclusive holder and a share at once");
    assert_eq!(path.into_actions().len(), 14, "InlineSnapshot: steps to EXCLUSION");
    assert_eq!(shortest(ShareReleaseVariant::InlineSnapshot, GATE_COVERS).into_actions().len(), 12);
    let (checker, _) = explore(ShareReleaseVariant::InlineSnapshot, 2);
    assert!(checker.discovery(NO_DEADLOCK).is_none(), "InlineSnapshot: deadlock");
}

#[test]
fn e_a_release_that_locks_the_gate_before_its_delete_deadlocks_with_its_renewal() {
    let path = shortest(ShareReleaseVariant::GateFirst, NO_DEADLOCK);
    let mut cycle = path.last_state().deadlock().expect("a cycle of waits");
    cycle.sort_by_key(|t| format!("{t:?}"));
    assert!(
        matches!(cycle[..], [Txn::Release(c), Txn::Renewal(d)] if c == d),
        "GateFirst: a client's release and its renewal wait for each other, not {cycle:?}"
    );
    assert_eq!(path.into_actions().len(), 5, "GateFirst: steps to NO_DEADLOCK");
    let (checker, _) = explore(ShareReleaseVariant::GateFirst, 2);
    for property in [EXCLUSION, GATE_COVERS] {
        assert!(checker.discovery(property).is_none(), "GateFirst: {property} violated");
    }
}
