//! `sqlite://PATH[?options]` parsing.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::wait::PollBounds;

/// Settings of the SQLite store, from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    /// The database file; created with its directory if missing.
    pub path: PathBuf,
    /// `synchronous=full`: fsync every commit, so fences also survive an OS
    /// crash or power loss. Default `normal` (survives process crashes).
    pub synchronous_full: bool,
    /// How long a transaction waits for another process's write lock.
    pub busy_timeout: Duration,
    /// Fallback poll bounds for waiters in other processes.
    pub poll: PollBounds,
}

impl SqliteConfig {
    /// Parses `sqlite://PATH?synchronous=full&busy_timeout_ms=5000&poll_max_ms=10`.
    /// `sqlite:///abs/path.db` is absolute, `sqlite://rel/path.db` relative.
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("sqlite://")
            .ok_or_else(|| Error::invalid("url", format!("{url:?} is not a sqlite:// URL")))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if path.is_empty() {
            return Err(Error::invalid("url", "sqlite:// needs a file path, e.g. sqlite:///var/lib/app/locks.db"));
        }
        let mut config = SqliteConfig {
            path: PathBuf::from(path),
            synchronous_full: false,
            busy_timeout: Duration::from_secs(5),
            poll: PollBounds { min: Duration::from_millis(1), max: Duration::from_millis(10) },
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let ms = || {
                v.parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| Error::invalid("url", format!("sqlite option {k} needs milliseconds, got {v:?}")))
            };
            match k {
                "synchronous" => {
                    config.synchronous_full = match v {
                        "full" => true,
                        "normal" => false,
                        _ => {
                            return Err(Error::invalid(
                                "url",
                                format!("synchronous must be full or normal, got {v:?}"),
                            ));
                        }
                    }
                }
                "busy_timeout_ms" => config.busy_timeout = ms()?,
                "poll_min_ms" => config.poll.min = ms()?,
                "poll_max_ms" => config.poll.max = ms()?,
                _ => return Err(Error::invalid("url", format!("unknown sqlite option {k:?}"))),
            }
        }
        if config.poll.min.is_zero() || config.poll.max < config.poll.min {
            return Err(Error::invalid("url", "need 0 < poll_min_ms <= poll_max_ms"));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths_and_options() {
        let c = SqliteConfig::from_url("sqlite:///tmp/x.db?synchronous=full&poll_max_ms=20").unwrap();
        assert_eq!(c.path, PathBuf::from("/tmp/x.db"));
        assert!(c.synchronous_full);
        assert_eq!(c.poll.max, Duration::from_millis(20));
        assert_eq!(SqliteConfig::from_url("sqlite://rel.db").unwrap().path, PathBuf::from("rel.db"));
        for bad in ["sqlite://", "sqlite:///x?nope=1", "sqlite:///x?synchronous=off", "sqlite:///x?poll_min_ms=0"] {
            assert!(matches!(SqliteConfig::from_url(bad), Err(Error::InvalidInput { .. })), "{bad}");
        }
    }
}
