//! `zk://[user:pass@]host:port[,host:port...][/chroot][?options]` parsing
//! (`zks://` for TLS).

use std::path::PathBuf;
use std::time::Duration;

use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::secret::Secret;
use crate::vocabulary::url_options::{Opt, UrlOptions, percent_decode};

/// Settings of the ZooKeeper store, from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkConfig {
    /// `host:port` of every ensemble member, in URL order.
    pub hosts: Vec<String>,
    /// Credentials `(user, password)`; `None` connects unauthenticated.
    pub credentials: Option<(String, Secret)>,
    /// How the credentials authenticate (`auth=digest|sasl`; default digest).
    pub auth: ZkAuth,
    /// TLS to every member (`zks://`), with the CA to trust and an optional
    /// client certificate.
    pub tls: Option<ZkTls>,
    /// The path prefix under which all lock nodes live (the URL's chroot plus
    /// `/holdfast/locks`, or `namespace=` (alias `root=`) to replace the
    /// `/holdfast/locks` part).
    pub root: String,
    /// The session timeout asked of the ensemble (`session_timeout_ms`, alias
    /// `session_timeout`; default 10 000). The server clamps it to
    /// `[2, 20] x tickTime`.
    pub session_timeout: Duration,
    /// Time limit of every single request and of connecting (`timeout_ms`,
    /// alias `timeout`; default 5 000).
    pub timeout: Duration,
    /// A waiter re-checks the queue this often even if no watch fired
    /// (`poll_max_ms`, alias `poll_ms`; default 2 000). Watches are the
    /// wake-up; this only bounds the cost of a watch that was never delivered.
    pub poll: Duration,
}

/// How a `zk://` URL's user and password authenticate the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZkAuth {
    /// ZooKeeper's `digest` scheme (`addauth digest user:password` after
    /// connecting): no server setup beyond the ACLs.
    #[default]
    Digest,
    /// SASL `DIGEST-MD5` during the handshake, against the server's JAAS
    /// `Server` section (`SASLAuthenticationProvider`); a wrong password ends
    /// the connection before any request.
    Sasl,
}

/// TLS settings of a `zks://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkTls {
    /// A PEM file of the CA that signed the members' certificates
    /// (`ca_file`, required: the client crate trusts no CA by default).
    pub ca_file: PathBuf,
    /// A PEM client certificate and its key (`cert_file`, `key_file`), for
    /// servers that demand one (`ssl.clientAuth=need`).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// The options of `zk://` URLs (see the "URL options" table in the store's docs).
pub(crate) const OPTIONS: &[Opt] = &[
    Opt::new("timeout_ms").or(&["timeout"]),
    Opt::new("session_timeout_ms").or(&["session_timeout"]),
    Opt::new("poll_max_ms").or(&["poll_ms"]),
    Opt::new("namespace").or(&["root"]),
    Opt::new("auth"),
    Opt::new("ca_file"),
    Opt::new("cert_file"),
    Opt::new("key_file"),
];

/// Every duration option: 1 ms to an hour.
const MS: std::ops::RangeInclusive<u64> = 1..=3_600_000;

fn check_path(what: &str, p: &str) -> Result<()> {
    let ok = p.starts_with('/')
        && !p.ends_with('/')
        && p[1..].split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && !p.chars().any(|c| c.is_control());
    if ok { Ok(()) } else { Err(Error::invalid("url", format!("zk:// {what} {p:?} is not a valid ZooKeeper path"))) }
}

impl ZkConfig {
    /// The servers as `host:port,...`, for errors.
    pub(crate) fn endpoint(&self) -> String {
        crate::vocabulary::store_error::host_list(&self.hosts)
    }

    /// Parses `zk://user:pass@h1:2181,h2:2181/chroot?session_timeout_ms=10000&timeout_ms=5000`.
    /// The options are in the "URL options" table of the store's docs.
    pub fn from_url(url: &str) -> Result<Self> {
        // `zookeeper://` and `zookeepers://` are the long names of `zk://` and `zks://`.
        let schemes = [("zk://", false), ("zks://", true), ("zookeeper://", false), ("zookeepers://", true)];
        let Some((rest, tls)) = schemes.iter().find_map(|(s, tls)| url.strip_prefix(s).map(|rest| (rest, *tls))) else {
            return Err(Error::invalid(
                "url",
                "not a zk:// or zks:// URL (expected zk://host:port[,host:port...][/chroot])",
            ));
        };
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        // An '@' after the first '/' may end credentials that hold an
        // unencoded '/', whose pieces would be read as hosts or a chroot
        // and quoted; refused without quoting anything.
        if rest.split_once('/').is_some_and(|(_, after)| after.contains('@')) {
            return Err(Error::invalid(
                "url",
                "zk:// URL has an '@' after its first '/': write '/' in a user or password as %2F \
                 ('@' in a chroot is not supported)",
            ));
        }
        let (authority, chroot) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (credentials, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => {
                let (user, pass) = userinfo
                    .split_once(':')
                    .ok_or_else(|| Error::invalid("url", "zk:// credentials must be user:password@"))?;
                let user = percent_decode(user, "the user of a zk:// URL")?;
                let pass = Secret::new(percent_decode(pass, "the password of a zk:// URL")?);
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
        let opts = UrlOptions::parse("zk", query, OPTIONS)?;
        let root = match opts.str("namespace") {
            Some(ns) => {
                check_path(opts.given_as("namespace").unwrap_or("namespace"), ns)?;
                format!("{chroot}{ns}")
            }
            None => format!("{chroot}/holdfast/locks"),
        };
        let auth = opts.choice("auth", &[("digest", ZkAuth::Digest), ("sasl", ZkAuth::Sasl)])?.unwrap_or_default();
        if auth == ZkAuth::Sasl && credentials.is_none() {
            return Err(Error::invalid("url", "zk:// auth=sasl needs user:password@ in the URL"));
        }
        let client_cert = match (opts.path("cert_file")?, opts.path("key_file")?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(Error::invalid("url", "zks:// cert_file and key_file go together")),
        };
        let tls = match (tls, opts.path("ca_file")?) {
            (true, Some(ca_file)) => Some(ZkTls { ca_file, client_cert }),
            (true, None) => {
                return Err(Error::invalid(
                    "url",
                    "zks:// needs ca_file= (the CA that signed the servers' certificates)",
                ));
            }
            (false, ca) if ca.is_some() || client_cert.is_some() => {
                return Err(Error::invalid("url", "ca_file, cert_file and key_file need zks://"));
            }
            (false, _) => None,
        };
        let config = ZkConfig {
            hosts: host_list,
            credentials,
            auth,
            tls,
            root,
            session_timeout: opts.duration_ms("session_timeout_ms", MS)?.unwrap_or(Duration::from_secs(10)),
            timeout: opts.duration_ms("timeout_ms", MS)?.unwrap_or(Duration::from_secs(5)),
            poll: opts.duration_ms("poll_max_ms", MS)?.unwrap_or(Duration::from_secs(2)),
        };
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
        assert_eq!(c.credentials, Some(("app".into(), Secret::new("s@cret"))));
        assert_eq!(c.root, "/tenant/a/holdfast/locks");
        assert_eq!(c.session_timeout, Duration::from_secs(4));
        assert_eq!(c.timeout, Duration::from_millis(900));
        assert!(!format!("{c:?}").contains("s@cret"));
        let c = ZkConfig::from_url("zks://u:p@h:1?auth=sasl&ca_file=/ca.pem&cert_file=/c.pem&key_file=/k.pem").unwrap();
        assert_eq!(c.auth, ZkAuth::Sasl);
        let tls = c.tls.expect("zks:// is TLS");
        assert_eq!(tls.ca_file, PathBuf::from("/ca.pem"));
        assert_eq!(tls.client_cert, Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem"))));
        let c = ZkConfig::from_url("zk://h:1?root=/locks").unwrap();
        assert_eq!((c.auth, c.tls), (ZkAuth::Digest, None));
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
            "zks://h:1",
            "zks://h:1?cert_file=/c.pem&ca_file=/ca.pem",
            "zk://h:1?ca_file=/ca.pem",
            "zk://h:1?auth=sasl",
            "zk://u:p@h:1?auth=kerberos",
        ] {
            assert!(matches!(ZkConfig::from_url(bad), Err(Error::InvalidInput { what: "url", .. })), "{bad}");
        }
    }

    /// Every option under its common name and under each older name: both
    /// spellings give the same config, and one that differs from the default.
    #[test]
    fn common_names_and_aliases() {
        let base = ZkConfig::from_url("zk://h:1/app").unwrap();
        for (old, common) in [
            ("timeout=900", "timeout_ms=900"),
            ("session_timeout=4000", "session_timeout_ms=4000"),
            ("poll_ms=500", "poll_max_ms=500"),
            ("root=/locks", "namespace=%2Flocks"),
        ] {
            let old = ZkConfig::from_url(&format!("zk://h:1/app?{old}")).unwrap();
            assert_eq!(old, ZkConfig::from_url(&format!("zk://h:1/app?{common}")).unwrap(), "{common}");
            assert_ne!(old, base, "{common} changed nothing");
        }
        assert_eq!(ZkConfig::from_url("zk://h:1/app?root=/locks").unwrap().root, "/app/locks");
        let err = ZkConfig::from_url("zk://h:1?prefix=x").unwrap_err().to_string();
        assert!(err.contains("\"prefix\"") && err.contains("namespace (or root)"), "{err}");
    }
}
