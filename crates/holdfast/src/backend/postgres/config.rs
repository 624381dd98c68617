//! `postgres://` / `postgresql://` URL parsing: the connection settings go to
//! tokio-postgres, holdfast's own options (`schema`, `table`, `sslrootcert`,
//! `listen_url`, ...) are taken out first.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::wait::PollBounds;

/// How the connection is encrypted and the server checked, as in libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS if the server offers it, plain otherwise; the certificate is not checked (libpq's default).
    Prefer,
    /// TLS or fail; the certificate is not checked unless `sslrootcert` is given (then as `VerifyCa`).
    Require,
    /// TLS, and the server certificate must chain to `sslrootcert`; the host name is not checked.
    VerifyCa,
    /// TLS, the certificate must chain to `sslrootcert` and name the host connected to.
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
    /// PEM file of the CA certificate(s) to trust (`sslrootcert`).
    pub ssl_root_cert: Option<PathBuf>,
    /// Schema holding the tables (`schema`, default `public`).
    pub schema: String,
    /// Lease table name (`table`, default `holdfast_leases`); the fence
    /// counter is `<table>_fence`. Schema + table form one namespace.
    pub table: String,
    /// Statement connections (`pool_size`, default 4).
    pub pool_size: usize,
    /// Time limit of each statement, including a reconnect (`op_timeout_ms`, default 5000).
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

fn decode(piece: &str) -> (String, String) {
    url::form_urlencoded::parse(piece.as_bytes())
        .next()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .unwrap_or_default()
}

fn parse_pg(url: &str, app: &str) -> Result<tokio_postgres::Config> {
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
    /// Parses `postgres://user:pass@host:port/db?sslmode=verify-full&sslrootcert=/ca.pem&schema=locks`.
    ///
    /// Options holdfast reads (all others go to tokio-postgres, which rejects
    /// unknown ones): `sslmode` (`disable`, `prefer` (default), `require`,
    /// `verify-ca`, `verify-full`), `sslrootcert`, `schema`, `table`,
    /// `listen_url` (a percent-encoded direct URL for LISTEN), `listen=off`,
    /// `pool_size`, `op_timeout_ms`, `poll_min_ms`, `poll_max_ms`, `create`, `prepared`.
    pub fn from_url(url: &str) -> Result<Self> {
        let lower = url.get(..13).unwrap_or(url).to_ascii_lowercase();
        if !(lower.starts_with("postgres://") || lower.starts_with("postgresql://")) {
            return Err(Error::invalid("url", "expected a postgres:// or postgresql:// URL"));
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept: Vec<&str> = Vec::new();
        let mut ssl_mode = SslMode::Prefer;
        let mut ssl_root_cert = None;
        let mut schema = "public".to_owned();
        let mut table = "holdfast_leases".to_owned();
        let mut listen_url: Option<String> = None;
        let mut listen = true;
        let mut pool_size = 4usize;
        let mut op_timeout = Duration::from_secs(5);
        let (mut poll_min, mut poll_max) = (None, None);
        let mut create = true;
        let mut prepared = Prepared::Auto;
        for piece in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = decode(piece);
            let ms = || {
                v.parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| Error::invalid("url", format!("postgres option {k} needs milliseconds, got {v:?}")))
            };
            let flag = || match v.as_str() {
                "true" | "on" | "1" => Ok(true),
                "false" | "off" | "0" => Ok(false),
                _ => Err(Error::invalid("url", format!("postgres option {k} needs true or false, got {v:?}"))),
            };
            match k.as_str() {
                "sslmode" => {
                    ssl_mode = match v.as_str() {
                        "disable" => SslMode::Disable,
                        "prefer" | "allow" => SslMode::Prefer,
                        "require" => SslMode::Require,
                        "verify-ca" => SslMode::VerifyCa,
                        "verify-full" => SslMode::VerifyFull,
                        _ => return Err(Error::invalid("url", format!("unknown sslmode {v:?}"))),
                    }
                }
                "sslrootcert" => ssl_root_cert = Some(PathBuf::from(v)),
                "schema" => schema = v,
                "table" => table = v,
                "listen_url" => listen_url = Some(v),
                "listen" => listen = flag()?,
                "create" => create = flag()?,
                "prepared" => {
                    prepared = match v.as_str() {
                        "auto" => Prepared::Auto,
                        _ if flag()? => Prepared::Always,
                        _ => Prepared::Never,
                    }
                }
                "pool_size" => {
                    pool_size = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=64).contains(n))
                        .ok_or_else(|| Error::invalid("url", format!("pool_size must be 1..=64, got {v:?}")))?
                }
                "op_timeout_ms" => op_timeout = ms()?,
                "poll_min_ms" => poll_min = Some(ms()?),
                "poll_max_ms" => poll_max = Some(ms()?),
                _ => kept.push(piece),
            }
        }
        check_ident("schema", &schema, 63)?;
        // The fence table appends "_fence" and must stay within 63 bytes.
        check_ident("table", &table, 57)?;
        if op_timeout.is_zero() {
            return Err(Error::invalid("url", "op_timeout_ms must be > 0"));
        }
        if ssl_mode == SslMode::Require && ssl_root_cert.is_some() {
            ssl_mode = SslMode::VerifyCa;
        }
        if matches!(ssl_mode, SslMode::VerifyCa | SslMode::VerifyFull) && ssl_root_cert.is_none() {
            return Err(Error::invalid("url", "sslmode=verify-ca/verify-full needs sslrootcert=/path/to/ca.pem"));
        }
        let pg_url = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        let pg = parse_pg(&pg_url, "holdfast")?;
        let listen = match (listen, listen_url) {
            (false, _) => None,
            (true, None) => {
                let mut l = pg.clone();
                l.application_name(format!("{}-listener", pg.get_application_name().unwrap_or("holdfast")));
                Some(l)
            }
            (true, Some(u)) => {
                let (b, q) = u.split_once('?').unwrap_or((&u, ""));
                let lower = b.get(..13).unwrap_or(b).to_ascii_lowercase();
                if !(lower.starts_with("postgres://") || lower.starts_with("postgresql://")) {
                    return Err(Error::invalid("url", "listen_url must be a postgres:// URL"));
                }
                // Only connection settings belong in listen_url; TLS follows the main URL.
                let q: Vec<&str> = q.split('&').filter(|p| !p.is_empty() && decode(p).0 != "sslmode").collect();
                let u = if q.is_empty() { b.to_owned() } else { format!("{b}?{}", q.join("&")) };
                let app = format!("{}-listener", pg.get_application_name().unwrap_or("holdfast"));
                Some(parse_pg(&u, &app)?)
            }
        };
        let default_poll = if listen.is_some() { POLL_LISTENING } else { POLL_ONLY };
        let poll = PollBounds { min: poll_min.unwrap_or(default_poll.min), max: poll_max.unwrap_or(default_poll.max) };
        if poll.min.is_zero() || poll.max < poll.min {
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
    }
}
