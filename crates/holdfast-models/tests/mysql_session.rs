//! Checks the MySQL/MariaDB session model (issue 33 item 4): leases that
//! live with their client's session row, under InnoDB's `READ COMMITTED`
//! (consistent reads of a statement's snapshot, locking reads of the latest
//! version, row locks until commit, `now()` read at a statement's start),
//! have no counterexample over a complete exploration; each rejected variant
//! has one, replayed step by step with the same steps on the shipped model;
//! two simplifications weighed have none within the bounds (`f_`, `j_`).
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::mysql_session::{
    AcquireStep, LEAN_ACQUIRE_HAPPENS, MUTUAL_EXCLUSION, MySessionAction, MySessionModel, MySessionState,
    MySessionVariant, RENEWAL_TELLS_THE_TRUTH, ROWS_ARE_READ, TAKEOVER_HAPPENS,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

/// Runs `actions` from the start, each one enabled, printing the steps.
fn replay(variant: MySessionVariant, actions: &[MySessionAction]) -> MySessionState {
    replay_on(&MySessionModel::new(variant), actions)
}

/// [`replay`] on a model of other bounds.
fn replay_on(model: &MySessionModel, actions: &[MySessionAction]) -> MySessionState {
    let variant = model.variant;
    let mut state = model.init_states().remove(0);
    println!("mysql_session {variant:?}, replayed:\nstart: {state}");
    for (n, action) in actions.iter().enumerate() {
        let mut enabled = Vec::new();
        model.actions(&state, &mut enabled);
        assert!(enabled.contains(action), "{action} is not enabled in {state}");
        state = model.next_state(&state, *action).expect("a step");
        println!("{:>2}. {action}\n    -> {state}", n + 1);
    }
    state
}

fn assert_counterexamples(variant: MySessionVariant, expected: &[&'static str]) {
    let model = MySessionModel::new(variant);
    assert_shortest_counterexamples(
        &model,
        model.clone(),
        Clone::clone,
        &format!("mysql_session {variant:?}"),
        expected,
    );
}

#[test]
fn a_session_leases_under_innodb_read_committed_hold_over_a_complete_exploration() {
    let started = Instant::now();
    let checker = MySessionModel::new(MySessionVariant::Shipped)
        .checker()
        .threads(holdfast_models::exploration_threads())
        .spawn_dfs()
        .join();
    println!(
        "mysql_session Shipped: complete={} unique states={} in {:.1?}",
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
fn b_a_takeover_that_trusts_its_consistent_read_takes_a_renewed_session() {
    assert_counterexamples(MySessionVariant::ConsistentReadTakeover, &[MUTUAL_EXCLUSION]);
    // The shortest run, step by step (the search above may print a longer
    // one): A holds K0 on A1 (until 5); at 4 A's renewal writes A1 until 6
    // and holds the row's lock; at 5 B's grant finds the row held, B's
    // consistent read sees A1 lapsed (the renewal is not committed), B locks
    // the lease row; A's renewal commits (A holds K0 until 6); B's count
    // waits for it and, without the re-check, takes K0.
    use MySessionAction::*;
    let run = [AcquireStart(0, 0), Acquire(0), Tick, SendRenewal(0, 1), Renew(0), Tick, AcquireStart(1, 0)];
    let run = [&run[..], &[Acquire(1), Acquire(1), Acquire(1), Renew(0), Acquire(1)]].concat();
    assert!(replay(MySessionVariant::ConsistentReadTakeover, &run).two_live_views());
    let shipped = replay(MySessionVariant::Shipped, &run);
    assert!(!shipped.two_live_views(), "shipped: the count re-checks A1 on its latest version");
    assert!(shipped.clients[1].views[0].is_none() && shipped.clients[1].acquiring.is_none(), "B is busy");
}

#[test]
fn c_a_count_read_before_the_renewals_update_misses_a_removal() {
    assert_counterexamples(MySessionVariant::CountBeforeRenew, &[MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH]);
    // The shortest run: A holds K0; A's renewal reads `removed` (0); an
    // operator frees K0 and counts it (1); the renewal's UPDATE extends A1
    // and commits; going by the 0 it read, it confirms K0 (a gone row: A
    // counts itself the holder again); B, which chose its session before,
    // is granted the free row.
    use MySessionAction::*;
    let run = [AcquireStart(0, 0), Acquire(0), SendRenewal(0, 1), Renew(0), AcquireStart(1, 0), ForceRelease(0)];
    let run = [&run[..], &[Renew(0), Renew(0), Acquire(1)]].concat();
    let broken = replay(MySessionVariant::CountBeforeRenew, &run);
    assert!(broken.two_live_views() && broken.confirmed_a_gone_lease);
    // The gone row is confirmed in 7 of those steps (B's are not needed).
    let seven = [AcquireStart(0, 0), Acquire(0), SendRenewal(0, 1), Renew(0), ForceRelease(0), Renew(0), Renew(0)];
    assert!(replay(MySessionVariant::CountBeforeRenew, &seven).confirmed_a_gone_lease);
    // Shipped, the same steps but the early read (the count is read from
    // the locked row after the UPDATE, which the forced release waits for,
    // so it comes first here): the renewal finds 1, commits and reads the
    // rows; K0 is not A1's, so A forgets it.
    let run = [AcquireStart(0, 0), Acquire(0), SendRenewal(0, 1), AcquireStart(1, 0), ForceRelease(0), Renew(0)];
    let shipped = replay(MySessionVariant::Shipped, &[&run[..], &[Renew(0), Acquire(1), Renew(0)]].concat());
    assert!(!shipped.two_live_views() && !shipped.confirmed_a_gone_lease);
    assert!(shipped.clients[0].views[0].is_none(), "A learns K0 is lost");
}

#[test]
fn d_a_session_counted_from_the_reply_outlives_the_servers() {
    assert_counterexamples(MySessionVariant::LeanFromReceipt, &[MUTUAL_EXCLUSION]);
    // The shortest run needs no clock step: A's INSERT makes A1 until 5 at
    // 3; its reply is taken at 5 (two ticks later), and A counts A1, and the
    // grant it sends at once, until 7; A1 lapsed at 5 on the server, so B's
    // consistent read, lock and re-checked count take K0 at 5.
    use MySessionAction::*;
    let run = [AcquireStart(0, 0), Tick, Tick, Acquire(0), AcquireStart(1, 0)];
    let run = [&run[..], &[Acquire(1), Acquire(1), Acquire(1), Acquire(1)]].concat();
    assert!(replay(MySessionVariant::LeanFromReceipt, &run).two_live_views());
    // Shipped, A counts A1 from the INSERT's send (until 5): at 5 its view
    // has lapsed when B takes K0.
    assert!(!replay(MySessionVariant::Shipped, &run).two_live_views());
    // The lean path then grants on the lapsed A1: A releases K0 at 5 and
    // acquires it again; by its count (until 7, two ticks left) it uses A1
    // as it is, and is granted K0 on a session that lapsed at 5.
    let lean = [AcquireStart(0, 0), Tick, Tick, Acquire(0), Release(0, 0), AcquireStart(0, 0), Acquire(0)];
    let state = replay(MySessionVariant::LeanFromReceipt, &lean);
    let view = state.clients[0].views[0].expect("A holds K0");
    assert!(view.incarnation == 1 && view.until == 7 && state.session(0, 1).is_some_and(|r| r.expires <= state.clock));
    // Through a renewal: A renews at 4 (A1 until 6 on the server) and hears
    // the commit at 5, so counts A1 until 7; it releases K0 and takes it
    // again on the lean path at 5, holding until 7; at 6 A1 lapsed on the
    // server and B takes K0 over.
    let run = [AcquireStart(0, 0), Acquire(0), Tick, SendRenewal(0, 1), Renew(0), Tick, Renew(0)];
    let lean = [Release(0, 0), AcquireStart(0, 0)];
    let run =
        [&run[..], &lean, &[Acquire(0), Tick, AcquireStart(1, 0), Acquire(1), Acquire(1), Acquire(1), Acquire(1)]];
    assert!(replay(MySessionVariant::LeanFromReceipt, &run.concat()).two_live_views());
    // Shipped, A counts A1 from the renewal's send (until 6): at 5 one tick
    // is left, so A extends A1 instead of taking the lean path.
    let shipped = replay(MySessionVariant::Shipped, &[run[0], &lean].concat());
    assert!(shipped.clients[0].acquiring.is_some_and(|a| matches!(a.step, AcquireStep::Extending { .. })));
}

#[test]
fn e_a_one_statement_grant_over_a_lapsed_session_takes_a_renewed_one() {
    assert_counterexamples(MySessionVariant::SubqueryTakeover, &[MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH]);
    // The shortest run: A holds K0 (A1 until 5); at 4 A's renewal writes A1
    // until 6, holding the row's lock; at 5 B's grant, one UPDATE whose
    // subquery reads the committed A1 (lapsed) without waiting for that
    // lock, takes K0 and counts nothing; A's renewal commits, finds the
    // count unmoved and confirms K0.
    use MySessionAction::*;
    let run = [AcquireStart(0, 0), Acquire(0), Tick, SendRenewal(0, 1), Renew(0), Tick, AcquireStart(1, 0)];
    let run = [&run[..], &[Acquire(1), Renew(0)]].concat();
    let broken = replay(MySessionVariant::SubqueryTakeover, &run);
    assert!(broken.two_live_views() && broken.confirmed_a_gone_lease);
    // Shipped, B's grant leaves the row (it goes on to the consistent read).
    assert!(!replay(MySessionVariant::Shipped, &run).two_live_views());
}

#[test]
fn i_a_renewal_without_greatest_lowers_an_extension_it_started_before() {
    assert_counterexamples(MySessionVariant::RenewWithoutGreatest, &[MUTUAL_EXCLUSION]);
    // The shortest run: A holds K0 (A1 until 5) and sends a renewal at 3
    // (its now() is 3), then releases K0; at 4 A acquires K0 again, extends
    // A1 to 6 (counting until 6 from that send) and is granted; only then
    // does the renewal's UPDATE write A1 = 3 + 2 = 5 (without GREATEST) and
    // commit. A1 lapses at 5 on the server, A holds K0 until 6, and B takes
    // K0 over at 5.
    use MySessionAction::*;
    let run = [AcquireStart(0, 0), Acquire(0), SendRenewal(0, 1), Release(0, 0), Tick, AcquireStart(0, 0)];
    let run = [&run[..], &[Acquire(0), Acquire(0), Renew(0), Renew(0), Tick, AcquireStart(1, 0)]].concat();
    let run = [&run[..], &[Acquire(1), Acquire(1), Acquire(1), Acquire(1)]].concat();
    assert!(replay(MySessionVariant::RenewWithoutGreatest, &run).two_live_views());
    // Shipped, the renewal keeps A1 at 6: B's consistent read sees it live.
    let shipped = replay(MySessionVariant::Shipped, &run[..14]);
    assert!(shipped.clients[1].acquiring.is_none() && shipped.session(0, 1).is_some_and(|r| r.expires == 6));
}

#[test]
fn j_an_extension_without_greatest_lowers_a_renewal_beyond_the_bounds() {
    // Not found within the bounds: with one key the renewal it would
    // undercut cannot be sent after the extension (the client holds no
    // lease while it acquires the one key), and with TTL 2 an extension
    // runs with one tick left, after which no view lives to be renewed. At
    // two keys and TTL 4 (extension below two thirds: two ticks left): A
    // holds K1 (A1 until 7); at 5 A's acquire of K0 sends the extension
    // (now() 5); at 6 A renews A1 (until 10, counted from 6) and commits;
    // the extension then writes A1 = 5 + 4 = 9. At 9 A1 has lapsed, A
    // holds K1 until 10, and B takes K1 over.
    use MySessionAction::*;
    let bounds = |variant| MySessionModel { keys: 2, ttl: 4, horizon: 10, ..MySessionModel::new(variant) };
    let run = [AcquireStart(0, 1), Acquire(0), Tick, Tick, AcquireStart(0, 0), Tick, SendRenewal(0, 1)];
    let run = [&run[..], &[Renew(0), Renew(0), Acquire(0), Acquire(0), Tick, Tick, Tick, AcquireStart(1, 1)]].concat();
    let run = [&run[..], &[Acquire(1), Acquire(1), Acquire(1), Acquire(1)]].concat();
    assert!(replay_on(&bounds(MySessionVariant::ExtendWithoutGreatest), &run).two_live_views());
    // Shipped, the extension keeps A1 at 10: B's consistent read at 9 sees
    // it live.
    let shipped = replay_on(&bounds(MySessionVariant::Shipped), &run[..17]);
    assert!(shipped.clients[1].acquiring.is_none() && shipped.session(0, 1).is_some_and(|r| r.expires == 10));
}

#[test]
fn h_a_takeover_that_rechecks_but_does_not_count_is_undone_by_a_renewal_started_before_the_lapse() {
    assert_counterexamples(MySessionVariant::RecheckWithoutCount, &[MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH]);
    // The shortest run needs no clock step: A holds K0 (A1 until 5) and
    // sends a renewal at 4 (its now() is 4); at 5 B takes K0 over,
    // re-checking that A1 lapsed but counting nothing; A's renewal, whose
    // now() is still 4, finds A1 unexpired, extends it, finds the count
    // unmoved and confirms K0 (until 6). A clock step back does the same.
    use MySessionAction::*;
    let run = [AcquireStart(0, 0), Acquire(0), Tick, SendRenewal(0, 1), Tick, AcquireStart(1, 0), Acquire(1)];
    let run = [&run[..], &[Acquire(1), Acquire(1), Acquire(1), Renew(0), Renew(0)]].concat();
    let broken = replay(MySessionVariant::RecheckWithoutCount, &run);
    assert!(broken.two_live_views() && broken.confirmed_a_gone_lease);
    // Shipped, the takeover counted: the renewal finds 1, reads the rows
    // and forgets K0.
    let shipped = replay(MySessionVariant::Shipped, &[&run[..], &[Renew(0)]].concat());
    assert!(!shipped.two_live_views() && shipped.clients[0].views[0].is_none());
}

/// Two simplifications weighed, neither of which has a counterexample
/// within the bounds (complete explorations; README.md, Model 11): the
/// renewal's `expires_at > now()` re-check (not needed: a renewal of a
/// lapsed session reads the moved count under its lock), and `GREATEST` in
/// the acquire's extension (needed all the same: the bounds cannot reach
/// its hazard, which `j_` replays at two keys and TTL 4). Ignored in the
/// normal run for their time: `cargo test -p holdfast-models --test
/// mysql_session -- --ignored f_`.
#[test]
#[ignore = "two more complete explorations (about 50 s each); README.md records them"]
fn f_without_the_renewals_recheck_or_the_extensions_greatest_no_counterexample_within_the_bounds() {
    for variant in [MySessionVariant::RenewWithoutRecheck, MySessionVariant::ExtendWithoutGreatest] {
        let started = Instant::now();
        let checker = MySessionModel::new(variant).checker().spawn_dfs().join();
        println!(
            "mysql_session {variant:?}: complete={} unique states={} in {:.1?}",
            checker.is_done(),
            checker.unique_state_count(),
            started.elapsed()
        );
        assert!(checker.is_done());
        for property in [MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH] {
            assert!(checker.discovery(property).is_none(), "{variant:?}: {property} violated");
        }
    }
}

/// Shipped under larger bounds, run by hand: `MYSQL_SESSION_KEYS` (default
/// 1), `MYSQL_SESSION_HORIZON` (default 6), `MYSQL_SESSION_STATES` (a bound
/// on the states searched, revisits included, default 1,000,000,000; a
/// time limit would not stop a one-thread search, which keeps its own batch
/// of work).
#[test]
#[ignore = "larger bounds, by hand"]
fn g_shipped_under_larger_bounds() {
    let var = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let mut model = MySessionModel::new(MySessionVariant::Shipped);
    model.keys = var("MYSQL_SESSION_KEYS", 1) as u8;
    model.horizon = var("MYSQL_SESSION_HORIZON", 6) as u8;
    let bound = var("MYSQL_SESSION_STATES", 1_000_000_000);
    let started = Instant::now();
    let checker = model.clone().checker().target_state_count(bound).spawn_dfs().join();
    println!(
        "mysql_session Shipped, {} keys, horizon {}: complete={} unique states={} (of {} searched) in {:.1?}",
        model.keys,
        model.horizon,
        checker.is_done() && checker.state_count() < bound,
        checker.unique_state_count(),
        checker.state_count(),
        started.elapsed()
    );
    for property in [MUTUAL_EXCLUSION, RENEWAL_TELLS_THE_TRUTH] {
        assert!(checker.discovery(property).is_none(), "Shipped: {property} violated");
    }
}
