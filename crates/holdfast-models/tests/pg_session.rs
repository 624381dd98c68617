//! Checks the PostgreSQL session model (issue 33 item 4): leases that live
//! with their client's session row, under `READ COMMITTED` (statement
//! snapshots, row locks, re-checks on the latest row version), have no
//! counterexample over a complete exploration; each variant weighed against
//! the shipped statements has one.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::pg_session::{
    LEAN_ACQUIRE_HAPPENS, MUTUAL_EXCLUSION, PgSessionAction, PgSessionModel, PgSessionState, PgSessionVariant,
    RENEWAL_TELLS_THE_TRUTH, ROWS_ARE_READ, TAKEOVER_HAPPENS,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

/// Runs `actions` from the start, each one enabled, printing the steps.
fn replay(variant: PgSessionVariant, actions: &[PgSessionAction]) -> PgSessionState {
    let model = PgSessionModel::new(variant);
    let mut state = model.init_states().remove(0);
    println!("pg_session {variant:?}, replayed:\nstart: {state}");
    for (n, action) in actions.iter().enumerate() {
        let mut enabled = Vec::new();
        model.actions(&state, &mut enabled);
        assert!(enabled.contains(action), "{action} is not enabled in {state}");
        state = model.next_state(&state, *action).expect("a step");
        println!("{:>2}. {action}\n    -> {state}", n + 1);
    }
    state
}

fn assert_counterexamples(variant: PgSessionVariant, expected: &[&'static str]) {
    let model = PgSessionModel::new(variant);
    assert_shortest_counterexamples(&model, model.clone(), Clone::clone, &format!("pg_session {variant:?}"), expected);
}

#[test]
fn a_session_leases_under_read_committed_hold_over_a_complete_exploration() {
    let started = Instant::now();
    let checker = PgSessionModel::new(PgSessionVariant::Shipped)
        .checker()
        .threads(holdfast_models::exploration_threads())
        .spawn_dfs()
        .join();
    println!(
        "pg_session Shipped: complete={} unique states={} in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    for property in [MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH] {
        assert!(checker.discovery(property).is_none(), "Shipped: {property} violated");
    }
    assert!(checker.discovery(TAKEOVER_HAPPENS).is_some(), "no key was ever taken over from a lapsed session");
    assert!(checker.discovery(ROWS_ARE_READ).is_some(), "no renewal ever found the removed count moved");
    assert!(checker.discovery(LEAN_ACQUIRE_HAPPENS).is_some(), "no acquire ever took the lean path");
}

#[test]
fn b_a_takeover_that_trusts_its_snapshot_takes_a_renewed_session() {
    assert_counterexamples(PgSessionVariant::SnapshotTakeover, &[MUTUAL_EXCLUSION]);
    // The shortest run, step by step (the search above may print a longer
    // one): B's snapshot sees A's session lapsed while A's renewal of it
    // waits to commit.
    use PgSessionAction::*;
    let run = [AcquireStart(0, 0), AcquireWrite(0), Tick, SendRenewal(0, 1), Renew(0), Tick, AcquireStart(1, 0)];
    let run = [&run[..], &[Renew(0), AcquireWrite(1)]].concat();
    assert!(replay(PgSessionVariant::SnapshotTakeover, &run).two_live_views());
    assert!(!replay(PgSessionVariant::Shipped, &run).two_live_views(), "shipped: the takeover finds A renewed");
}

#[test]
fn c_rows_read_in_the_renewals_own_snapshot_miss_a_removal() {
    assert_counterexamples(PgSessionVariant::RowsFromRenewalSnapshot, &[MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH]);
}

#[test]
fn d_a_session_counted_from_the_renewals_reply_outlives_the_server_row() {
    assert_counterexamples(PgSessionVariant::LeanCountedFromReply, &[MUTUAL_EXCLUSION]);
    // A renews at 4 (the server's row until 6) and hears back at 5, so it
    // counts its session until 7; its lean acquire of K0 at 5 holds until
    // 7; at 6 the session lapsed on the server and B takes K0 over.
    use PgSessionAction::*;
    let run = [AcquireStart(0, 0), AcquireWrite(0), Tick, SendRenewal(0, 1), Renew(0), Tick, Renew(0)];
    let run =
        [&run[..], &[Release(0, 0), AcquireStart(0, 0), AcquireWrite(0), Tick, AcquireStart(1, 0), AcquireWrite(1)]]
            .concat();
    assert!(replay(PgSessionVariant::LeanCountedFromReply, &run).two_live_views());
    assert!(
        !replay(PgSessionVariant::Shipped, &run).two_live_views(),
        "shipped: A counts until 6 and takes no lean grant"
    );
}
