//! The names of a lock's keys, which of them an acquire or a release names,
//! and how long a waiter's mark on a lock lasts.

use std::time::Duration;

use super::config::RedisConfig;
use super::ms;
use crate::vocabulary::key::LockKey;

/// The ends of the four keys' names of a lock, after `{prefix:key`: the
/// lock hash, the fair queue and its entries, the shares. They share the
/// hash tag `{prefix:key}`, and each of the others is the hash's name with
/// `:q`, `:e` or `:s` added: outside a cluster, `acquire.lua` and
/// `release.lua` are passed the hash alone and name the others so (fewer
/// keys per call, issue 33; [`hot_path_keys`]).
const ENDS: [&str; 4] = ["}", "}:q", "}:e", "}:s"];

/// The lock hash (`H` in the scripts).
pub(super) const H: usize = 0;
/// The fair queue (`Q`).
pub(super) const Q: usize = 1;
/// The fair queue's entries (`E`).
pub(super) const E: usize = 2;
/// The shares (`S`).
pub(super) const S: usize = 3;

/// The parts of the name of one of a lock's keys (`which`: [`H`], [`Q`],
/// [`E`] or [`S`]), to write into a command without building a string: this
/// runs for every key of every call.
pub(super) fn key_parts<'a>(prefix: &'a str, key: &'a LockKey, which: usize) -> [&'a str; 5] {
    ["{", prefix, ":", key.as_str(), ENDS[which]]
}

/// The four keys of one lock, as strings ([`key_parts`] joined).
pub(super) fn lock_keys(prefix: &str, key: &LockKey) -> [String; 4] {
    [H, Q, E, S].map(|which| key_parts(prefix, key, which).concat())
}

/// The key of the record kept with a lock (`R` in the scripts): in the
/// lock's hash tag, so one script reaches it with the lock's keys. It ends
/// in `}:r`, which no other key of any lock ends in.
pub(super) fn record_key(prefix: &str, key: &LockKey) -> String {
    ["{", prefix, ":", key.as_str(), "}:r"].concat()
}

/// How long a waiter's mark on a lock (`mark_waiter` in the scripts) asks
/// releases to publish: twice the longest fallback poll, plus a second. A
/// waiting client attempts again at least once per longest poll, and each
/// refused attempt renews the mark once half of it has passed, so the mark
/// outlives every sleep of a live waiter.
pub(super) fn waiter_horizon(config: &RedisConfig) -> u64 {
    ms(config.poll.max * 2 + Duration::from_secs(1))
}

/// The keys an acquire or a release names (`all`: the lock's keys its
/// script may touch, the lock hash first). A single server or a Sentinel
/// master gets the hash alone: the script names the others from it (one
/// hash tag), and each key of a call cost the server about 0.25 µs (issue
/// 33). A cluster gets them all: while a slot migrates, Redis checks only
/// declared keys (a lock half moved answers `TRYAGAIN`), while a key the
/// script names itself would be read on the old master, missing.
pub(super) fn hot_path_keys<'a>(config: &RedisConfig, all: &'a [usize]) -> &'a [usize] {
    if config.cluster.is_some() { all } else { &all[..1] }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::key::LockKey;

    #[test]
    fn keys_share_one_hash_tag_and_never_collide() {
        let k = |s: &str| lock_keys("holdfast", &LockKey::new(s).unwrap());
        let [h, q, e, s] = k("orders/42");
        assert_eq!(h, "{holdfast:orders/42}");
        assert_eq!(q, "{holdfast:orders/42}:q");
        assert_eq!(e, "{holdfast:orders/42}:e");
        assert_eq!(s, "{holdfast:orders/42}:s");
        // acquire.lua and release.lua name Q, E and S from H so.
        assert_eq!([q.as_str(), e.as_str(), s.as_str()], [":q", ":e", ":s"].map(|end| format!("{h}{end}")));
        // A key that looks like another key's suffix still maps to other names.
        let all: std::collections::HashSet<String> =
            ["a", "a}:q", "a}:e", "a}:s", "a}", "a}:q}"].iter().flat_map(|s| k(s)).collect();
        assert_eq!(all.len(), 24);
    }
}
