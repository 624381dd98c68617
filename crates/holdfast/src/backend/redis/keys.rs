//! The names of a lock's keys, and how long a waiter's mark on a lock lasts.

use std::time::Duration;

use super::config::RedisConfig;
use super::ms;
use crate::key::LockKey;

/// The four keys of one lock (the lock hash, the fair queue and its
/// entries, the shares); they share the hash tag `{prefix:key}`.
pub(super) fn lock_keys(prefix: &str, key: &LockKey) -> [String; 4] {
    // Built by hand, not with format!: this runs twice per lock cycle.
    let mut h = String::with_capacity(prefix.len() + key.as_str().len() + 5);
    h.push('{');
    h.push_str(prefix);
    h.push(':');
    h.push_str(key.as_str());
    h.push('}');
    let suffixed = |suffix: &str| {
        let mut k = String::with_capacity(h.len() + 2);
        k.push_str(&h);
        k.push_str(suffix);
        k
    };
    let (q, e, s) = (suffixed(":q"), suffixed(":e"), suffixed(":s"));
    [h, q, e, s]
}

/// How long a waiter's mark on a lock (`mark_waiter` in the scripts) asks
/// releases to publish: twice the longest fallback poll, plus a second. A
/// waiting client attempts again at least once per longest poll, and each
/// refused attempt renews the mark once half of it has passed, so the mark
/// outlives every sleep of a live waiter.
pub(super) fn waiter_horizon(config: &RedisConfig) -> u64 {
    ms(config.poll.max * 2 + Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::LockKey;

    #[test]
    fn keys_share_one_hash_tag_and_never_collide() {
        let k = |s: &str| lock_keys("holdfast", &LockKey::new(s).unwrap());
        let [h, q, e, s] = k("orders/42");
        assert_eq!(h, "{holdfast:orders/42}");
        assert_eq!(q, "{holdfast:orders/42}:q");
        assert_eq!(e, "{holdfast:orders/42}:e");
        assert_eq!(s, "{holdfast:orders/42}:s");
        // A key that looks like another key's suffix still maps to other names.
        let all: std::collections::HashSet<String> =
            ["a", "a}:q", "a}:e", "a}:s", "a}", "a}:q}"].iter().flat_map(|s| k(s)).collect();
        assert_eq!(all.len(), 24);
    }
}
