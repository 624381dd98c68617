//! Redis Sentinel: `redis+sentinel://` URLs and finding the current master.
//!
//! The lookup ([`Resolver`]) asks the sentinels for the master's address
//! and checks with `ROLE` that the server there is a master. When to ask
//! again (a connection error, `READONLY`, `LOADING`) and moving the
//! connections to the answer is in `link.rs`.

use std::fmt;
use std::time::Duration;

use redis::{ConnectionAddr, IntoConnectionInfo, ProtocolVersion, RedisConnectionInfo, Role};

use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::secret::Secret;
use crate::vocabulary::url_options::percent_decode;
use crate::vocabulary::url_text::redact_url;

/// The scheme of Sentinel URLs.
pub(super) const SCHEME: &str = "redis+sentinel";

/// The port of a sentinel written without one.
const DEFAULT_PORT: u16 = 26379;

/// The longest one sentinel's answer is waited for.
const ASK_LIMIT: Duration = Duration::from_secs(1);

/// Where the sentinels are, which master they watch, and how to log in
/// (`redis+sentinel://[user:password@]host[:port],host[:port]/MASTER[/db]`).
#[derive(Clone, PartialEq, Eq)]
pub(super) struct SentinelSettings {
    /// The sentinels, in the order written.
    pub(super) sentinels: Vec<(String, u16)>,
    /// The name the sentinels monitor the master under.
    pub(super) master_name: String,
    /// The database number on the master.
    pub(super) db: i64,
    /// The ACL user of the master (and its replicas).
    pub(super) username: Option<String>,
    /// The password of the master (and its replicas).
    pub(super) password: Option<Secret>,
    /// Log in to the sentinels with the same user and password
    /// (`sentinel_auth=same`); by default the sentinels are asked without
    /// credentials (`sentinel_auth=none`).
    pub(super) auth_sentinels: bool,
}

impl fmt::Debug for SentinelSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelSettings")
            .field("sentinels", &self.sentinels)
            .field("master_name", &self.master_name)
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password)
            .field("auth_sentinels", &self.auth_sentinels)
            .finish()
    }
}

/// The part after `redis+sentinel://` (any case), if `url` is a Sentinel URL.
pub(super) fn strip_scheme(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once("://")?;
    scheme.eq_ignore_ascii_case(SCHEME).then_some(rest)
}

/// Splits the user and password off what follows the scheme of a
/// `redis+sentinel://` or `redis+cluster://` URL (`scheme`, for errors):
/// everything up to the last '@' is user info, as a password may hold an
/// unencoded '/' or '@'. Returns the user, the password and the rest.
pub(super) fn split_credentials<'a>(rest: &'a str, scheme: &str) -> Result<(Option<String>, Option<Secret>, &'a str)> {
    let Some((userinfo, rest)) = rest.rsplit_once('@') else {
        return Ok((None, None, rest));
    };
    let (user, pass) = match userinfo.split_once(':') {
        Some((user, pass)) => (user, Some(pass)),
        None => (userinfo, None),
    };
    let user = percent_decode(user, &format!("the user of a {scheme}:// URL"))?;
    let pass = pass.map(|p| percent_decode(p, &format!("the password of a {scheme}:// URL"))).transpose()?;
    Ok(((!user.is_empty()).then_some(user), pass.filter(|p| !p.is_empty()).map(Secret::new), rest))
}

/// Parses a Sentinel URL without its query (`main`, as written).
pub(super) fn parse(main: &str) -> Result<SentinelSettings> {
    let bad = |why: &str| Error::invalid("url", format!("{}: {why}", redact_url(main)));
    let Some(rest) = strip_scheme(main) else {
        return Err(bad("expected redis+sentinel://HOST:PORT,HOST:PORT/MASTER_NAME"));
    };
    let (username, password, rest) = split_credentials(rest, "redis+sentinel")?;
    let Some((hosts, path)) = rest.split_once('/') else {
        return Err(bad("a redis+sentinel:// URL needs the master name after the sentinels: .../MASTER_NAME"));
    };
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        sentinels.push(parse_host(host, DEFAULT_PORT).ok_or_else(|| {
            bad("the sentinels are a comma-separated list of HOST[:PORT] (IPv6 as [ADDR]:PORT), none empty")
        })?);
    }
    let (name, db) = match path.split_once('/') {
        Some((name, db)) => (name, Some(db)),
        None => (path, None),
    };
    let master_name = percent_decode(name, "the master name of a redis+sentinel:// URL")?;
    if master_name.is_empty() || master_name.len() > 256 || master_name.chars().any(|c| c.is_control() || c == ' ') {
        return Err(bad("the master name (after the sentinels) must be 1..256 characters without spaces"));
    }
    let db = match db {
        None | Some("") => 0,
        Some(db) => match db.parse::<u32>() {
            Ok(n) => i64::from(n),
            Err(_) => return Err(bad("after the master name comes only the database number: .../MASTER_NAME/DB")),
        },
    };
    Ok(SentinelSettings { sentinels, master_name, db, username, password, auth_sentinels: false })
}

/// `host`, `host:port` or `[v6]:port`; `default_port` when none is written.
pub(super) fn parse_host(s: &str, default_port: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(v6) = s.strip_prefix('[') {
        let (addr, after) = v6.split_once(']')?;
        match after {
            "" => (addr, None),
            p => (addr, Some(p.strip_prefix(':')?)),
        }
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let ok_host = !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || "-._:%".contains(c));
    let port = match port {
        None => default_port,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0)?,
    };
    ok_host.then(|| (host.to_owned(), port))
}

/// Finds the current master through the sentinels; shared by every
/// connection of a client.
///
/// It follows Redis's guidelines for Sentinel clients: ask the sentinels
/// `SENTINEL GET-MASTER-ADDR-BY-NAME` (all at once, at most a second each,
/// so a dead or slow one costs little), and use the address most of them
/// name (ties: the first named) whose server says `ROLE` master. The
/// `redis` crate's own lookup (`redis::sentinel`) reads `SENTINEL MASTERS`
/// and skips a master flagged down, which right after a failover names no
/// usable master for a while (measured: the promoted replica took writes
/// and `GET-MASTER-ADDR-BY-NAME` named it, while that lookup failed with
/// `MasterNameNotFoundBySentinel`), so it is not used.
pub(super) struct Resolver {
    sentinels: Vec<redis::Client>,
    master_name: String,
    /// The settings of connections to the master: db, user, password.
    redis: RedisConnectionInfo,
    limit: Duration,
}

fn lookup_error(what: String) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "sentinel lookup", what))
}

impl Resolver {
    /// A resolver for `settings`; one lookup (all sentinels and the
    /// `ROLE` checks included) is bounded by `limit`.
    pub(super) fn new(settings: &SentinelSettings, limit: Duration) -> Result<Self> {
        let mut redis = RedisConnectionInfo::default().set_db(settings.db);
        if let Some(user) = &settings.username {
            redis = redis.set_username(user);
        }
        if let Some(password) = &settings.password {
            redis = redis.set_password(password.expose());
        }
        let mut sentinels = Vec::new();
        for (host, port) in &settings.sentinels {
            let bad = |e: redis::RedisError| Error::invalid("url", format!("sentinel {host}:{port}: {e}"));
            let info = ConnectionAddr::Tcp(host.clone(), *port).into_connection_info().map_err(bad)?;
            let mut login = RedisConnectionInfo::default();
            if settings.auth_sentinels {
                if let Some(user) = &settings.username {
                    login = login.set_username(user);
                }
                if let Some(password) = &settings.password {
                    login = login.set_password(password.expose());
                }
            }
            sentinels.push(redis::Client::open(info.set_redis_settings(login)).map_err(bad)?);
        }
        Ok(Resolver { sentinels, master_name: settings.master_name.clone(), redis, limit })
    }

    /// What one sentinel says the master's address is.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it opens a connection and keeps none.
    async fn ask(&self, sentinel: &redis::Client) -> redis::RedisResult<Option<(String, u16)>> {
        let mut conn = sentinel.get_multiplexed_async_connection().await?;
        redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(&self.master_name).query_async(&mut conn).await
    }

    /// A client of the current master (confirmed by `ROLE`), speaking
    /// `protocol`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it opens connections and keeps none.
    pub(super) async fn master(&self, protocol: ProtocolVersion) -> redis::RedisResult<redis::Client> {
        let lookup = async {
            // A short bound per sentinel, as Redis's guidelines advise: a
            // sentinel host that drops packets must not hold up the others.
            let per_sentinel = self.limit.min(ASK_LIMIT);
            let asks = self.sentinels.iter().map(|s| tokio::time::timeout(per_sentinel, self.ask(s)));
            // Each address with the number of sentinels naming it, in the
            // order first named.
            let mut addresses: Vec<((String, u16), usize)> = Vec::new();
            let mut last_error = None;
            for answer in futures::future::join_all(asks).await {
                match answer {
                    Ok(Ok(Some(addr))) => match addresses.iter_mut().find(|(a, _)| *a == addr) {
                        Some((_, votes)) => *votes += 1,
                        None => addresses.push((addr, 1)),
                    },
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => last_error = Some(e),
                    Err(_) => last_error = Some(lookup_error("a sentinel did not answer in time".into())),
                }
            }
            // The address most sentinels name first: a sentinel cut off from
            // the others may still name an old master that says it is one.
            addresses.sort_by_key(|(_, votes)| std::cmp::Reverse(*votes));
            if addresses.is_empty() {
                return Err(last_error.unwrap_or_else(|| lookup_error("no sentinel knows the master name".into())));
            }
            for ((host, port), _) in addresses {
                let info = ConnectionAddr::Tcp(host.clone(), port)
                    .into_connection_info()?
                    .set_redis_settings(self.redis.clone().set_protocol(protocol));
                let client = redis::Client::open(info)?;
                let mut conn = match client.get_multiplexed_async_connection().await {
                    Ok(conn) => conn,
                    Err(e) => {
                        last_error = Some(e);
                        continue;
                    }
                };
                match redis::cmd("ROLE").query_async::<Role>(&mut conn).await {
                    Ok(Role::Primary { .. }) => return Ok(client),
                    Ok(_) => last_error = Some(lookup_error(format!("{host}:{port} is not a master (yet)"))),
                    Err(e) => last_error = Some(e),
                }
            }
            Err(last_error.unwrap_or_else(|| lookup_error("no master".into())))
        };
        match tokio::time::timeout(self.limit, lookup).await {
            Ok(r) => r,
            Err(_) => Err(lookup_error("asking the sentinels timed out".into())),
        }
    }

    /// The master name, for messages.
    pub(super) fn master_name(&self) -> &str {
        &self.master_name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sentinel_urls() {
        let s = parse("redis+sentinel://u:p%40ss/w@a:1,b,[::1]:3/my.master/2").unwrap();
        assert_eq!(s.sentinels, vec![("a".into(), 1), ("b".into(), 26379), ("::1".into(), 3)]);
        assert_eq!(s.master_name, "my.master");
        assert_eq!(s.db, 2);
        assert_eq!(s.username.as_deref(), Some("u"));
        assert_eq!(s.password.as_ref().map(Secret::expose), Some("p@ss/w"));
        let dbg = format!("{s:?}");
        assert!(!dbg.contains("p@ss") && dbg.contains("***"), "{dbg}");
        let s = parse("REDIS+SENTINEL://h:26380/m").unwrap();
        assert_eq!((s.db, s.username, s.password), (0, None, None));
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h:1,/m",
            "redis+sentinel://h:0/m",
            "redis+sentinel://h:x/m",
            "redis+sentinel://:1/m",
            "redis+sentinel://h/m/x",
            "redis+sentinel://h/m/1/2",
            "redis+sentinel://[::1/m",
            "redis://h/m",
        ] {
            assert!(matches!(parse(bad), Err(Error::InvalidInput { .. })), "{bad}");
        }
        let err = parse("redis+sentinel://u:topsecret@h:1").unwrap_err().to_string();
        assert!(!err.contains("topsecret"), "{err}");
    }
}
