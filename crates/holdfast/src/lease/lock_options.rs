//! How a lock is taken and kept: [`LockOptions`] and their checks.

use std::time::Duration;

use crate::lease::drift_margin;
use crate::vocabulary::error::{Error, Result};

/// Default lease TTL.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The shortest renewal period accepted: shorter ones hammer the store.
pub const MIN_RENEW_EVERY: Duration = Duration::from_millis(10);

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
    /// land before the lease runs out: between [`MIN_RENEW_EVERY`] (and 1% of
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
