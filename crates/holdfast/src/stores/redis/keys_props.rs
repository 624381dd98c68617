//! Property tests of the Redis store's key names (`lock_keys`) and
//! millisecond arithmetic (`ms`).

use std::time::Duration;

use proptest::prelude::*;

use crate::vocabulary::prop_support::config;

use super::keys::lock_keys;
use super::ms;
use crate::vocabulary::key::LockKey;

/// The part of a key Redis Cluster hashes: between the first `{` and the
/// first `}` after it when that is not empty, else the whole key.
fn hash_tag(key: &str) -> &str {
    key.find('{')
        .and_then(|open| {
            let close = key[open + 1..].find('}')?;
            (close > 0).then(|| &key[open + 1..open + 1 + close])
        })
        .unwrap_or(key)
}

/// Lock keys with braces and colons, which a key may hold.
fn key_text() -> impl Strategy<Value = String> {
    prop_oneof!["[a{}:q]{1,8}", "[a-z{}:/é]{1,16}"]
}

proptest! {
    #![proptest_config(config())]

    /// A lock's four keys hash to one Redis Cluster slot (one hash tag,
    /// whatever braces the lock key holds), so its scripts may touch them
    /// all; two different locks never share a key.
    #[test]
    fn lock_keys_share_one_slot_and_locks_never_share_keys(
        a in key_text(),
        b in key_text(),
        prefix in "[a-z:_-]{1,8}",
    ) {
        let keys_a = lock_keys(&prefix, &LockKey::new(a.clone()).expect("key"));
        let keys_b = lock_keys(&prefix, &LockKey::new(b.clone()).expect("key"));
        let tag = hash_tag(&keys_a[0]);
        prop_assert!(keys_a.iter().all(|k| hash_tag(k) == tag), "{:?}", keys_a);
        prop_assert!(tag.starts_with(&format!("{prefix}:")), "{:?}", tag);
        if a != b {
            prop_assert!(keys_a.iter().all(|k| !keys_b.contains(k)), "{:?} and {:?}", keys_a, keys_b);
        }
        let mut distinct = keys_a.to_vec();
        distinct.sort();
        distinct.dedup();
        prop_assert_eq!(distinct.len(), 4);
    }

    /// Whole milliseconds, at least 1 (Redis refuses a zero expiry),
    /// saturating instead of overflowing at `Duration::MAX`.
    #[test]
    fn ms_is_whole_milliseconds_at_least_one(secs in any::<u64>(), nanos in 0u32..1_000_000_000, small in 0u64..5_000_000) {
        for d in [Duration::new(secs, nanos), Duration::from_nanos(small)] {
            let want = d.as_millis().clamp(1, u128::from(u64::MAX));
            prop_assert_eq!(u128::from(ms(d)), want, "{:?}", d);
        }
        prop_assert_eq!(ms(Duration::MAX), u64::MAX);
    }
}
