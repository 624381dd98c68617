//! Property tests of the drift margin and a lease's local deadline
//! (`lease/mod.rs`): the deadline is always before the store's, by the
//! documented margin (1% of the TTL plus 1 ms), with no overflow at the
//! extremes.

use std::time::Duration;

use proptest::prelude::*;

use crate::vocabulary::prop_support::config;
use tokio::time::Instant;

use super::*;
use crate::backend::Grant;
use crate::vocabulary::key::{LockKey, OwnerToken};
use crate::vocabulary::key::{MAX_TTL, MIN_TTL};

/// A TTL in the accepted range, its ends often.
fn accepted_ttl() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(MIN_TTL),
        Just(MAX_TTL),
        (MIN_TTL.as_nanos() as u64..=MAX_TTL.as_nanos() as u64).prop_map(Duration::from_nanos),
        (MIN_TTL.as_millis() as u64..=120_000).prop_map(Duration::from_millis),
    ]
}

/// Any duration at all, `Duration::MAX` and zero included.
fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::MAX),
        Just(Duration::ZERO),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..=10_000_000_000).prop_map(Duration::from_nanos),
    ]
}

fn lease(ttl: Duration, started: Instant, valid_for: Duration) -> LeaseState {
    let key = LockKey::new("props/lease").expect("key");
    let grant = Grant { valid_for, ..Grant::new(1, started.into_std(), ttl) };
    LeaseState::new(key, OwnerToken::from_bytes([7; 16]), ttl, grant, crate::vocabulary::metrics::KeyMetrics::noop())
}

proptest! {
    #![proptest_config(config())]

    /// The margin is exactly 1% of the TTL (rounded down to the
    /// nanosecond) plus 1 ms, for every duration, without overflow; for an
    /// accepted TTL it is at least 1% and less than the TTL itself.
    #[test]
    fn margin_is_one_percent_plus_a_millisecond(ttl in any_duration()) {
        let margin = drift_margin(ttl);
        prop_assert_eq!(margin.as_nanos(), ttl.as_nanos() / 100 + 1_000_000, "{:?}", ttl);
        if (MIN_TTL..=MAX_TTL).contains(&ttl) {
            prop_assert!(margin * 100 >= ttl && margin < ttl, "{:?}: {:?}", ttl, margin);
        }
    }

    /// For any accepted TTL and any validity the store grants (longer than
    /// the TTL, `Duration::MAX`, or shorter where a session bounds it), the
    /// local deadline is the request time plus the validity (capped at the
    /// TTL) less its margin: strictly before request time + TTL.
    #[test]
    fn deadline_is_strictly_before_the_store_deadline(ttl in accepted_ttl(), valid_for in any_duration()) {
        let started = Instant::now();
        let state = lease(ttl, started, valid_for);
        let valid = valid_for.min(ttl);
        prop_assert_eq!(state.valid_for(), valid);
        prop_assert!(state.valid_until() < started + ttl, "{:?}/{:?}", ttl, valid_for);
        prop_assert!(state.valid_until() < started + valid);
        prop_assert_eq!(started + valid - state.valid_until(), drift_margin(valid));
        // The release horizon is after the store's own deadline.
        match state.release_horizon() {
            Horizon::At(at) => prop_assert!(at > started + valid),
            other => prop_assert!(false, "no session was given, got {:?}", other),
        }
    }

    /// A renewal sent at any time moves the deadline to sent + validity -
    /// margin, and never back.
    #[test]
    fn renewals_never_move_the_deadline_back(
        ttl in accepted_ttl(),
        offsets in prop::collection::vec(0u64..200_000, 1..6),
    ) {
        let started = Instant::now();
        let state = lease(ttl, started, ttl);
        let (mut expected, mut latest) = (state.valid_until(), started);
        for ms in offsets {
            let sent = started + Duration::from_millis(ms);
            state.extended(sent);
            expected = expected.max(sent + ttl - drift_margin(ttl));
            latest = latest.max(sent);
            prop_assert_eq!(state.valid_until(), expected);
            // Still before the store's deadline of the latest renewal.
            prop_assert!(state.valid_until() < latest + ttl);
        }
    }
}
