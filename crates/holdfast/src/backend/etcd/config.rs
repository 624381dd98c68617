//! `etcd://` and `etcds://` URL parsing.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

/// Settings of the etcd store, from its URL.
#[derive(Clone, PartialEq, Eq)]
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
    password: Option<String>,
    /// The prefix of every key this store writes (`prefix`, default `holdfast/`).
    pub prefix: String,
    /// How long one operation may take, retries on other endpoints included
    /// (`timeout_ms`, default 5000).
    pub timeout: Duration,
    /// How long a TCP/TLS connect may take (`connect_timeout_ms`, default 1000).
    pub connect_timeout: Duration,
    /// The shortest session lease, in whole seconds (`session_ttl`, default 1).
    /// A lock's lease is `max(ceil(ttl), session_ttl)` seconds; the server may
    /// raise it to its own minimum.
    pub session_ttl_secs: i64,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("session_ttl_secs", &self.session_ttl_secs)
            .finish()
    }
}

fn bad(reason: impl Into<String>) -> Error {
    Error::invalid("url", reason)
}

/// Decodes `%XX` escapes (user names and passwords may contain `@`, `:`).
fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let v = hex
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad("a bad %-escape in the etcd URL's user or password"))?;
            out.push(v);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad("the etcd URL's user or password is not UTF-8"))
}

impl EtcdConfig {
    /// The password, if any (never printed by `Debug`).
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// Parses `etcd://[user:pass@]host:port[,host:port...][/][?options]`
    /// (`etcds://` for TLS). Options: `prefix`, `timeout_ms`,
    /// `connect_timeout_ms`, `session_ttl` (seconds), `ca_file`, `cert_file`,
    /// `key_file`. A host without a port gets 2379.
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
            return Err(bad("an etcd URL has no path; use the prefix option for a namespace"));
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
                (Some(percent_decode(name)?), Some(percent_decode(pass)?))
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
        let mut config = EtcdConfig {
            endpoints,
            tls,
            ca_file: None,
            client_cert: None,
            user,
            password,
            prefix: "holdfast/".to_owned(),
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
            session_ttl_secs: 1,
        };
        let (mut cert, mut key) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v)?;
            let ms =
                || {
                    v.parse::<u64>().ok().filter(|&n| n > 0).map(Duration::from_millis).ok_or_else(|| {
                        bad(format!("etcd option {k} needs a positive number of milliseconds, got {v:?}"))
                    })
                };
            match k {
                "prefix" | "namespace" => config.prefix = v,
                "timeout_ms" => config.timeout = ms()?,
                "connect_timeout_ms" => config.connect_timeout = ms()?,
                "session_ttl" => {
                    config.session_ttl_secs = v
                        .parse::<i64>()
                        .ok()
                        .filter(|n| (1..=86_400).contains(n))
                        .ok_or_else(|| bad(format!("session_ttl needs 1..=86400 seconds, got {v:?}")))?
                }
                "ca_file" => config.ca_file = Some(PathBuf::from(v)),
                "cert_file" => cert = Some(PathBuf::from(v)),
                "key_file" => key = Some(PathBuf::from(v)),
                _ => return Err(bad(format!("unknown etcd option {k:?}"))),
            }
        }
        match (cert, key) {
            (Some(c), Some(k)) => config.client_cert = Some((c, k)),
            (None, None) => {}
            _ => return Err(bad("cert_file and key_file go together")),
        }
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
        assert!(!dbg.contains("p@ss") && dbg.contains("redacted"), "{dbg}");
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
}
