//! How `run`'s timing follows `--ttl`: when a command that may outlive its
//! lease is stopped, the default `--kill-after`, and ZooKeeper's session timeout.
//!
//! The rule: the SIGKILL must land before the store can grant the key to
//! anyone else. The library's local lease deadline already ends before the
//! store's (by its drift margin, 1% of the TTL). holdfast starts stopping
//! CMD (SIGTERM) once renewal has not succeeded and the time left on that
//! deadline has fallen to `--kill-after + margin`
//! ([`MutexGuard::expiring`](holdfast::MutexGuard::expiring)), and sends
//! SIGKILL `--kill-after` later: it lands `margin` before the deadline. The
//! margin, `min(25 ms, ttl/10) + ttl/50`, covers holdfast's own timer and
//! scheduling delays and the kernel's killing.
//!
//! Renewal runs every ttl/3, so right before a renewal comes back the lease
//! has about 2/3 ttl left. `--kill-after + margin` must stay below that or
//! every renewal would stop CMD: holdfast accepts up to ttl/2, which leaves
//! ttl/6 for a renewal's round trip before CMD is stopped.
//!
//! A store may vouch for less than `--ttl` at a time: a fallback chain for
//! at most half its mode TTL (5 s by default), ZooKeeper (alone or behind
//! `layered://`) for 3/4 of its session timeout, etcd for its session. The
//! library then renews every third of that shorter lease, and the rule above
//! applies to it, not to `--ttl`: [`StopTiming::fit_lease`] looks at the
//! lease right after the grant, derives the default `--kill-after` from it,
//! and refuses a given `--kill-after` that does not fit it before CMD starts.

use std::time::Duration;

use crate::exit::Failure;

/// The longest default `--kill-after`.
const MAX_DEFAULT_KILL_AFTER: Duration = Duration::from_secs(5);

/// When and how CMD is stopped once its lease is running out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StopTiming {
    /// From SIGTERM to SIGKILL.
    pub kill_after: Duration,
    /// How long before the local lease deadline the SIGKILL lands.
    pub margin: Duration,
}

impl StopTiming {
    /// For `ttl`, with `--kill-after` if given; a `--kill-after` that does not
    /// fit is a usage error saying what would.
    pub(crate) fn new(ttl: Duration, kill_after: Option<Duration>) -> Result<Self, Failure> {
        let margin = kill_margin(ttl);
        let longest = longest_warning(ttl);
        let kill_after = kill_after.unwrap_or_else(|| default_kill_after(ttl));
        if kill_after + margin > longest {
            let fits = longest.saturating_sub(margin);
            return Err(Failure::usage(format!(
                "--kill-after {} does not fit --ttl {}: SIGKILL must land before the lease can run out, so \
                 CMD gets SIGTERM when --kill-after + {} (a margin) is left on it, and that must be at most \
                 half the TTL, or CMD would be stopped between renewals; use --kill-after {} or less, or a longer --ttl",
                show(kill_after),
                show(ttl),
                show(margin),
                show(fits),
            )));
        }
        Ok(StopTiming { kill_after, margin })
    }

    /// The timing for the lease the store actually gave: `left` is the time
    /// left on the guard's local deadline right after the grant. A store
    /// that vouched for (nearly) the whole `ttl` keeps the timing from
    /// [`new`](Self::new); a shorter lease is what renewal then keeps up, so
    /// the default `--kill-after` and the margin follow it, and a given
    /// `--kill-after` that does not fit it is a usage error naming the value
    /// that would (CMD has not started yet).
    pub(crate) fn fit_lease(ttl: Duration, kill_after: Option<Duration>, left: Duration) -> Result<Self, Failure> {
        // The local deadline ends a drift margin (1%) and a round trip before
        // the store's: within 5% of the TTL is the TTL.
        if left >= ttl - ttl / 20 {
            return Self::new(ttl, kill_after);
        }
        let margin = kill_margin(left);
        let longest = longest_warning(left);
        let Some(given) = kill_after else {
            return Ok(StopTiming { kill_after: default_kill_after(left), margin });
        };
        if given + margin > longest {
            return Err(Failure::usage(format!(
                "--kill-after {} does not fit the lease the store gives: it vouches for {} at a time (less than \
                 --ttl {}: a fallback chain gives at most half its mode TTL, ZooKeeper 3/4 of its session), and \
                 CMD would be stopped between renewals; use --kill-after {} or less, or leave it out",
                show(given),
                show(left),
                show(ttl),
                show(longest.saturating_sub(margin)),
            )));
        }
        Ok(StopTiming { kill_after: given, margin })
    }

    /// The time left on the lease at which SIGTERM is sent.
    pub(crate) fn warning(&self) -> Duration {
        self.kill_after + self.margin
    }
}

/// `min(25 ms, ttl/10) + ttl/50`: a few tens of milliseconds for holdfast's
/// timers and the kernel, scaled down for TTLs so short that 25 ms would not
/// fit, plus 2% of the TTL for a process slowed by load.
pub(crate) fn kill_margin(ttl: Duration) -> Duration {
    Duration::from_millis(25).min(ttl / 10) + ttl / 50
}

/// `min(5 s, ttl/4)`: always fits, since ttl/4 + the margin is below ttl/2.
pub(crate) fn default_kill_after(ttl: Duration) -> Duration {
    MAX_DEFAULT_KILL_AFTER.min(ttl / 4)
}

/// The most time left on the lease at which CMD may be sent SIGTERM: ttl/2.
fn longest_warning(ttl: Duration) -> Duration {
    ttl / 2
}

/// Milliseconds exact, so that the largest `--kill-after` shown does fit.
fn show(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

/// The ZooKeeper URL `url` with a session timeout that follows `ttl`.
///
/// ZooKeeper frees a dead holder's lock when its session expires, 10 s after
/// the last heartbeat by default, whatever the TTL. So on `zk://` without a
/// `session_timeout` option, holdfast asks for one equal to `--ttl` (at most
/// the URL option's limit of one hour). The server grants a timeout within
/// `[2, 20] x tickTime` (4 s to 40 s with its default tickTime of 2 s): a
/// killed holdfast frees the key after `2 x tickTime` when `--ttl` is
/// shorter, after `20 x tickTime` when it is longer. Other URLs, and URLs
/// that set the option, are returned unchanged.
pub(crate) fn zk_session_fitting(url: &str, ttl: Duration) -> String {
    let is_zk = url
        .split_once("://")
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("zk") || scheme.eq_ignore_ascii_case("zookeeper"));
    if !is_zk {
        return url.to_owned();
    }
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let has_option = query
        .split('&')
        .map(|pair| pair.split_once('=').map_or(pair, |(k, _)| k))
        .any(|k| k == "session_timeout" || k == "session_timeout_ms");
    if has_option {
        return url.to_owned();
    }
    let ms = ttl.as_millis().clamp(1, 3_600_000);
    let separator = match url.split_once('?') {
        None => "?",
        Some((_, "")) => "",
        Some(_) if url.ends_with('&') => "",
        Some(_) => "&",
    };
    format!("{url}{separator}session_timeout={ms}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_default_kill_after_fits_every_ttl() {
        for ttl in [MS(50), MS(51), MS(100), MS(300), MS(2000), MS(30_000), MS(86_400_000)] {
            let timing = StopTiming::new(ttl, None).unwrap();
            assert!(timing.warning() <= ttl / 2, "{ttl:?}: {timing:?}");
            assert!(timing.kill_after > Duration::ZERO);
        }
        assert_eq!(StopTiming::new(MS(30_000), None).unwrap().kill_after, MS(5000));
        assert_eq!(StopTiming::new(MS(2000), None).unwrap(), StopTiming { kill_after: MS(500), margin: MS(65) });
    }

    #[test]
    fn a_kill_after_that_does_not_fit_is_refused_with_what_fits() {
        assert!(StopTiming::new(MS(10_000), Some(MS(4775))).is_ok());
        let e = StopTiming::new(MS(10_000), Some(MS(4776))).unwrap_err();
        assert_eq!(e.code, crate::exit::USAGE);
        assert!(e.message.contains("--kill-after 4s 775ms or less"), "{}", e.message);
        assert!(StopTiming::new(MS(2000), Some(MS(2000))).is_err());
        // Zero: SIGKILL right after SIGTERM, margin still kept.
        assert_eq!(StopTiming::new(MS(300), Some(Duration::ZERO)).unwrap().warning(), kill_margin(MS(300)));
    }

    #[test]
    fn a_shorter_lease_than_the_ttl_sets_the_timing() {
        let ttl = MS(30_000);
        // The whole TTL (less the drift margin and a round trip): as before.
        assert_eq!(StopTiming::fit_lease(ttl, None, MS(29_600)).unwrap(), StopTiming::new(ttl, None).unwrap());
        // A fallback chain's 5 s belief: the default follows it and fits it.
        let fitted = StopTiming::fit_lease(ttl, None, MS(4_940)).unwrap();
        assert_eq!(fitted.kill_after, MS(1_235));
        assert!(fitted.warning() <= MS(4_940) / 2, "{fitted:?}");
        // A given --kill-after that fits the TTL but not the lease is refused with what fits.
        let e = StopTiming::fit_lease(ttl, Some(MS(5_000)), MS(4_940)).unwrap_err();
        assert_eq!(e.code, crate::exit::USAGE);
        assert!(e.message.contains("use --kill-after 2s 346ms or less"), "{}", e.message);
        assert!(StopTiming::fit_lease(ttl, Some(MS(2_000)), MS(4_940)).is_ok());
    }

    #[test]
    fn zookeeper_asks_for_a_session_as_long_as_the_ttl() {
        let ttl = MS(2000);
        assert_eq!(zk_session_fitting("zk://h:1", ttl), "zk://h:1?session_timeout=2000");
        assert_eq!(zk_session_fitting("zookeeper://h:1", ttl), "zookeeper://h:1?session_timeout=2000");
        assert_eq!(
            zk_session_fitting("ZK://h:1/app?timeout=900", ttl),
            "ZK://h:1/app?timeout=900&session_timeout=2000"
        );
        assert_eq!(zk_session_fitting("zk://h:1?", ttl), "zk://h:1?session_timeout=2000");
        assert_eq!(zk_session_fitting("zk://h:1?session_timeout=300", ttl), "zk://h:1?session_timeout=300");
        assert_eq!(zk_session_fitting("zk://h:1?session_timeout_ms=300", ttl), "zk://h:1?session_timeout_ms=300");
        assert_eq!(zk_session_fitting("zk://h:1", MS(86_400_000)), "zk://h:1?session_timeout=3600000");
        assert_eq!(zk_session_fitting("redis://h:1", ttl), "redis://h:1");
    }

    #[cfg(feature = "all-backends")]
    #[test]
    fn the_session_option_is_the_one_the_zookeeper_store_reads() {
        let ttl = MS(2000);
        let parsed = holdfast::stores::zookeeper::ZkConfig::from_url(&zk_session_fitting("zk://h:1?poll_ms=5", ttl));
        assert_eq!(parsed.map(|c| c.session_timeout).ok(), Some(ttl));
    }
}
