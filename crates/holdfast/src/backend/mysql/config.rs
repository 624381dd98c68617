//! `mysql://user:password@host:port/database[?options]` parsing.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::wait::PollBounds;

/// Whether and how the connection is encrypted (`ssl-mode=`, as in the
/// `mysql` command-line client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// Plain TCP (the default).
    Disabled,
    /// TLS, without checking the server's certificate (protects against
    /// passive eavesdropping only).
    Required,
    /// TLS, the certificate must chain to `ssl-ca` (or the system roots);
    /// the host name is not checked.
    VerifyCa,
    /// TLS, certificate chain and host name checked.
    VerifyIdentity,
}

/// Settings of the MySQL/MariaDB store, from its URL.
#[derive(Clone, PartialEq, Eq)]
pub struct MysqlConfig {
    /// Server host name or address.
    pub host: String,
    /// Server TCP port (default 3306).
    pub port: u16,
    /// User name.
    pub user: String,
    /// Password; never printed by `Debug`.
    pub(crate) password: Option<String>,
    /// The database holding the lock tables.
    pub database: String,
    /// Table name prefix: the tables are `<namespace>_leases` and
    /// `<namespace>_fence`. Letters, digits and `_`, at most 48 characters.
    pub namespace: String,
    /// TLS mode.
    pub ssl_mode: SslMode,
    /// A PEM or DER CA certificate file for `verify_ca` / `verify_identity`.
    pub ssl_ca: Option<PathBuf>,
    /// Bound on every single store call (connect, statement, transaction).
    pub timeout: Duration,
    /// Most connections the pool opens.
    pub pool_max: usize,
    /// Fallback poll bounds of waiters.
    pub poll: PollBounds,
}

impl fmt::Debug for MysqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("database", &self.database)
            .field("namespace", &self.namespace)
            .field("ssl_mode", &self.ssl_mode)
            .field("ssl_ca", &self.ssl_ca)
            .field("timeout", &self.timeout)
            .field("pool_max", &self.pool_max)
            .field("poll", &self.poll)
            .finish()
    }
}

fn bad(reason: impl Into<String>) -> Error {
    Error::invalid("url", reason)
}

/// Decodes `%XX` escapes; the result must be UTF-8.
fn percent_decode(s: &str, what: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let byte = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
            match byte {
                Some(b) => out.push(b),
                None => return Err(bad(format!("bad %-escape in the {what} of a mysql:// URL"))),
            }
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad(format!("the {what} of a mysql:// URL is not UTF-8")))
}

/// Checks a namespace: it becomes part of table names, the only text holdfast
/// ever puts into SQL, so it is restricted to `[A-Za-z0-9_]`, starting with a
/// letter or `_`.
pub(super) fn check_namespace(ns: &str) -> Result<()> {
    let ok = !ns.is_empty()
        && ns.len() <= 48
        && ns.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !ns.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(bad(format!("namespace {ns:?}: use 1 to 48 letters, digits or '_', not starting with a digit")))
    }
}

impl MysqlConfig {
    /// Parses `mysql://user:password@host:port/database?options`.
    ///
    /// Options: `namespace` (default `holdfast`), `ssl-mode`
    /// (`disabled`|`required`|`verify_ca`|`verify_identity`, default
    /// `disabled`; `sslmode` is accepted too), `ssl-ca=/path/ca.pem`,
    /// `timeout_ms` (default 5000), `pool_max` (default 16), `poll_min_ms` /
    /// `poll_max_ms` (default 2 / 20).
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url
            .get(..8)
            .filter(|scheme| scheme.eq_ignore_ascii_case("mysql://"))
            .map(|_| &url[8..])
            .ok_or_else(|| bad("expected a mysql:// URL, e.g. mysql://user:password@127.0.0.1:3306/app"))?;
        let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = main.split_once('/').unwrap_or((main, ""));
        // The password may contain '@' only %-encoded; the last '@' ends the credentials.
        let (creds, hostport) = match authority.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, authority),
        };
        let (user, password) = match creds {
            Some(c) => match c.split_once(':') {
                Some((u, p)) => (percent_decode(u, "user")?, Some(percent_decode(p, "password")?)),
                None => (percent_decode(c, "user")?, None),
            },
            None => ("root".to_owned(), None),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '[' in the host of a mysql:// URL"))?;
            (h.to_owned(), after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), Some(p)),
                None => (hostport.to_owned(), None),
            }
        };
        if host.is_empty() {
            return Err(bad("a mysql:// URL needs a host, e.g. mysql://user:password@127.0.0.1:3306/app"));
        }
        let port = match port {
            None => 3306,
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| bad(format!("bad port {p:?}")))?,
        };
        let database = percent_decode(path.trim_end_matches('/'), "database")?;
        if database.is_empty() || database.contains('/') {
            return Err(bad("a mysql:// URL needs a database, e.g. mysql://user:password@127.0.0.1:3306/app"));
        }
        let mut config = MysqlConfig {
            host,
            port,
            user,
            password,
            database,
            namespace: "holdfast".to_owned(),
            ssl_mode: SslMode::Disabled,
            ssl_ca: None,
            timeout: Duration::from_secs(5),
            pool_max: 16,
            poll: PollBounds { min: Duration::from_millis(2), max: Duration::from_millis(20) },
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v, "options")?;
            let num = || v.parse::<u64>().map_err(|_| bad(format!("mysql option {k} needs a number, got {v:?}")));
            match k {
                "namespace" => {
                    check_namespace(&v)?;
                    config.namespace = v;
                }
                "ssl-mode" | "ssl_mode" | "sslmode" => {
                    config.ssl_mode = match v.to_ascii_lowercase().replace('-', "_").as_str() {
                        "disabled" | "disable" => SslMode::Disabled,
                        "required" | "require" => SslMode::Required,
                        "verify_ca" => SslMode::VerifyCa,
                        "verify_identity" | "verify_full" => SslMode::VerifyIdentity,
                        _ => {
                            return Err(bad(format!(
                                "ssl-mode must be disabled, required, verify_ca or verify_identity, got {v:?}"
                            )));
                        }
                    }
                }
                "ssl-ca" | "ssl_ca" | "sslrootcert" => {
                    if v.is_empty() {
                        return Err(bad("ssl-ca needs a file path"));
                    }
                    config.ssl_ca = Some(PathBuf::from(v));
                }
                "timeout_ms" => config.timeout = Duration::from_millis(num()?),
                "pool_max" => config.pool_max = num()? as usize,
                "poll_min_ms" => config.poll.min = Duration::from_millis(num()?),
                "poll_max_ms" => config.poll.max = Duration::from_millis(num()?),
                _ => return Err(bad(format!("unknown mysql option {k:?}"))),
            }
        }
        if config.timeout < Duration::from_millis(10) || config.timeout > Duration::from_secs(600) {
            return Err(bad("timeout_ms must be between 10 and 600000"));
        }
        if config.pool_max == 0 || config.pool_max > 1024 {
            return Err(bad("pool_max must be between 1 and 1024"));
        }
        if config.poll.min.is_zero() || config.poll.max < config.poll.min {
            return Err(bad("need 0 < poll_min_ms <= poll_max_ms"));
        }
        if config.ssl_ca.is_some() && config.ssl_mode == SslMode::Disabled {
            config.ssl_mode = SslMode::VerifyCa;
        }
        Ok(config)
    }

    /// The lease table's name.
    pub(super) fn leases_table(&self) -> String {
        format!("{}_leases", self.namespace)
    }

    /// The fence counter table's name.
    pub(super) fn fence_table(&self) -> String {
        format!("{}_fence", self.namespace)
    }

    /// The password, for tools that open their own connection with the same
    /// settings (the raw-floor benchmark). Never shown by `Debug`.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls_and_options() {
        let c = MysqlConfig::from_url("mysql://app:p%40ss%3Aw@db.example:3307/locks?namespace=jobs&ssl-mode=REQUIRED")
            .unwrap();
        assert_eq!((c.host.as_str(), c.port, c.user.as_str()), ("db.example", 3307, "app"));
        assert_eq!(c.password(), Some("p@ss:w"));
        assert_eq!(c.database, "locks");
        assert_eq!(c.leases_table(), "jobs_leases");
        assert_eq!(c.ssl_mode, SslMode::Required);
        let c = MysqlConfig::from_url("mysql://[::1]/db?ssl-ca=/etc/ca.pem").unwrap();
        assert_eq!((c.host.as_str(), c.port, c.user.as_str()), ("::1", 3306, "root"));
        assert_eq!(c.ssl_mode, SslMode::VerifyCa);
        assert!(!format!("{c:?}").contains("p@ss"));
        let c = MysqlConfig::from_url("mysql://u:secret@h/db").unwrap();
        assert!(!format!("{c:?}").contains("secret"), "{c:?}");
    }

    #[test]
    fn rejects_bad_urls() {
        for bad in [
            "mysql://",
            "mysql://h",
            "mysql://h:99999/db",
            "mysql://h:0/db",
            "mysql://h/db?namespace=x;drop",
            "mysql://h/db?namespace=1abc",
            "mysql://h/db?namespace=`x`",
            "mysql://h/db?namespace=",
            "mysql://h/db?ssl-mode=maybe",
            "mysql://h/db?nope=1",
            "mysql://h/db?poll_min_ms=0",
            "mysql://h/db?timeout_ms=abc",
            "mysql://u:%zz@h/db",
            "mysql://[::1/db",
            "postgres://h/db",
        ] {
            assert!(matches!(MysqlConfig::from_url(bad), Err(Error::InvalidInput { what: "url", .. })), "{bad}");
        }
    }
}
