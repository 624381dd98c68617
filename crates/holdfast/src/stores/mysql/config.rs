//! `mysql://user:password@host:port/database[?options]` parsing.

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::wait::PollBounds;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::secret::Secret;
use crate::vocabulary::url_options::{Opt, UrlOptions, percent_decode};

/// Whether and how the connection is encrypted (`sslmode=`, or `ssl-mode=` as
/// in the `mysql` command-line client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// Plain TCP (the default).
    Disabled,
    /// TLS, without checking the server's certificate (protects against
    /// passive eavesdropping only). With a CA file (`ca_file`) the URL's
    /// `required` becomes [`VerifyCa`](Self::VerifyCa), as libpq's `require`
    /// does with a root certificate.
    Required,
    /// TLS, the certificate must chain to `ssl-ca` (or the system roots);
    /// the host name is not checked.
    VerifyCa,
    /// TLS, certificate chain and host name checked.
    VerifyIdentity,
}

/// Settings of the MySQL/MariaDB store, from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MysqlConfig {
    /// Server host name or address.
    pub host: String,
    /// Server TCP port (default 3306).
    pub port: u16,
    /// User name.
    pub user: String,
    /// Password; never printed by `Debug`.
    pub(crate) password: Option<Secret>,
    /// The database holding the lock tables.
    pub database: String,
    /// Table name prefix: the tables are `<namespace>_leases` and
    /// `<namespace>_fence`. Letters, digits and `_`, at most 48 characters.
    pub namespace: String,
    /// TLS mode (`sslmode`, aliases `ssl-mode`, `ssl_mode`).
    pub ssl_mode: SslMode,
    /// A PEM or DER CA certificate file for `verify_ca` / `verify_identity`
    /// (`ca_file`, aliases `ssl-ca`, `ssl_ca`, `sslrootcert`).
    pub ssl_ca: Option<PathBuf>,
    /// Bound on every single store call (connect, statement, transaction) (`timeout_ms`).
    pub timeout: Duration,
    /// Most connections the pool opens (`pool_size`, alias `pool_max`).
    pub pool_max: usize,
    /// Fallback poll bounds of waiters.
    pub poll: PollBounds,
}

fn bad(reason: impl Into<String>) -> Error {
    Error::invalid("url", reason)
}

/// The options of `mysql://` URLs (see the "URL options" table in the store's docs).
pub(crate) const OPTIONS: &[Opt] = &[
    Opt::new("namespace"),
    Opt::new("sslmode").or(&["ssl-mode", "ssl_mode"]),
    Opt::new("ca_file").or(&["ssl-ca", "ssl_ca", "sslrootcert"]),
    Opt::new("timeout_ms"),
    Opt::new("pool_size").or(&["pool_max"]),
    Opt::new("poll_min_ms"),
    Opt::new("poll_max_ms"),
];

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
    /// The server as `host:port`, for errors.
    pub(crate) fn endpoint(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Parses `mysql://user:password@host:port/database?options`. The options
    /// are in the "URL options" table of the store's docs.
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url
            .get(..8)
            .filter(|scheme| scheme.eq_ignore_ascii_case("mysql://"))
            .map(|_| &url[8..])
            .ok_or_else(|| bad("expected a mysql:// URL, e.g. mysql://user:password@127.0.0.1:3306/app"))?;
        let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = main.split_once('/').unwrap_or((main, ""));
        // An '@' after the first '/' may end credentials that hold an
        // unencoded '/', whose pieces would be read as a port or a database
        // and quoted; refused without quoting anything.
        if path.contains('@') {
            return Err(bad("a mysql:// URL has an '@' after its first '/': write '/' in a user or password as %2F, \
                 '@' in a database as %40"));
        }
        // The password may contain '@' only %-encoded; the last '@' ends the credentials.
        let (creds, hostport) = match authority.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, authority),
        };
        let (user, password) = match creds {
            Some(c) => match c.split_once(':') {
                Some((u, p)) => (
                    percent_decode(u, "the user of a mysql:// URL")?,
                    Some(Secret::new(percent_decode(p, "the password of a mysql:// URL")?)),
                ),
                None => (percent_decode(c, "the user of a mysql:// URL")?, None),
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
        let database = percent_decode(path.trim_end_matches('/'), "the database of a mysql:// URL")?;
        if database.is_empty() || database.contains('/') {
            return Err(bad("a mysql:// URL needs a database, e.g. mysql://user:password@127.0.0.1:3306/app"));
        }
        let opts = UrlOptions::parse("mysql", query, OPTIONS)?;
        let namespace = opts.str("namespace").unwrap_or("holdfast").to_owned();
        check_namespace(&namespace)?;
        let ssl_ca = opts.path("ca_file")?;
        let ssl_mode = opts.choice(
            "sslmode",
            &[
                ("disabled", SslMode::Disabled),
                ("disable", SslMode::Disabled),
                ("required", SslMode::Required),
                ("require", SslMode::Required),
                ("verify_ca", SslMode::VerifyCa),
                ("verify-ca", SslMode::VerifyCa),
                ("verify_identity", SslMode::VerifyIdentity),
                ("verify-identity", SslMode::VerifyIdentity),
                ("verify_full", SslMode::VerifyIdentity),
                ("verify-full", SslMode::VerifyIdentity),
            ],
        )?;
        let poll = PollBounds {
            min: opts.duration_ms("poll_min_ms", 1..=86_400_000)?.unwrap_or(Duration::from_millis(2)),
            max: opts.duration_ms("poll_max_ms", 0..=86_400_000)?.unwrap_or(Duration::from_millis(20)),
        };
        if poll.max < poll.min {
            return Err(bad("need 0 < poll_min_ms <= poll_max_ms"));
        }
        let config = MysqlConfig {
            host,
            port,
            user,
            password,
            database,
            namespace,
            // A CA file with no mode (or `disabled`) means: check the
            // certificate against it; so does `required` with a CA file, as
            // libpq's `require` with a root certificate does (PostgreSQL's
            // same URL verifies the CA).
            ssl_mode: match ssl_mode.unwrap_or(SslMode::Disabled) {
                SslMode::Disabled | SslMode::Required if ssl_ca.is_some() => SslMode::VerifyCa,
                mode => mode,
            },
            ssl_ca,
            timeout: opts.duration_ms("timeout_ms", 10..=600_000)?.unwrap_or(Duration::from_secs(5)),
            pool_max: opts.number("pool_size", 1..=1024)?.unwrap_or(16),
            poll,
        };
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

    /// The shared leases table's name.
    pub(super) fn shares_table(&self) -> String {
        format!("{}_shares", self.namespace)
    }

    /// The table of the session rows that session-bound leases live with.
    pub(super) fn sessions_table(&self) -> String {
        format!("{}_sessions", self.namespace)
    }

    /// The table of records kept with keys.
    pub(super) fn records_table(&self) -> String {
        format!("{}_records", self.namespace)
    }

    /// The password, for tools that open their own connection with the same
    /// settings (the raw-floor benchmark). Never shown by `Debug`.
    pub fn password(&self) -> Option<&str> {
        self.password.as_ref().map(Secret::expose)
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
        for mode in ["require", "required", "REQUIRED"] {
            let c = MysqlConfig::from_url(&format!("mysql://h/db?sslmode={mode}&ca_file=/etc/ca.pem")).unwrap();
            assert_eq!(c.ssl_mode, SslMode::VerifyCa, "{mode} with a CA file checks the CA");
        }
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

    /// Every option under its common name and under each older or native
    /// name: both spellings give the same config, and one that differs from
    /// the default.
    #[test]
    fn common_names_and_aliases() {
        let base = MysqlConfig::from_url("mysql://h/db").unwrap();
        for (old, common) in [
            ("namespace=jobs", "namespace=jobs"),
            ("ssl-mode=REQUIRED", "sslmode=required"),
            ("ssl_mode=verify-identity", "sslmode=verify_identity"),
            ("sslmode=require", "sslmode=required"),
            ("ssl-ca=/ca.pem", "ca_file=/ca.pem"),
            ("ssl_ca=/ca.pem", "ca_file=%2Fca.pem"),
            ("sslrootcert=/ca.pem&ssl-mode=verify_ca", "ca_file=/ca.pem"),
            ("timeout_ms=700", "timeout_ms=700"),
            ("pool_max=4", "pool_size=4"),
            ("poll_min_ms=5", "poll_min_ms=5"),
            ("poll_max_ms=50", "poll_max_ms=50"),
        ] {
            let old = MysqlConfig::from_url(&format!("mysql://h/db?{old}")).unwrap();
            assert_eq!(old, MysqlConfig::from_url(&format!("mysql://h/db?{common}")).unwrap(), "{common}");
            assert_ne!(old, base, "{common} changed nothing");
        }
        let err = MysqlConfig::from_url("mysql://h/db?prefix=x").unwrap_err().to_string();
        assert!(err.contains("\"prefix\"") && err.contains("pool_size (or pool_max)"), "{err}");
    }
}
