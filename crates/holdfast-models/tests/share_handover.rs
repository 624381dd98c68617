//! Checks the local hand-over of a permit (Model 16): the shipped design
//! (the store releases the releaser's live permit and admits the waiter by
//! the semaphore's own rule, reservations ahead included, with a new fence;
//! the waiter counts the lease from the releaser's send; after a call
//! without a reply the releaser's own release comes before anything it
//! tells the waiter; a granting hand-over tells the lock's channel when the
//! first reservation in line fits beside the permits held; a hand-over that
//! finds the key's stamp unmoved grants without reading the entries) has no
//! counterexample over a complete exploration; each rejected variant has
//! one.
//!
//! Run with `--nocapture` to see the counterexamples, state counts and times;
//! README.md records them.

use std::time::Instant;

use holdfast_models::share_handover::{
    FENCES_INCREASE, HAND_OVER_BESIDE_RESERVATION, HAND_OVER_BY_STAMP, HAND_OVER_HAPPENS,
    HAND_OVER_REFUSED_FOR_RESERVATION, HAND_OVER_TELLS, NO_BYPASS, NO_LEAKED_GRANT, NO_UNTOLD_PERMIT, PERMIT_LIMIT,
    STORE_LIMIT, ShareHandOverModel, ShareHandOverVariant,
};
use holdfast_models::trace::assert_shortest_counterexamples;
use stateright::{Checker, Model};

fn assert_counterexamples(variant: ShareHandOverVariant, expected: &[&'static str]) {
    let model = ShareHandOverModel::new(variant);
    let label = format!("share_handover {variant:?}");
    assert_shortest_counterexamples(&model, model.clone(), Clone::clone, &label, expected);
}

/// `variant` explored completely, with every safety property checked.
fn explored(variant: ShareHandOverVariant) -> impl Checker<ShareHandOverModel> {
    let started = Instant::now();
    let checker =
        ShareHandOverModel::new(variant).checker().threads(holdfast_models::exploration_threads()).spawn_dfs().join();
    println!(
        "share_handover {variant:?}: complete={} unique states={} in {:.1?}",
        checker.is_done(),
        checker.unique_state_count(),
        started.elapsed()
    );
    assert!(checker.is_done());
    for property in [PERMIT_LIMIT, STORE_LIMIT, FENCES_INCREASE, NO_LEAKED_GRANT, NO_BYPASS, NO_UNTOLD_PERMIT] {
        if let Some(path) = checker.discovery(property) {
            panic!("{variant:?}: {property} violated:\n{}", holdfast_models::trace::readable_trace(&path));
        }
    }
    checker
}

#[test]
fn a_the_shipped_share_hand_over_holds_over_a_complete_exploration() {
    let checker = explored(ShareHandOverVariant::Shipped);
    for property in [
        HAND_OVER_HAPPENS,
        HAND_OVER_REFUSED_FOR_RESERVATION,
        HAND_OVER_BESIDE_RESERVATION,
        HAND_OVER_TELLS,
        HAND_OVER_BY_STAMP,
    ] {
        assert!(checker.discovery(property).is_some(), "Shipped: never reached: {property}");
    }
}

/// MySQL/MariaDB's hand-over (`NAME_share_pass1`, withdrawn for its speed,
/// not its safety): the same properties
/// over a complete exploration; it hands over and is refused for a
/// reservation, but never grants beside one (so it has none to tell) and
/// has no stamp.
#[test]
fn a_mysql_pass_holds_over_a_complete_exploration() {
    let checker = explored(ShareHandOverVariant::MysqlPass);
    for property in [HAND_OVER_HAPPENS, HAND_OVER_REFUSED_FOR_RESERVATION] {
        assert!(checker.discovery(property).is_some(), "MysqlPass: never reached: {property}");
    }
    for property in [HAND_OVER_BESIDE_RESERVATION, HAND_OVER_TELLS, HAND_OVER_BY_STAMP] {
        assert!(checker.discovery(property).is_none(), "MysqlPass: reached: {property}");
    }
}

#[test]
fn b_without_the_lease_check_a_released_permit_is_handed_on() {
    assert_counterexamples(ShareHandOverVariant::NoLeaseCheck, &[NO_LEAKED_GRANT]);
}

#[test]
fn c_a_straight_swap_passes_over_another_process() {
    assert_counterexamples(ShareHandOverVariant::SwapIgnoringReservations, &[NO_BYPASS]);
}

#[test]
fn d_keeping_the_fence_breaks_fence_order() {
    assert_counterexamples(ShareHandOverVariant::KeepFence, &[FENCES_INCREASE]);
}

#[test]
fn e_a_lease_counted_from_the_reply_grants_too_many() {
    assert_counterexamples(ShareHandOverVariant::LeaseFromReply, &[PERMIT_LIMIT]);
}

#[test]
fn f_telling_the_waiter_before_the_own_release_leaks_a_grant() {
    assert_counterexamples(ShareHandOverVariant::TellBeforeRelease, &[NO_LEAKED_GRANT]);
}

#[test]
fn g_a_silent_grant_leaves_a_reserved_waiter_asleep_beside_a_free_permit() {
    assert_counterexamples(ShareHandOverVariant::SilentGrant, &[NO_UNTOLD_PERMIT]);
}

#[test]
fn h_a_stamp_cleared_by_new_clients_only_passes_over_an_older_clients_reservation() {
    assert_counterexamples(ShareHandOverVariant::StampClearedByNewClients, &[NO_BYPASS]);
}
