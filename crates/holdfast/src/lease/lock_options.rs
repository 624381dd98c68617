//! How a lock is taken and kept: [`LockOptions`] and their checks.

use std::time::Duration;

use crate::lease::drift_margin;
use crate::vocabulary::error::{Error, Result};

/// Default lease TTL.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The shortest renewal period accepted: shorter ones hammer the store.
pub(crate) const MIN_RENEW_EVERY: Duration = Duration::from_millis(10);

/// How a lock is taken and kept. Set with the builder methods on
/// [`Mutex`](crate::Mutex), or built here and given to
/// [`Client::mutex_with_options`](crate::Client::mutex_with_options) or
/// [`Client::with_lock`](crate::Client::with_lock).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockOptions {
    /// Lease TTL on the store; default 30 s. A holder that vanishes frees the
    /// key within this time (on etcd and ZooKeeper: within the session
    /// timeout, see their docs).
    pub ttl: Duration,
    /// Grant in request order (stores that declare `fair`).
    pub fair: bool,
    /// Reentrancy: acquisitions with the same owner value through the same
    /// [`Client`](crate::Client) nest instead of waiting on each other.
    /// `None`: not reentrant.
    pub owner: Option<String>,
    /// Renew the lease while the guard lives (default `true`).
    pub auto_renew: bool,
    /// Renewal period; default `ttl / 3`. Must leave the renewal time to
    /// land before the lease runs out: between [`MIN_RENEW_EVERY`](Self::MIN_RENEW_EVERY) (and 1% of
    /// the TTL) and half the TTL less the drift margin (1% + 1 ms).
    pub renew_every: Option<Duration>,
    /// Stop renewing once the lock has been held this long; the lease then
    /// runs out within one TTL and `lost()` fires. `None`: no cap.
    pub max_hold: Option<Duration>,
    /// How long a waiting acquire ([`Mutex::acquire`](crate::Mutex::acquire),
    /// [`Client::with_lock`](crate::Client::with_lock)) waits before it fails
    /// with [`Error::Timeout`]; `None`: no limit.
    pub wait_timeout: Option<Duration>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: DEFAULT_TTL,
            fair: false,
            owner: None,
            auto_renew: true,
            renew_every: None,
            max_hold: None,
            wait_timeout: None,
        }
    }
}

impl LockOptions {
    /// The TTL of options built without one: 30 s.
    pub const DEFAULT_TTL: Duration = DEFAULT_TTL;
    /// The shortest lease TTL a store is asked for: 50 ms.
    pub const MIN_TTL: Duration = crate::vocabulary::key::MIN_TTL;
    /// The longest lease TTL a store is asked for: 24 hours.
    pub const MAX_TTL: Duration = crate::vocabulary::key::MAX_TTL;
    /// The shortest renewal period accepted: shorter ones hammer the store.
    pub const MIN_RENEW_EVERY: Duration = MIN_RENEW_EVERY;

    /// Checks a lease TTL against [`MIN_TTL`](Self::MIN_TTL) and
    /// [`MAX_TTL`](Self::MAX_TTL): [`Error::InvalidInput`] (`what = "ttl"`)
    /// outside them.
    pub fn check_ttl(ttl: Duration) -> Result<Duration> {
        crate::vocabulary::key::check_ttl(ttl)
    }

    /// How much earlier than the store the client counts a lease of `ttl`
    /// as over: 1% of the TTL for clock-rate drift between client and
    /// store, plus 1 ms. A guard's [`valid_until`](crate::Guard::valid_until)
    /// is the grant's time plus the TTL less this.
    pub fn drift_margin(ttl: Duration) -> Duration {
        drift_margin(ttl)
    }

    /// Options with the given TTL.
    pub fn with_ttl(ttl: Duration) -> Self {
        LockOptions { ttl, ..Self::default() }
    }

    /// The renewal period, checked: renewal must have time to land before the
    /// lease runs out (at most half the TTL), and must not hammer the store.
    pub(crate) fn renew_interval(&self) -> Result<Duration> {
        let every = self.renew_every.unwrap_or(self.ttl / 3);
        let floor = MIN_RENEW_EVERY.max(self.ttl / 100);
        let ceiling = (self.ttl / 2).saturating_sub(drift_margin(self.ttl)).max(self.ttl / 3);
        if every < floor || every > ceiling {
            return Err(Error::invalid(
                "renew_every",
                format!(
                    "the renewal period must be between {floor:?} and {ceiling:?} for a TTL of {:?} \
                     (shorter hammers the store; longer leaves no time to renew before the lease runs out), got {every:?}",
                    self.ttl
                ),
            ));
        }
        Ok(every)
    }
}

/// The builder setters of every handle that acquires with [`LockOptions`]
/// (a lock, a multi-lock, a segmented lock), written once: the handle keeps
/// its options in a field `opts`, and `$what` names what a setter applies
/// to in its docs ("the lock", "every part").
macro_rules! lock_option_setters {
    ($what:literal) => {
        #[doc = concat!("Sets the lease TTL of ", $what, " (default 30 s; between")]
        /// [`LockOptions::MIN_TTL`](crate::LockOptions::MIN_TTL) and
        /// [`LockOptions::MAX_TTL`](crate::LockOptions::MAX_TTL), checked at
        /// the acquire).
        pub fn ttl(mut self, ttl: std::time::Duration) -> Self {
            self.opts.ttl = ttl;
            self
        }

        #[doc = concat!("Sets the renewal period of ", $what, " (default `ttl / 3`; see")]
        /// [`LockOptions::renew_every`](crate::LockOptions::renew_every) for
        /// the accepted range).
        pub fn renew_every(mut self, every: std::time::Duration) -> Self {
            self.opts.renew_every = Some(every);
            self
        }

        #[doc = concat!("Caps the total hold time of ", $what, ": renewal stops after")]
        /// `max_hold` (one too long for the clock to count, such as
        /// `Duration::MAX`, is no cap), and the lease runs out within one TTL.
        pub fn max_hold(mut self, max_hold: std::time::Duration) -> Self {
            self.opts.max_hold = Some(max_hold);
            self
        }

        #[doc = concat!("Turns automatic renewal of ", $what, " off: a lease lasts one TTL")]
        /// from the request that got it (on etcd and ZooKeeper, where the
        /// session vouches for less than the TTL at a time, the client still
        /// checks the session until then; on Redis, a fair lock's lease
        /// handed off by a release lasts only its claim window, see the
        /// store's docs). [`Guard::valid_until`](crate::Guard::valid_until)
        /// says when it ends.
        pub fn no_renew(mut self) -> Self {
            self.opts.auto_renew = false;
            self
        }
    };
}
pub(crate) use lock_option_setters;

/// The holder label of a client built without one: `host:pid`.
pub(crate) fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renew_every_bounds() {
        let ttl = Duration::from_secs(3);
        let with =
            |every_ms| LockOptions { renew_every: Some(Duration::from_millis(every_ms)), ..LockOptions::with_ttl(ttl) };
        assert_eq!(LockOptions::with_ttl(ttl).renew_interval().unwrap(), Duration::from_secs(1));
        assert!(with(1400).renew_interval().is_ok());
        for bad in [0, 5, 29, 1600, 2999, 3000, 10_000] {
            assert!(
                matches!(with(bad).renew_interval(), Err(Error::InvalidInput { what: "renew_every", .. })),
                "{bad}"
            );
        }
    }
}
