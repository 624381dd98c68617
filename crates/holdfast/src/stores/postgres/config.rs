//! `postgres://` / `postgresql://` URL parsing: the connection settings go to
//! tokio-postgres, holdfast's own options (`namespace`, `table`, `ca_file`,
//! `listen_url`, ...) are taken out first.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::backend::wait::PollBounds;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::url_options::{Opt, UrlOptions};

/// How the connection is encrypted and the server checked, as in libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS if the server offers it, plain otherwise; the certificate is not checked (libpq's default).
    Prefer,
    /// TLS or fail; the certificate is not checked unless `ca_file` is given (then as `VerifyCa`).
    Require,
    /// TLS, and the server certificate must chain to `ca_file`; the host name is not checked.
    VerifyCa,
    /// TLS, the certificate must chain to `ca_file` and name the host connected to.
    VerifyFull,
}

/// When the statement connections use named prepared statements (planned
/// once per connection) instead of the unnamed statement (planned per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    /// On each connection that reaches a PostgreSQL backend of its own, and
    /// not on one through a pooler (`prepared=auto`, the default); see
    /// the store docs on PgBouncer for how a pooler is recognised.
    Auto,
    /// On every connection (`prepared=true`): for a pooler that supports
    /// them (PgBouncer 1.21+ with `max_prepared_statements > 0`, or session
    /// pooling).
    Always,
    /// On none (`prepared=false`).
    Never,
}

/// Settings of the PostgreSQL store, from its URL.
#[derive(Clone)]
pub struct PostgresConfig {
    /// Connection settings for the statement connections (password redacted in Debug).
    pub(crate) pg: tokio_postgres::Config,
    /// Connection settings for the LISTEN connection; `None` = no listener, waiters poll.
    pub(crate) listen: Option<tokio_postgres::Config>,
    /// TLS mode.
    pub ssl_mode: SslMode,
    /// PEM file of the CA certificate(s) to trust (`ca_file`, alias `sslrootcert`).
    pub ssl_root_cert: Option<PathBuf>,
    /// Schema holding the tables (`namespace`, alias `schema`; default `public`).
    pub schema: String,
    /// Lease table name (`table`, default `holdfast_leases`); the fence
    /// counter is `<table>_fence`. Schema + table form one namespace.
    pub table: String,
    /// Statement connections (`pool_size`, default 4).
    pub pool_size: usize,
    /// Time limit of each statement, including a reconnect (`timeout_ms`, alias
    /// `op_timeout_ms`; default 5000).
    pub op_timeout: Duration,
    /// Fallback poll bounds of waiters (`poll_min_ms` / `poll_max_ms`).
    pub poll: PollBounds,
    /// Create the schema and tables if missing (`create=true|false`, default true).
    pub create: bool,
    /// Named prepared statements (`prepared=auto|true|false`, default `auto`:
    /// only on connections that reach PostgreSQL directly).
    pub prepared: Prepared,
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // tokio_postgres::Config's Debug redacts the password.
        f.debug_struct("PostgresConfig")
            .field("pg", &self.pg)
            .field("listen", &self.listen)
            .field("ssl_mode", &self.ssl_mode)
            .field("ssl_root_cert", &self.ssl_root_cert)
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("op_timeout", &self.op_timeout)
            .field("poll", &self.poll)
            .field("create", &self.create)
            .field("prepared", &self.prepared)
            .finish()
    }
}

/// Poll bounds while a LISTEN connection delivers wake-ups: the poll only
/// backs up a notification that cannot come (none is sent for an expiry,
/// which waiters time by the holder's remaining lease anyway).
const POLL_LISTENING: PollBounds = PollBounds { min: Duration::from_millis(100), max: Duration::from_millis(500) };
/// Poll bounds with `listen=off` (behind a transaction pooler without a direct URL).
const POLL_ONLY: PollBounds = PollBounds { min: Duration::from_millis(5), max: Duration::from_millis(50) };

/// Checks a schema or table name: lowercase ASCII letters, digits and `_`,
/// starting with a letter or `_`, at most `max` bytes. Such a name needs no
/// case folding and is still always double-quoted in SQL.
pub(crate) fn check_ident(what: &str, name: &str, max: usize) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if !ok {
        return Err(Error::invalid(
            "url",
            format!(
                "postgres option {what}={name:?}: use 1 to {max} of [a-z0-9_], not starting with a digit \
                 (names are never interpolated unchecked)"
            ),
        ));
    }
    Ok(())
}

/// The options of `postgres://` URLs (see the "URL options" table in the
/// store's docs); libpq's own options pass through to tokio-postgres.
pub(crate) const OPTIONS: &[Opt] = &[
    Opt::new("sslmode"),
    Opt::new("ca_file").or(&["sslrootcert"]),
    Opt::new("namespace").or(&["schema"]),
    Opt::new("table"),
    Opt::new("timeout_ms").or(&["op_timeout_ms"]),
    Opt::new("connect_timeout_ms"),
    Opt::new("pool_size"),
    Opt::new("poll_min_ms"),
    Opt::new("poll_max_ms"),
    Opt::new("listen"),
    Opt::new("listen_url"),
    Opt::new("create"),
    Opt::new("prepared"),
    // What tokio-postgres 0.7 reads from a URL, other than `sslmode`.
    Opt::pass_through("user"),
    Opt::pass_through("password"),
    Opt::pass_through("dbname"),
    Opt::pass_through("options"),
    Opt::pass_through("application_name"),
    Opt::pass_through("sslnegotiation"),
    Opt::pass_through("host"),
    Opt::pass_through("hostaddr"),
    Opt::pass_through("port"),
    Opt::pass_through("connect_timeout"),
    Opt::pass_through("tcp_user_timeout"),
    Opt::pass_through("keepalives"),
    Opt::pass_through("keepalives_idle"),
    Opt::pass_through("keepalives_interval"),
    Opt::pass_through("keepalives_retries"),
    Opt::pass_through("target_session_attrs"),
    Opt::pass_through("channel_binding"),
    Opt::pass_through("load_balance_hosts"),
];

/// Every duration option: 1 ms to a day.
const MS: std::ops::RangeInclusive<u64> = 1..=86_400_000;

fn is_postgres_url(url: &str) -> bool {
    let lower = url.get(..13).unwrap_or(url).to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

fn parse_pg(url: &str, app: &str) -> Result<tokio_postgres::Config> {
    // tokio-postgres ends the credentials at the first '@': the rest of a
    // password holding another '@' would become the host, shown by `Debug`
    // and in connection errors.
    if url.split_once('?').map_or(url, |(main, _)| main).matches('@').count() > 1 {
        return Err(Error::invalid(
            "url",
            "a postgres URL has more than one '@': write '@' in a user, password or database as %40",
        ));
    }
    let mut pg = tokio_postgres::Config::from_str(url)
        .map_err(|e| Error::invalid("url", format!("not a valid postgres URL: {e}")))?;
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(Duration::from_secs(5));
    }
    if pg.get_application_name().is_none() {
        pg.application_name(app);
    }
    if pg.get_hosts().is_empty() {
        return Err(Error::invalid("url", "postgres URL needs a host, e.g. postgres://user@127.0.0.1:5432/db"));
    }
    Ok(pg)
}

impl PostgresConfig {
    /// The servers as `host:port,...` (a socket directory for a Unix
    /// socket), for errors.
    pub(crate) fn endpoint(&self) -> String {
        use tokio_postgres::config::Host;
        let ports = self.pg.get_ports();
        let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        let hosts = self.pg.get_hosts().iter().enumerate().map(|(i, h)| match h {
            Host::Tcp(name) if name.contains(':') => format!("[{name}]:{}", port(i)),
            Host::Tcp(name) => format!("{name}:{}", port(i)),
            Host::Unix(dir) => format!("{}", dir.display()),
        });
        crate::vocabulary::store_error::host_list(hosts)
    }

    /// Parses `postgres://user:pass@host:port/db?sslmode=verify-full&ca_file=/ca.pem&namespace=locks`.
    ///
    /// holdfast's options are in the "URL options" table of the store's docs;
    /// libpq's options that tokio-postgres knows (`application_name`,
    /// `connect_timeout`, `target_session_attrs`, ...) pass through to it.
    pub fn from_url(url: &str) -> Result<Self> {
        if !is_postgres_url(url) {
            return Err(Error::invalid("url", "expected a postgres:// or postgresql:// URL"));
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let opts = UrlOptions::parse("postgres", query, OPTIONS)?;
        let schema = opts.str("namespace").unwrap_or("public").to_owned();
        let table = opts.str("table").unwrap_or("holdfast_leases").to_owned();
        check_ident(opts.given_as("namespace").unwrap_or("namespace"), &schema, 63)?;
        // The fence table appends "_fence" and must stay within 63 bytes.
        check_ident("table", &table, 57)?;
        let ssl_root_cert = opts.path("ca_file")?;
        let mut ssl_mode = opts
            .choice(
                "sslmode",
                &[
                    ("disable", SslMode::Disable),
                    ("prefer", SslMode::Prefer),
                    ("allow", SslMode::Prefer),
                    ("require", SslMode::Require),
                    ("verify-ca", SslMode::VerifyCa),
                    ("verify-full", SslMode::VerifyFull),
                ],
            )?
            .unwrap_or(SslMode::Prefer);
        if ssl_mode == SslMode::Require && ssl_root_cert.is_some() {
            ssl_mode = SslMode::VerifyCa;
        }
        if matches!(ssl_mode, SslMode::VerifyCa | SslMode::VerifyFull) && ssl_root_cert.is_none() {
            return Err(Error::invalid(
                "url",
                "sslmode=verify-ca/verify-full needs ca_file=/path/to/ca.pem (alias sslrootcert)",
            ));
        }
        let op_timeout = opts.duration_ms("timeout_ms", MS)?.unwrap_or(Duration::from_secs(5));
        let connect_timeout = opts.duration_ms("connect_timeout_ms", MS)?;
        let pool_size = opts.number("pool_size", 1..=64)?.unwrap_or(4);
        let create = opts.flag("create")?.unwrap_or(true);
        let prepared = opts
            .choice(
                "prepared",
                &[
                    ("auto", Prepared::Auto),
                    ("true", Prepared::Always),
                    ("on", Prepared::Always),
                    ("1", Prepared::Always),
                    ("false", Prepared::Never),
                    ("off", Prepared::Never),
                    ("0", Prepared::Never),
                ],
            )?
            .unwrap_or(Prepared::Auto);
        let kept = opts.pass_through();
        let pg_url = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        let mut pg = parse_pg(&pg_url, "holdfast")?;
        if let Some(t) = connect_timeout {
            pg.connect_timeout(t);
        }
        let listener_name = format!("{}-listener", pg.get_application_name().unwrap_or("holdfast"));
        let listen = match (opts.flag("listen")?.unwrap_or(true), opts.str("listen_url")) {
            (false, _) => None,
            (true, None) => {
                let mut l = pg.clone();
                l.application_name(listener_name);
                Some(l)
            }
            (true, Some(u)) => {
                if !is_postgres_url(u) {
                    return Err(Error::invalid("url", "listen_url must be a postgres:// URL"));
                }
                let (b, q) = u.split_once('?').unwrap_or((u, ""));
                // Only connection settings belong in listen_url; TLS follows the main URL.
                let not_sslmode = |p: &&str| !p.is_empty() && p.split('=').next() != Some("sslmode");
                let q: Vec<&str> = q.split('&').filter(not_sslmode).collect();
                let u = if q.is_empty() { b.to_owned() } else { format!("{b}?{}", q.join("&")) };
                let mut l = parse_pg(&u, &listener_name)?;
                if let Some(t) = connect_timeout {
                    l.connect_timeout(t);
                }
                Some(l)
            }
        };
        let default_poll = if listen.is_some() { POLL_LISTENING } else { POLL_ONLY };
        let poll = PollBounds {
            min: opts.duration_ms("poll_min_ms", MS)?.unwrap_or(default_poll.min),
            max: opts.duration_ms("poll_max_ms", MS)?.unwrap_or(default_poll.max),
        };
        if poll.max < poll.min {
            return Err(Error::invalid("url", "need 0 < poll_min_ms <= poll_max_ms"));
        }
        Ok(PostgresConfig {
            pg,
            listen,
            ssl_mode,
            ssl_root_cert,
            schema,
            table,
            pool_size,
            op_timeout,
            poll,
            create,
            prepared,
        })
    }

    /// The tokio-postgres settings of the statement connections (host, port,
    /// user, password, database, timeouts), for tools that talk to the same
    /// database with a plain client, like the benchmark's raw floor.
    pub fn connection_config(&self) -> &tokio_postgres::Config {
        &self.pg
    }

    /// The LISTEN/NOTIFY channel of this namespace: `holdfast_` and a stable
    /// 64-bit FNV-1a hash of `schema.table` in hex (channels are per database,
    /// so two namespaces must not share one).
    pub(crate) fn channel(&self) -> String {
        format!("holdfast_{:016x}", self.namespace_hash())
    }

    /// A stable 64-bit FNV-1a hash of `schema.table`.
    pub(crate) fn namespace_hash(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.schema.bytes().chain([b'.']).chain(self.table.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_options_and_keeps_connection_settings() {
        let c = PostgresConfig::from_url(
            "postgres://app:s3cret@127.0.0.1:5433/locks?schema=jobs&table=leases&sslmode=disable\
             &connect_timeout=2&pool_size=2&poll_max_ms=900&listen_url=postgres%3A%2F%2Fapp%40db%3A5432%2Flocks",
        )
        .unwrap();
        assert_eq!(c.schema, "jobs");
        assert_eq!(c.table, "leases");
        assert_eq!(c.ssl_mode, SslMode::Disable);
        assert_eq!(c.pool_size, 2);
        assert_eq!(c.poll.max, Duration::from_millis(900));
        assert_eq!(c.pg.get_ports(), &[5433]);
        assert_eq!(c.pg.get_connect_timeout(), Some(&Duration::from_secs(2)));
        let l = c.listen.as_ref().unwrap();
        assert_eq!(l.get_ports(), &[5432]);
        assert!(!format!("{c:?}").contains("s3cret"), "password in Debug");
        assert_ne!(c.channel(), PostgresConfig::from_url("postgresql://h/db?schema=other").unwrap().channel());
        let d = PostgresConfig::from_url("postgresql://h/db?listen=off").unwrap();
        assert!(d.listen.is_none());
        assert_eq!(d.schema, "public");
        assert_eq!(d.poll, POLL_ONLY);
        assert_eq!(d.prepared, Prepared::Auto);
        for (v, want) in [("auto", Prepared::Auto), ("true", Prepared::Always), ("off", Prepared::Never)] {
            assert_eq!(PostgresConfig::from_url(&format!("postgres://h/db?prepared={v}")).unwrap().prepared, want);
        }
    }

    #[test]
    fn rejects_bad_urls_and_identifiers() {
        for bad in [
            "mysql://h/db",
            "postgres://h/db?schema=Bad",
            "postgres://h/db?schema=a%22%3Bdrop",
            "postgres://h/db?table=1x",
            &format!("postgres://h/db?table={}", "t".repeat(58)),
            "postgres://h/db?sslmode=verify-full",
            "postgres://h/db?sslmode=bogus",
            "postgres://h/db?nope=1",
            "postgres://h/db?pool_size=0",
            "postgres://h/db?prepared=sometimes",
            "postgres://h/db?poll_min_ms=0",
            "postgres://h/db?listen_url=redis%3A%2F%2Fx",
            "postgres://h:notaport/db",
        ] {
            match PostgresConfig::from_url(bad) {
                Err(Error::InvalidInput { what: "url", .. }) => {}
                other => panic!("{bad}: expected InvalidInput, got {other:?}"),
            }
        }
        assert!(check_ident("t", &"t".repeat(57), 57).is_ok());
        let err = PostgresConfig::from_url("postgres://h/db?nope=1").unwrap_err().to_string();
        assert!(err.contains("\"nope\"") && err.contains("namespace (or schema)"), "{err}");
        assert!(err.contains("application_name"), "{err}");
    }

    /// Every option under its common name and under each older or libpq
    /// name: both spellings give the same config, and one that differs from
    /// the default. (tokio_postgres::Config compares by value.)
    #[test]
    fn common_names_and_aliases() {
        let parse = |q: &str| PostgresConfig::from_url(&format!("postgres://u:pw@h/db?{q}")).unwrap();
        let key = |c: &PostgresConfig| {
            (
                format!("{:?} {:?}", c.pg, c.listen),
                (c.ssl_mode, c.ssl_root_cert.clone(), c.schema.clone(), c.table.clone(), c.pool_size),
                (c.op_timeout, c.poll, c.create, c.prepared),
            )
        };
        let base = key(&parse(""));
        for (old, common) in [
            ("sslmode=require", "sslmode=REQUIRE"),
            ("sslrootcert=/ca.pem", "ca_file=/ca.pem"),
            ("sslmode=verify-full&sslrootcert=/ca.pem", "sslmode=verify-full&ca_file=%2Fca.pem"),
            ("schema=jobs", "namespace=jobs"),
            ("table=leases", "table=leases"),
            ("op_timeout_ms=700", "timeout_ms=700"),
            ("connect_timeout=2", "connect_timeout_ms=2000"),
            ("pool_size=2", "pool_size=2"),
            ("poll_min_ms=7", "poll_min_ms=7"),
            ("poll_max_ms=900", "poll_max_ms=900"),
            ("listen=off", "listen=false"),
            ("listen_url=postgres%3A%2F%2Fu%40direct%2Fdb", "listen_url=postgres://u@direct/db"),
            ("create=false", "create=off"),
            ("prepared=0", "prepared=false"),
            ("application_name=app", "application_name=app"),
        ] {
            let old = key(&parse(old));
            assert_eq!(old, key(&parse(common)), "{common}");
            assert_ne!(old, base, "{common} changed nothing");
        }
        // The millisecond option wins over libpq's seconds, whatever the order.
        let c = parse("connect_timeout_ms=1500&connect_timeout=9");
        assert_eq!(c.pg.get_connect_timeout(), Some(&Duration::from_millis(1500)));
        assert_eq!(c.listen.as_ref().and_then(|l| l.get_connect_timeout()), Some(&Duration::from_millis(1500)));
    }
}
