//! `redis://` and `rediss://` URL parsing.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::wait::PollBounds;

/// Settings of the Redis store, from its URL.
///
/// `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// The server URL without holdfast's options: scheme, user, password, host, port, db.
    pub(super) server_url: String,
    /// TLS (`rediss://`).
    pub tls: bool,
    /// A PEM file of CA certificates to trust for TLS instead of the system store (`ca_file=`).
    pub ca_file: Option<PathBuf>,
    /// Time limit of every store operation (`timeout_ms`, default 5000).
    pub timeout: Duration,
    /// Time limit of establishing a connection (`connect_timeout_ms`, default `timeout_ms`).
    pub connect_timeout: Duration,
    /// Every lock is fair, asked or not (`fair=default`; `fair=opt-in`, the default, makes
    /// only locks built with `.fair(true)` fair).
    pub fair_default: bool,
    /// Prefix of every Redis key and channel holdfast uses (`prefix=`, default `holdfast`).
    pub prefix: String,
    /// How long a fair waiter's queue entry lives without a refresh (`queue_ttl_ms`, default
    /// 2000). A waiter refreshes it every quarter of this; a dead waiter's entry is gone
    /// after at most this long.
    pub queue_ttl: Duration,
    /// How long a lock's last fence is kept after its last lease ended, released or expired
    /// (`fence_keep_ms`, default 600000): within it, fences of the lock stay strictly
    /// increasing whatever the server clock does.
    pub fence_keep: Duration,
    /// Fallback poll of non-fair waiters, backing up pub/sub (`poll_min_ms` / `poll_max_ms`,
    /// default 50 / 100).
    pub poll: PollBounds,
    /// Leases per renewal script call (`renew_batch`, default 1000).
    pub renew_batch: usize,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("server", &redacted(&self.server_url))
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("fair_default", &self.fair_default)
            .field("prefix", &self.prefix)
            .field("queue_ttl", &self.queue_ttl)
            .field("fence_keep", &self.fence_keep)
            .field("poll", &self.poll)
            .field("renew_batch", &self.renew_batch)
            .finish()
    }
}

/// The URL with any password replaced by `***`.
pub(super) fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.set_query(None);
            u.to_string()
        }
        Err(_) => "<unparsable url>".to_owned(),
    }
}

impl RedisConfig {
    /// Parses `redis://[user:pass@]host[:port][/db][?options]` or `rediss://...`.
    ///
    /// Options: `timeout_ms`, `connect_timeout_ms`, `ca_file`, `fair=default|opt-in`,
    /// `prefix`, `queue_ttl_ms`, `fence_keep_ms`, `poll_min_ms`, `poll_max_ms`, `renew_batch`.
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |reason: String| Error::invalid("url", reason);
        let mut parsed = url::Url::parse(url).map_err(|e| bad(format!("{}: {e}", redacted(url))))?;
        let tls = match parsed.scheme() {
            "redis" => false,
            "rediss" => true,
            other => return Err(bad(format!("{other:?} is not a redis:// or rediss:// URL"))),
        };
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(bad("a redis URL needs a host, e.g. redis://127.0.0.1:6379".into()));
        }
        let path = parsed.path().trim_start_matches('/');
        if !path.is_empty() && path.parse::<u32>().is_err() {
            return Err(bad(format!("the path of a redis URL is the database number, got {path:?}")));
        }
        let mut config = RedisConfig {
            server_url: String::new(),
            tls,
            ca_file: None,
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::ZERO,
            fair_default: false,
            prefix: "holdfast".to_owned(),
            queue_ttl: Duration::from_millis(2000),
            fence_keep: Duration::from_secs(600),
            poll: PollBounds { min: Duration::from_millis(50), max: Duration::from_millis(100) },
            renew_batch: 1000,
        };
        let mut connect_timeout = None;
        for (k, v) in parsed.query_pairs() {
            let ms = || {
                v.parse::<u64>()
                    .ok()
                    .filter(|ms| *ms > 0 && *ms <= 86_400_000)
                    .map(Duration::from_millis)
                    .ok_or_else(|| bad(format!("redis option {k} needs milliseconds (1..86400000), got {v:?}")))
            };
            match k.as_ref() {
                "timeout_ms" => config.timeout = ms()?,
                "connect_timeout_ms" => connect_timeout = Some(ms()?),
                "ca_file" => config.ca_file = Some(PathBuf::from(v.as_ref())),
                "fair" => {
                    config.fair_default = match v.as_ref() {
                        "default" => true,
                        "opt-in" => false,
                        _ => return Err(bad(format!("fair must be default or opt-in, got {v:?}"))),
                    }
                }
                "prefix" => {
                    if v.is_empty() || v.len() > 64 || v.chars().any(|c| c.is_control() || "{}".contains(c)) {
                        return Err(bad(format!("prefix must be 1..64 chars without braces, got {v:?}")));
                    }
                    config.prefix = v.into_owned();
                }
                "queue_ttl_ms" => config.queue_ttl = ms()?.max(Duration::from_millis(100)),
                "fence_keep_ms" => config.fence_keep = ms()?,
                "poll_min_ms" => config.poll.min = ms()?,
                "poll_max_ms" => config.poll.max = ms()?,
                "renew_batch" => {
                    config.renew_batch = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=100_000).contains(n))
                        .ok_or_else(|| bad(format!("renew_batch must be 1..100000, got {v:?}")))?
                }
                _ => return Err(bad(format!("unknown redis option {k:?}"))),
            }
        }
        if config.poll.max < config.poll.min {
            return Err(bad("need poll_min_ms <= poll_max_ms".into()));
        }
        if config.ca_file.is_some() && !tls {
            return Err(bad("ca_file needs a rediss:// URL".into()));
        }
        config.connect_timeout = connect_timeout.unwrap_or(config.timeout);
        parsed.set_query(None);
        parsed.set_fragment(None);
        config.server_url = parsed.to_string();
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls_and_options() {
        let c =
            RedisConfig::from_url("redis://u:secret@127.0.0.1:6380/2?timeout_ms=700&fair=default&prefix=app").unwrap();
        assert_eq!(c.server_url, "redis://u:secret@127.0.0.1:6380/2");
        assert_eq!(c.timeout, Duration::from_millis(700));
        assert_eq!(c.connect_timeout, Duration::from_millis(700));
        assert!(c.fair_default && !c.tls);
        assert_eq!(c.prefix, "app");
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("secret") && dbg.contains("***"), "{dbg}");
        let t = RedisConfig::from_url("rediss://h:1?ca_file=/etc/ca.pem").unwrap();
        assert!(t.tls);
        assert_eq!(t.ca_file.as_deref(), Some(std::path::Path::new("/etc/ca.pem")));
        for bad in [
            "redis://",
            "redis://h/notadb",
            "redis://h?nope=1",
            "redis://h?timeout_ms=0",
            "redis://h?fair=maybe",
            "redis://h?prefix=a{b",
            "redis://h?ca_file=/x",
            "redis://h?poll_min_ms=20&poll_max_ms=10",
            "http://h",
        ] {
            assert!(matches!(RedisConfig::from_url(bad), Err(Error::InvalidInput { .. })), "{bad}");
        }
        let err = RedisConfig::from_url("redis://u:topsecret@h/x").unwrap_err().to_string();
        assert!(!err.contains("topsecret"), "{err}");
    }
}
