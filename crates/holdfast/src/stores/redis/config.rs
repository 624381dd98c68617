//! `redis://`, `rediss://`, `redis+sentinel://` and `redis+cluster://` URL parsing.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::backend::wait::PollBounds;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::secret::Secret;
use crate::vocabulary::url_options::{Opt, UrlOptions};
use crate::vocabulary::url_text::redact_url;

use super::cluster::{self, ClusterSettings};
use super::sentinel::{self, SentinelSettings};

/// Settings of the Redis store, from its URL.
///
/// `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// The server URL without holdfast's options: scheme, user, password, host, port, db.
    /// A [`Secret`] as a whole, since it holds the password.
    pub(super) server_url: Secret,
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
    /// Prefix of every Redis key and channel holdfast uses (`namespace`, alias `prefix`,
    /// default `holdfast`).
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
    /// Replicas that must acknowledge a grant or a renewal (`WAIT`) before it
    /// counts (`replicas`, default 0: no `WAIT`).
    pub replicas: u32,
    /// How long `WAIT` waits for them (`replicas_timeout_ms`, default half of
    /// `timeout_ms`, at most 1000; below `timeout_ms`).
    pub replicas_timeout: Duration,
    /// The sentinels and the master name, for `redis+sentinel://`.
    pub(super) sentinel: Option<SentinelSettings>,
    /// The seed nodes and the login, for `redis+cluster://`.
    pub(super) cluster: Option<ClusterSettings>,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("server", &redact_url(self.server_url.expose()))
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
            .field("replicas", &self.replicas)
            .field("replicas_timeout", &self.replicas_timeout)
            .field("sentinel", &self.sentinel)
            .field("cluster", &self.cluster)
            .finish()
    }
}

/// The options of `redis://` URLs (see the "URL options" table in the store's docs).
pub(crate) const OPTIONS: &[Opt] = &[
    Opt::new("timeout_ms"),
    Opt::new("connect_timeout_ms"),
    Opt::new("ca_file"),
    Opt::new("fair"),
    Opt::new("namespace").or(&["prefix"]),
    Opt::new("queue_ttl_ms"),
    Opt::new("fence_keep_ms"),
    Opt::new("poll_min_ms"),
    Opt::new("poll_max_ms"),
    Opt::new("renew_batch"),
    Opt::new("replicas"),
    Opt::new("replicas_timeout_ms"),
    Opt::new("sentinel_auth"),
];

/// Every duration option: 1 ms to a day.
const MS: std::ops::RangeInclusive<u64> = 1..=86_400_000;

impl RedisConfig {
    /// The server (or the sentinels, or the seed nodes) as `host:port,...`,
    /// for errors: never the password.
    pub(crate) fn endpoint(&self) -> String {
        let nodes = match (&self.sentinel, &self.cluster) {
            (Some(s), _) => &s.sentinels,
            (None, Some(c)) => &c.nodes,
            (None, None) => return crate::vocabulary::store_error::url_hosts(self.server_url.expose(), 6379),
        };
        crate::vocabulary::store_error::host_list(nodes.iter().map(|(h, p)| format!("{h}:{p}")))
    }

    /// Parses `redis://[user:pass@]host[:port][/db][?options]` or `rediss://...`.
    /// The options are in the "URL options" table of the store's docs.
    ///
    /// `redis+sentinel://[user:password@]host[:port],host[:port]/MASTER_NAME[/db][?options]`
    /// names the sentinels (port 26379 when left out) and the master name
    /// they monitor; the user and password log in to the master.
    ///
    /// `redis+cluster://[user:password@]host[:port][,host[:port]...][/][?options]`
    /// names seed nodes of a Redis Cluster (port 6379 when left out; any one
    /// that answers is enough); the user and password log in to every node.
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |reason: String| Error::invalid("url", reason);
        if cluster::strip_scheme(url).is_some() {
            let (main, query) = url.split_once('?').unwrap_or((url, ""));
            let main = main.split_once('#').map_or(main, |(m, _)| m);
            let settings = cluster::parse(main)?;
            let opts = UrlOptions::parse("redis", query, OPTIONS)?;
            if opts.str("ca_file").is_some() {
                return Err(bad("redis+cluster:// does not support TLS yet, so ca_file has no use".into()));
            }
            if opts.str("sentinel_auth").is_some() {
                return Err(bad("sentinel_auth needs a redis+sentinel:// URL".into()));
            }
            let mut config = Self::with_options(Secret::new(main), false, None, &opts)?;
            if config.replicas > 0 {
                return Err(bad(
                    "replicas=N is not supported with redis+cluster:// yet (WAIT would have to go to the master of each lock's slot)"
                        .into(),
                ));
            }
            config.cluster = Some(settings);
            return Ok(config);
        }
        if sentinel::strip_scheme(url).is_some() {
            let (main, query) = url.split_once('?').unwrap_or((url, ""));
            let main = main.split_once('#').map_or(main, |(m, _)| m);
            let mut settings = sentinel::parse(main)?;
            let opts = UrlOptions::parse("redis", query, OPTIONS)?;
            if opts.str("ca_file").is_some() {
                return Err(bad("redis+sentinel:// does not support TLS yet, so ca_file has no use".into()));
            }
            settings.auth_sentinels =
                opts.choice("sentinel_auth", &[("none", false), ("same", true)])?.unwrap_or(false);
            return Self::with_options(Secret::new(main), false, Some(settings), &opts);
        }
        let mut parsed = url::Url::parse(url)
            .map_err(|e| bad(format!("{}: {e}{}", redact_url(url), crate::vocabulary::url_text::slash_hint(url))))?;
        let tls = match parsed.scheme() {
            "redis" => false,
            "rediss" => true,
            other => return Err(bad(format!("{other:?} is not a redis:// or rediss:// URL"))),
        };
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(bad("a redis URL needs a host, e.g. redis://127.0.0.1:6379".into()));
        }
        let path = parsed.path().trim_start_matches('/');
        // With an '@' in it, the path may be the end of a password that
        // holds an unencoded '/': not quoted then.
        if path.contains('@') {
            return Err(bad(
                "the path of a redis URL is the database number, and has an '@' (write '/' in a password as %2F)"
                    .into(),
            ));
        }
        if !path.is_empty() && path.parse::<u32>().is_err() {
            return Err(bad(format!("the path of a redis URL is the database number, got {path:?}")));
        }
        let opts = UrlOptions::parse("redis", parsed.query().unwrap_or(""), OPTIONS)?;
        parsed.set_query(None);
        parsed.set_fragment(None);
        if opts.str("sentinel_auth").is_some() {
            return Err(bad("sentinel_auth needs a redis+sentinel:// URL".into()));
        }
        Self::with_options(Secret::new(parsed.to_string()), tls, None, &opts)
    }

    /// The config of `server_url` with the options `opts`.
    fn with_options(
        server_url: Secret,
        tls: bool,
        sentinel: Option<SentinelSettings>,
        opts: &UrlOptions,
    ) -> Result<Self> {
        let bad = |reason: String| Error::invalid("url", reason);
        // A lock's keys are `{namespace:key}...` and its channels
        // `namespace:w:{namespace:key}`: with no `:` or brace in the
        // namespace, its end is the first `:`, so two (namespace, key) pairs
        // never name one lock (`a` + `w:K` against `a:w` + `K`).
        let prefix = match opts.str("namespace") {
            None => "holdfast".to_owned(),
            Some(v) if v.is_empty() || v.len() > 64 || v.chars().any(|c| c.is_control() || "{}:".contains(c)) => {
                let given = opts.given_as("namespace").unwrap_or("namespace");
                return Err(bad(format!(
                    "{given} must be 1..64 chars without braces or ':' (they would make lock names ambiguous), got {v:?}"
                )));
            }
            Some(v) => v.to_owned(),
        };
        let timeout = opts.duration_ms("timeout_ms", MS)?.unwrap_or(Duration::from_secs(5));
        let poll = PollBounds {
            min: opts.duration_ms("poll_min_ms", MS)?.unwrap_or(Duration::from_millis(50)),
            max: opts.duration_ms("poll_max_ms", MS)?.unwrap_or(Duration::from_millis(100)),
        };
        if poll.max < poll.min {
            return Err(bad("need poll_min_ms <= poll_max_ms".into()));
        }
        let ca_file = opts.path("ca_file")?;
        if ca_file.is_some() && !tls {
            return Err(bad("ca_file needs a rediss:// URL".into()));
        }
        let replicas = opts.number("replicas", 0..=1000)?.unwrap_or(0);
        let replicas_timeout = match opts.duration_ms("replicas_timeout_ms", MS)? {
            Some(t) if t >= timeout => {
                return Err(bad(format!(
                    "replicas_timeout_ms ({}) must be below timeout_ms ({})",
                    t.as_millis(),
                    timeout.as_millis()
                )));
            }
            Some(t) => t,
            None => (timeout / 2).min(Duration::from_secs(1)),
        };
        Ok(RedisConfig {
            server_url,
            tls,
            ca_file,
            timeout,
            connect_timeout: opts.duration_ms("connect_timeout_ms", MS)?.unwrap_or(timeout),
            fair_default: opts.choice("fair", &[("default", true), ("opt-in", false)])?.unwrap_or(false),
            prefix,
            queue_ttl: opts
                .duration_ms("queue_ttl_ms", MS)?
                .map_or(Duration::from_millis(2000), |d| d.max(Duration::from_millis(100))),
            fence_keep: opts.duration_ms("fence_keep_ms", MS)?.unwrap_or(Duration::from_secs(600)),
            poll,
            renew_batch: opts.number("renew_batch", 1..=100_000)?.unwrap_or(1000),
            replicas,
            replicas_timeout,
            sentinel,
            cluster: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls_and_options() {
        let c =
            RedisConfig::from_url("redis://u:secret@127.0.0.1:6380/2?timeout_ms=700&fair=default&prefix=app").unwrap();
        assert_eq!(c.server_url.expose(), "redis://u:secret@127.0.0.1:6380/2");
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
            "redis://h?namespace=a:w",
            "redis://h?prefix=:",
            "redis://h?ca_file=/x",
            "redis://h?poll_min_ms=20&poll_max_ms=10",
            "http://h",
        ] {
            assert!(matches!(RedisConfig::from_url(bad), Err(Error::InvalidInput { .. })), "{bad}");
        }
        let err = RedisConfig::from_url("redis://u:topsecret@h/x").unwrap_err().to_string();
        assert!(!err.contains("topsecret"), "{err}");
    }

    /// A namespace with `:` is refused, naming the option: namespace `a`
    /// with key `w:K` and namespace `a:w` with key `K` would be one lock.
    #[test]
    fn a_namespace_with_a_colon_is_refused() {
        for (url, given) in [("redis://h?namespace=a:w", "namespace"), ("redis+cluster://h?prefix=a:w", "prefix")] {
            let err = RedisConfig::from_url(url).unwrap_err();
            assert!(matches!(err, Error::InvalidInput { what: "url", .. }), "{url}: {err:?}");
            let text = err.to_string();
            assert!(text.contains(given) && text.contains("':'"), "{text}");
        }
        assert_eq!(RedisConfig::from_url("redis://h?namespace=app.v2-x_y").unwrap().prefix, "app.v2-x_y");
    }

    /// Every option under its common name and under each older name: both
    /// spellings give the same config, and one that differs from the default.
    #[test]
    fn common_names_and_aliases() {
        let base = RedisConfig::from_url("rediss://h").unwrap();
        for (old, common) in [
            ("timeout_ms=700", "timeout_ms=700"),
            ("connect_timeout_ms=300", "connect_timeout_ms=300"),
            ("ca_file=/ca.pem", "ca_file=%2Fca.pem"),
            ("fair=default", "fair=default"),
            ("prefix=app", "namespace=app"),
            ("queue_ttl_ms=900", "queue_ttl_ms=900"),
            ("fence_keep_ms=1000", "fence_keep_ms=1000"),
            ("poll_min_ms=20", "poll_min_ms=20"),
            ("poll_max_ms=200", "poll_max_ms=200"),
            ("renew_batch=10", "renew_batch=10"),
            ("replicas=1", "replicas=1"),
            ("replicas_timeout_ms=300", "replicas_timeout_ms=300"),
        ] {
            let old = RedisConfig::from_url(&format!("rediss://h?{old}")).unwrap();
            assert_eq!(old, RedisConfig::from_url(&format!("rediss://h?{common}")).unwrap(), "{common}");
            assert_ne!(old, base, "{common} changed nothing");
        }
        let err = RedisConfig::from_url("redis://h?root=/x").unwrap_err().to_string();
        assert!(err.contains("\"root\"") && err.contains("namespace (or prefix)"), "{err}");
    }

    #[test]
    fn sentinel_urls_and_replica_options() {
        let c = RedisConfig::from_url(
            "redis+sentinel://:topsecret@127.0.0.1:26379,127.0.0.1:26380/mymaster/1?replicas=1&replicas_timeout_ms=200&sentinel_auth=same",
        )
        .unwrap();
        let s = c.sentinel.as_ref().unwrap();
        assert_eq!(s.sentinels.len(), 2);
        assert_eq!((s.master_name.as_str(), s.db, s.auth_sentinels), ("mymaster", 1, true));
        assert_eq!((c.replicas, c.replicas_timeout), (1, Duration::from_millis(200)));
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("topsecret"), "{dbg}");
        let d = RedisConfig::from_url("redis+sentinel://h/m?timeout_ms=600").unwrap();
        assert_eq!(
            (d.replicas, d.replicas_timeout, d.sentinel.unwrap().auth_sentinels),
            (0, Duration::from_millis(300), false)
        );
        for bad in [
            "redis+sentinel://h/m?ca_file=/x",
            "redis+sentinel://h/m?sentinel_auth=maybe",
            "redis+sentinel://h/m?replicas=-1",
            "redis+sentinel://h/m?replicas_timeout_ms=5000",
            "redis://h?sentinel_auth=same",
            "redis+sentinel://h",
        ] {
            assert!(matches!(RedisConfig::from_url(bad), Err(Error::InvalidInput { .. })), "{bad}");
        }
    }

    #[test]
    fn cluster_urls() {
        let c = RedisConfig::from_url(
            "redis+cluster://u:topsecret@127.0.0.1:7000,127.0.0.1:7001?timeout_ms=700&prefix=app&fair=default&renew_batch=10",
        )
        .unwrap();
        let s = c.cluster.as_ref().unwrap();
        assert_eq!(s.nodes, vec![("127.0.0.1".into(), 7000), ("127.0.0.1".into(), 7001)]);
        assert_eq!(
            (c.timeout, c.prefix.as_str(), c.fair_default, c.renew_batch),
            (Duration::from_millis(700), "app", true, 10)
        );
        assert!(c.sentinel.is_none() && !c.tls);
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("topsecret") && dbg.contains("***"), "{dbg}");
        assert!(RedisConfig::from_url("redis+cluster://h/0?replicas=0").is_ok());
        for bad in [
            "redis+cluster://u:topsecret@h/3",
            "redis+cluster://u:topsecret@h?ca_file=/x",
            "redis+cluster://u:topsecret@h?replicas=1",
            "redis+cluster://u:topsecret@h?sentinel_auth=same",
            "redis+cluster://u:topsecret@h?nope=1",
            "redis+cluster://u:topsecret@h?timeout_ms=0",
            "redis+cluster://u:topsecret@h?prefix=a{b",
            "rediss+cluster://u:topsecret@h",
            "redis+cluster://u:topsecret@",
        ] {
            let err = RedisConfig::from_url(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidInput { .. }), "{bad}");
            assert!(!err.to_string().contains("topsecret"), "{bad}: {err}");
        }
    }
}
