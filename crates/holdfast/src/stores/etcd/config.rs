//! `etcd://` and `etcds://` URL parsing.

use std::path::PathBuf;
use std::time::Duration;

use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::secret::Secret;
use crate::vocabulary::url_options::{Opt, UrlOptions, percent_decode};

/// Settings of the etcd store, from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// The client endpoints as `http://host:port` (or `https://` with TLS).
    pub endpoints: Vec<String>,
    /// TLS (`etcds://`).
    pub tls: bool,
    /// A PEM file of the CA that signed the servers' certificates (`ca_file`).
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate and its key for mutual TLS (`cert_file`, `key_file`).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// The user name for etcd's authentication, if any.
    pub user: Option<String>,
    password: Option<Secret>,
    /// The prefix of every key this store writes (`namespace`, alias `prefix`,
    /// default `holdfast/`).
    pub prefix: String,
    /// How long one operation may take, retries on other endpoints included
    /// (`timeout_ms`, default 5000).
    pub timeout: Duration,
    /// How long a TCP/TLS connect may take (`connect_timeout_ms`, default 1000).
    pub connect_timeout: Duration,
    /// The shortest session lease, in whole seconds (`session_timeout_ms`
    /// rounded up, or `session_ttl` in seconds; default 1).
    /// A lock's lease is `max(ceil(ttl), session_ttl)` seconds; the server may
    /// raise it to its own minimum.
    pub session_ttl_secs: i64,
}

fn bad(reason: impl Into<String>) -> Error {
    Error::invalid("url", reason)
}

/// The options of `etcd://` URLs (see the "URL options" table in the store's docs).
pub(crate) const OPTIONS: &[Opt] = &[
    Opt::new("namespace").or(&["prefix"]),
    Opt::new("timeout_ms"),
    Opt::new("connect_timeout_ms"),
    Opt::new("session_timeout_ms").or_seconds(&["session_ttl"]),
    Opt::new("ca_file"),
    Opt::new("cert_file"),
    Opt::new("key_file"),
];

/// Every duration option: 1 ms to a day.
const MS: std::ops::RangeInclusive<u64> = 1..=86_400_000;

impl EtcdConfig {
    /// The endpoints as `host:port,...`, for errors.
    pub(crate) fn endpoint(&self) -> String {
        crate::vocabulary::store_error::host_list(
            self.endpoints.iter().map(|e| e.split_once("://").map_or(&e[..], |(_, h)| h)),
        )
    }

    /// The password, if any (never printed by `Debug`).
    pub fn password(&self) -> Option<&str> {
        self.password.as_ref().map(Secret::expose)
    }

    /// Parses `etcd://[user:pass@]host:port[,host:port...][/][?options]`
    /// (`etcds://` for TLS). The options are in the "URL options" table of
    /// the store's docs. A host without a port gets 2379.
    pub fn from_url(url: &str) -> Result<Self> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("not an etcd:// or etcds:// URL"))?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "etcd" => false,
            "etcds" => true,
            _ => return Err(bad(format!("{scheme:?} is not etcd:// or etcds://"))),
        };
        let (authority, query) = rest.split_once('?').unwrap_or((rest, ""));
        let authority = authority.strip_suffix('/').unwrap_or(authority);
        if authority.contains('/') {
            return Err(bad(format!(
                "an etcd URL has no path; use the prefix option for a namespace{}",
                crate::vocabulary::url_text::slash_hint(url)
            )));
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(u) => {
                let (name, pass) = u.split_once(':').unwrap_or((u, ""));
                if name.is_empty() {
                    return Err(bad("the etcd URL names a password but no user"));
                }
                let name = percent_decode(name, "the user of an etcd URL")?;
                (Some(name), Some(Secret::new(percent_decode(pass, "the password of an etcd URL")?)))
            }
        };
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            if host.is_empty() {
                return Err(bad("an etcd URL needs host:port[,host:port...]"));
            }
            let has_port = match host.rfind(']') {
                Some(end) => host[end..].contains(':'),
                None => host.contains(':'),
            };
            if let Some(port) = has_port.then(|| host.rsplit(':').next()).flatten() {
                if port.parse::<u16>().is_err() {
                    return Err(bad(format!("bad port in etcd endpoint {host:?}")));
                }
            }
            if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(bad(format!("bad etcd endpoint {host:?}")));
            }
            let host = if has_port { host.to_owned() } else { format!("{host}:2379") };
            endpoints.push(format!("{}://{host}", if tls { "https" } else { "http" }));
        }
        let opts = UrlOptions::parse("etcd", query, OPTIONS)?;
        let client_cert = match (opts.path("cert_file")?, opts.path("key_file")?) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err(bad("cert_file and key_file go together")),
        };
        let config = EtcdConfig {
            endpoints,
            tls,
            ca_file: opts.path("ca_file")?,
            client_cert,
            user,
            password,
            prefix: opts.str("namespace").unwrap_or("holdfast/").to_owned(),
            timeout: opts.duration_ms("timeout_ms", MS)?.unwrap_or(Duration::from_secs(5)),
            connect_timeout: opts.duration_ms("connect_timeout_ms", MS)?.unwrap_or(Duration::from_secs(1)),
            // etcd leases are whole seconds.
            session_ttl_secs: opts
                .duration_ms("session_timeout_ms", MS)?
                .map_or(1, |d| d.as_millis().div_ceil(1000) as i64),
        };
        if !tls && (config.ca_file.is_some() || config.client_cert.is_some()) {
            return Err(bad("ca_file, cert_file and key_file need etcds://"));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints_auth_and_options() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379,127.0.0.2:2380").unwrap();
        assert_eq!(c.endpoints, vec!["http://127.0.0.1:2379", "http://127.0.0.2:2380"]);
        assert!(!c.tls && c.user.is_none() && c.password().is_none());
        let c = EtcdConfig::from_url(
            "etcds://bob:p%40ss:w@h1,[::1]:23/?ca_file=/ca.pem&prefix=app/&timeout_ms=900&session_ttl=5",
        )
        .unwrap();
        assert_eq!(c.endpoints, vec!["https://h1:2379", "https://[::1]:23"]);
        assert_eq!((c.user.as_deref(), c.password()), (Some("bob"), Some("p@ss:w")));
        assert_eq!(c.ca_file, Some(PathBuf::from("/ca.pem")));
        assert_eq!((c.prefix.as_str(), c.timeout, c.session_ttl_secs), ("app/", Duration::from_millis(900), 5));
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("p@ss") && dbg.contains("***"), "{dbg}");
        for bad in [
            "etcd://",
            "etcd://h:1,",
            "etcd://h:notaport",
            "etcd://h:1/path",
            "etcd://h:1?nope=1",
            "etcd://h:1?timeout_ms=0",
            "etcd://h:1?session_ttl=0",
            "etcd://h:1?ca_file=/x",
            "etcds://h:1?cert_file=/x",
            "etcd://:pw@h:1",
            "etcd://u:%zz@h:1",
            "redis://h:1",
        ] {
            assert!(matches!(EtcdConfig::from_url(bad), Err(Error::InvalidInput { what: "url", .. })), "{bad}");
        }
    }

    /// Every option under its common name and under each older name: both
    /// spellings give the same config, and one that differs from the default.
    #[test]
    fn common_names_and_aliases() {
        let base = EtcdConfig::from_url("etcds://h:1").unwrap();
        for (old, common) in [
            ("prefix=app/", "namespace=app%2F"),
            ("timeout_ms=900", "timeout_ms=900"),
            ("connect_timeout_ms=300", "connect_timeout_ms=300"),
            ("session_ttl=5", "session_timeout_ms=5000"),
            ("session_ttl=2", "session_timeout_ms=1001"),
            ("ca_file=/ca.pem", "ca_file=/ca.pem"),
            ("cert_file=/c.pem&key_file=/k.pem", "key_file=/k.pem&cert_file=/c.pem"),
        ] {
            let old = EtcdConfig::from_url(&format!("etcds://h:1?{old}")).unwrap();
            assert_eq!(old, EtcdConfig::from_url(&format!("etcds://h:1?{common}")).unwrap(), "{common}");
            assert_ne!(old, base, "{common} changed nothing");
        }
        let err = EtcdConfig::from_url("etcd://h:1?root=/x").unwrap_err().to_string();
        assert!(err.contains("\"root\"") && err.contains("namespace (or prefix)"), "{err}");
    }
}
