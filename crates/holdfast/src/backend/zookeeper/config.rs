//! `zk://[user:pass@]host:port[,host:port...][/chroot][?options]` parsing.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};

/// Settings of the ZooKeeper store, from its URL.
#[derive(Clone, PartialEq, Eq)]
pub struct ZkConfig {
    /// `host:port` of every ensemble member, in URL order.
    pub hosts: Vec<String>,
    /// Digest credentials `(user, password)`; `None` connects unauthenticated.
    pub credentials: Option<(String, String)>,
    /// The path prefix under which all lock nodes live (the URL's chroot plus
    /// `/holdfast/locks`, or `root=` to replace the `/holdfast/locks` part).
    pub root: String,
    /// The session timeout asked of the ensemble (`session_timeout`, ms;
    /// default 10 000). The server clamps it to `[2, 20] x tickTime`.
    pub session_timeout: Duration,
    /// Time limit of every single request and of connecting (`timeout`, ms;
    /// default 5 000).
    pub timeout: Duration,
    /// A waiter re-checks the queue this often even if no watch fired
    /// (`poll_ms`; default 2 000). Watches are the wake-up; this only bounds
    /// the cost of a watch that was never delivered.
    pub poll: Duration,
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("hosts", &self.hosts)
            .field("user", &self.credentials.as_ref().map(|(u, _)| u))
            .field("password", &self.credentials.as_ref().map(|_| "<redacted>"))
            .field("root", &self.root)
            .field("session_timeout", &self.session_timeout)
            .field("timeout", &self.timeout)
            .field("poll", &self.poll)
            .finish()
    }
}

fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(b) = hex else {
                return Err(Error::invalid("url", "bad percent-encoding in zk:// credentials"));
            };
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| Error::invalid("url", "zk:// credentials are not UTF-8"))
}

fn check_path(what: &str, p: &str) -> Result<()> {
    let ok = p.starts_with('/')
        && !p.ends_with('/')
        && p[1..].split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && !p.chars().any(|c| c.is_control());
    if ok { Ok(()) } else { Err(Error::invalid("url", format!("zk:// {what} {p:?} is not a valid ZooKeeper path"))) }
}

impl ZkConfig {
    /// Parses `zk://user:pass@h1:2181,h2:2181/chroot?session_timeout=10000&timeout=5000`.
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url.strip_prefix("zk://").ok_or_else(|| {
            Error::invalid("url", "not a zk:// URL (expected zk://host:port[,host:port...][/chroot])")
        })?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, chroot) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (credentials, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => {
                let (user, pass) = userinfo
                    .split_once(':')
                    .ok_or_else(|| Error::invalid("url", "zk:// credentials must be user:password@"))?;
                let (user, pass) = (percent_decode(user)?, percent_decode(pass)?);
                if user.is_empty() {
                    return Err(Error::invalid("url", "zk:// user must not be empty"));
                }
                (Some((user, pass)), hosts)
            }
            None => (None, authority),
        };
        let mut host_list = Vec::new();
        for h in hosts.split(',') {
            let (name, port) = h
                .rsplit_once(':')
                .ok_or_else(|| Error::invalid("url", format!("zk:// host {h:?} needs a port (host:port)")))?;
            if name.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(Error::invalid("url", format!("zk:// host {h:?} is not host:port")));
            }
            host_list.push(h.to_owned());
        }
        if !chroot.is_empty() {
            check_path("chroot", chroot)?;
        }
        let mut config = ZkConfig {
            hosts: host_list,
            credentials,
            root: format!("{chroot}/holdfast/locks"),
            session_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            poll: Duration::from_secs(2),
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let ms = || {
                v.parse::<u64>().ok().filter(|ms| (1..=3_600_000).contains(ms)).map(Duration::from_millis).ok_or_else(
                    || Error::invalid("url", format!("zk option {k} needs 1..3600000 milliseconds, got {v:?}")),
                )
            };
            match k {
                "session_timeout" | "session_timeout_ms" => config.session_timeout = ms()?,
                "timeout" | "timeout_ms" => config.timeout = ms()?,
                "poll_ms" => config.poll = ms()?,
                "root" => {
                    check_path("root", v)?;
                    config.root = format!("{chroot}{v}");
                }
                _ => return Err(Error::invalid("url", format!("unknown zk option {k:?}"))),
            }
        }
        Ok(config)
    }

    /// The connect string for the client: `h1:p1,h2:p2`.
    pub fn connect_string(&self) -> String {
        self.hosts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_chroot_auth_and_options() {
        let c =
            ZkConfig::from_url("zk://app:s%40cret@127.0.0.1:2181,h2:2182/tenant/a?session_timeout=4000&timeout=900")
                .unwrap();
        assert_eq!(c.hosts, vec!["127.0.0.1:2181", "h2:2182"]);
        assert_eq!(c.credentials, Some(("app".into(), "s@cret".into())));
        assert_eq!(c.root, "/tenant/a/holdfast/locks");
        assert_eq!(c.session_timeout, Duration::from_secs(4));
        assert_eq!(c.timeout, Duration::from_millis(900));
        assert!(!format!("{c:?}").contains("s@cret"));
        let c = ZkConfig::from_url("zk://h:1?root=/locks").unwrap();
        assert_eq!((c.root.as_str(), c.credentials), ("/locks", None));
        for bad in [
            "zk://",
            "zk://host",
            "zk://h:0",
            "zk://h:99999",
            "zk://:1",
            "zk://h:1,",
            "zk://h:1/",
            "zk://h:1/a//b",
            "zk://h:1/a/..",
            "zk://h:1?nope=1",
            "zk://h:1?timeout=0",
            "zk://h:1?timeout=x",
            "zk://user@h:1",
            "zk://:p@h:1",
            "zk://u:%zz@h:1",
            "etcd://h:1",
        ] {
            assert!(matches!(ZkConfig::from_url(bad), Err(Error::InvalidInput { what: "url", .. })), "{bad}");
        }
    }
}
