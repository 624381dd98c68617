//! Checks the PostgreSQL share wake-up model: a held share's release whose
//! only notification is the gate function's (sent iff the gate row is
//! marked `wanted` when read under its lock, after the delete) wakes every
//! waiter as the unconditional notification of today does, in both forms
//! of the release (one statement and one commit, or the delete committed
//! before the gate's shrink), over complete explorations with one and two
//! share holders and a reserving writer, a mutex acquire or both; a release
//! that reads the mark in its statement's snapshot, or never notifies,
//! leaves a waiter asleep. With waiters that release the key they took, the
//! two-transaction form loses a wake-up whichever notification a release
//! sends: the writer takes the key from a gate still up and its grant
//! clears the mutex acquire's mark (not when the grant keeps the mark, the
//! fix shipped); and a client that ends between the two calls leaves the
//! writer asleep unless its delete notified.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::pg_share_wakeup::{
    EXCLUSION, EXCLUSIVE_GRANTED, NO_LOST_WAKEUP, NotifyVariant, RECHECK_FAILS, REFUSED_BY_UNCOMMITTED_DELETE,
    ReleaseForm, SILENT_RELEASE, ShareWakeupModel, TAKEN_FROM_UP_GATE, WOKEN, WRITER_GRANTED, Waiter, Waiters,
};
use holdfast_models::trace::{readable_trace, shortest_counterexample};
use stateright::{Checker, Model};

/// The sizes explored: (share holders, waiters).
const SIZES: [(u8, Waiters); 6] = [
    (1, Waiters::Writer),
    (1, Waiters::Exclusive),
    (1, Waiters::Both),
    (2, Waiters::Writer),
    (2, Waiters::Exclusive),
    (2, Waiters::Both),
];

/// Explores `model` completely, breadth-first; returns the checker and its
/// unique state count.
fn explore(model: ShareWakeupModel) -> (impl Checker<ShareWakeupModel>, usize) {
    let started = Instant::now();
    let label = format!(
        "pg_share_wakeup {:?} {:?}, {} holders, {:?}{}",
        model.variant,
        model.form,
        model.holders,
        model.waiters,
        if model.waiters_release { ", waiters release" } else { "" }
    );
    let checker = model.checker().spawn_bfs().join();
    let states = checker.unique_state_count();
    println!(
        "{label}: complete={} unique states={states} depth={} in {:.1?}",
        checker.is_done(),
        checker.max_depth(),
        started.elapsed()
    );
    assert!(checker.is_done(), "{label}: not complete");
    (checker, states)
}

/// Explores a sound design at every size: no counterexample, every case in
/// `reached` reached with two holders and both waiters, none in `never` at
/// any size; returns the state counts.
fn assert_sound(
    variant: NotifyVariant,
    form: ReleaseForm,
    waiters_release: bool,
    reached: &[&'static str],
    never: &[&'static str],
) -> [usize; 6] {
    SIZES.map(|(holders, waiters)| {
        let (checker, states) =
            explore(ShareWakeupModel { holders, waiters, waiters_release, ..ShareWakeupModel::new(variant, form) });
        for property in [NO_LOST_WAKEUP, EXCLUSION] {
            if let Some(path) = checker.discovery(property) {
                panic!("{variant:?} {form:?}: {property} violated:\n{}", readable_trace(&path));
            }
        }
        if (holders, waiters) == (2, Waiters::Both) {
            for property in reached {
                assert!(checker.discovery(property).is_some(), "{variant:?} {form:?}: never \"{property}\"");
            }
        }
        for property in never {
            assert!(checker.discovery(property).is_none(), "{variant:?} {form:?}: \"{property}\" reached");
        }
        states
    })
}

/// A shortest counterexample to [`NO_LOST_WAKEUP`] in `model`: prints it,
/// checks that it ends with a waiter asleep, and returns its length.
fn shortest_loss(model: ShareWakeupModel) -> usize {
    let started = Instant::now();
    let label =
        format!("pg_share_wakeup {:?} {:?}, {} holders, {:?}", model.variant, model.form, model.holders, model.waiters);
    let Some(path) = shortest_counterexample(&model, NO_LOST_WAKEUP, 24) else {
        panic!("{label}: no counterexample to {NO_LOST_WAKEUP}")
    };
    let steps = path.clone().into_actions().len();
    println!(
        "{label}: {steps} steps to a lost wake-up (found in {:.1?}):\n{}",
        started.elapsed(),
        readable_trace(&path)
    );
    let last = path.last_state();
    assert!(last.lost_wakeup().is_some() && last.waiters.iter().any(|w| w.at == Waiter::Asleep));
    steps
}

#[test]
fn a_the_unconditional_notification_of_today_wakes_every_waiter() {
    for (form, counts) in
        [(ReleaseForm::Fused, [15, 17, 92, 65, 71, 383]), (ReleaseForm::TwoStep, [22, 26, 169, 127, 170, 881])]
    {
        let states = assert_sound(
            NotifyVariant::Always,
            form,
            false,
            &[WOKEN, WRITER_GRANTED, EXCLUSIVE_GRANTED, RECHECK_FAILS],
            &[SILENT_RELEASE],
        );
        assert_eq!(states, counts, "Always {form:?}: state counts");
    }
}

#[test]
fn b_the_gate_functions_notification_alone_wakes_every_waiter() {
    for (form, counts) in
        [(ReleaseForm::Fused, [16, 18, 100, 80, 86, 533]), (ReleaseForm::TwoStep, [18, 18, 111, 111, 128, 821])]
    {
        let states = assert_sound(
            NotifyVariant::GateOnly,
            form,
            false,
            &[WOKEN, WRITER_GRANTED, EXCLUSIVE_GRANTED, RECHECK_FAILS, SILENT_RELEASE],
            &[],
        );
        assert_eq!(states, counts, "GateOnly {form:?}: state counts");
    }
}

#[test]
fn c_the_forms_differ_in_what_the_writer_reads() {
    for variant in [NotifyVariant::Always, NotifyVariant::GateOnly] {
        assert_sound(variant, ReleaseForm::Fused, false, &[REFUSED_BY_UNCOMMITTED_DELETE], &[TAKEN_FROM_UP_GATE]);
        assert_sound(variant, ReleaseForm::TwoStep, false, &[TAKEN_FROM_UP_GATE], &[REFUSED_BY_UNCOMMITTED_DELETE]);
    }
}

#[test]
fn d_a_mark_read_in_the_release_statements_snapshot_is_missed() {
    let mut lengths = Vec::new();
    for form in [ReleaseForm::Fused, ReleaseForm::TwoStep] {
        for (holders, waiters) in [(1, Waiters::Writer), (1, Waiters::Exclusive), (2, Waiters::Both)] {
            let model =
                ShareWakeupModel { holders, waiters, ..ShareWakeupModel::new(NotifyVariant::SnapshotWanted, form) };
            lengths.push(shortest_loss(model));
        }
    }
    assert_eq!(lengths, [5, 5, 8, 5, 5, 8], "SnapshotWanted: steps to a lost wake-up");
}

#[test]
fn e_a_release_that_never_notifies_is_missed() {
    let mut lengths = Vec::new();
    for form in [ReleaseForm::Fused, ReleaseForm::TwoStep] {
        for (holders, waiters) in [(1, Waiters::Writer), (1, Waiters::Exclusive), (2, Waiters::Both)] {
            let model = ShareWakeupModel { holders, waiters, ..ShareWakeupModel::new(NotifyVariant::Never, form) };
            lengths.push(shortest_loss(model));
        }
    }
    assert_eq!(lengths, [5, 5, 8, 5, 5, 8], "Never: steps to a lost wake-up");
}

#[test]
fn f_with_waiters_that_release_the_fused_form_still_wakes_every_waiter() {
    for (variant, counts) in
        [(NotifyVariant::Always, [16, 18, 124, 66, 72, 415]), (NotifyVariant::GateOnly, [18, 20, 148, 84, 90, 643])]
    {
        let states = assert_sound(variant, ReleaseForm::Fused, true, &[WOKEN, WRITER_GRANTED, EXCLUSIVE_GRANTED], &[]);
        assert_eq!(states, counts, "{variant:?} Fused, waiters release: state counts");
    }
}

#[test]
fn g_with_waiters_that_release_the_two_step_form_loses_the_mutex_acquires_mark() {
    let mut lengths = Vec::new();
    for variant in [NotifyVariant::Always, NotifyVariant::GateOnly] {
        for holders in [1, 2] {
            let model = ShareWakeupModel {
                holders,
                waiters_release: true,
                ..ShareWakeupModel::new(variant, ReleaseForm::TwoStep)
            };
            lengths.push(shortest_loss(model));
        }
        // Either waiter alone: no loss.
        for waiters in [Waiters::Writer, Waiters::Exclusive] {
            let model = ShareWakeupModel {
                waiters,
                waiters_release: true,
                ..ShareWakeupModel::new(variant, ReleaseForm::TwoStep)
            };
            let (checker, _) = explore(model);
            assert!(
                checker.discovery(NO_LOST_WAKEUP).is_none(),
                "{variant:?} TwoStep, {waiters:?} alone: a lost wake-up"
            );
        }
    }
    assert_eq!(lengths, [11, 14, 8, 11], "TwoStep, waiters release: steps to a lost wake-up");
}

#[test]
fn h_a_client_that_ends_between_the_two_calls_leaves_the_writer_asleep_unless_its_delete_notified() {
    let stopping = |variant| {
        SIZES.map(|(holders, waiters)| ShareWakeupModel {
            holders,
            waiters,
            stops: true,
            ..ShareWakeupModel::new(variant, ReleaseForm::TwoStep)
        })
    };
    let mut counts = Vec::new();
    for model in stopping(NotifyVariant::Always) {
        let (checker, states) = explore(model);
        assert!(checker.discovery(NO_LOST_WAKEUP).is_none(), "Always TwoStep, clients that end: a lost wake-up");
        counts.push(states);
    }
    assert_eq!(counts, [29, 32, 221, 221, 276, 1506], "Always TwoStep, clients that end: state counts");
    let lengths: Vec<usize> = stopping(NotifyVariant::GateOnly)
        .into_iter()
        .filter(|m| m.waiters != Waiters::Exclusive)
        .map(shortest_loss)
        .collect();
    assert_eq!(lengths, [4, 4, 6, 6], "GateOnly TwoStep, clients that end: steps to a lost wake-up");
    for model in stopping(NotifyVariant::GateOnly).into_iter().filter(|m| m.waiters == Waiters::Exclusive) {
        let (checker, _) = explore(model);
        assert!(
            checker.discovery(NO_LOST_WAKEUP).is_none(),
            "GateOnly TwoStep, X alone, clients that end: a lost wake-up"
        );
    }
}

/// Finding (b)'s fix: in the two-call form a writer's grant keeps the mark
/// it finds (`wanted = others_wait OR wanted`), so the mutex acquire's mark
/// outlives it and the writer's release wakes it. No lost wake-up with
/// waiters that release, with the unconditional first call (shipped) or
/// the gate's only, nor with clients that end between the two calls (with
/// the first call's notification, as shipped).
#[test]
fn i_a_writers_grant_that_keeps_the_mark_loses_no_wake_up_in_the_two_step_form() {
    let mut counts = Vec::new();
    for variant in [NotifyVariant::Always, NotifyVariant::GateOnly] {
        for (holders, waiters) in SIZES {
            let model = ShareWakeupModel {
                holders,
                waiters,
                waiters_release: true,
                writer_keeps_mark: true,
                ..ShareWakeupModel::new(variant, ReleaseForm::TwoStep)
            };
            let (checker, states) = explore(model);
            for property in [NO_LOST_WAKEUP, EXCLUSION] {
                if let Some(path) = checker.discovery(property) {
                    panic!("{variant:?} TwoStep, mark kept: {property} violated:\n{}", readable_trace(&path));
                }
            }
            if (holders, waiters) == (2, Waiters::Both) {
                for property in [TAKEN_FROM_UP_GATE, EXCLUSIVE_GRANTED, WRITER_GRANTED] {
                    assert!(checker.discovery(property).is_some(), "{variant:?} TwoStep, mark kept: never {property}");
                }
            }
            counts.push(states);
        }
    }
    for (holders, waiters) in SIZES {
        let model = ShareWakeupModel {
            holders,
            waiters,
            waiters_release: true,
            stops: true,
            writer_keeps_mark: true,
            ..ShareWakeupModel::new(NotifyVariant::Always, ReleaseForm::TwoStep)
        };
        let (checker, states) = explore(model);
        assert!(checker.discovery(NO_LOST_WAKEUP).is_none(), "Always TwoStep, mark kept, clients that end: a loss");
        counts.push(states);
    }
    let expected = [31, 27, 226, 151, 175, 1067, 22, 20, 167, 126, 140, 1071, 41, 33, 291, 266, 283, 1819];
    assert_eq!(counts, expected, "TwoStep, mark kept: state counts");
}
