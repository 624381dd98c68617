//! The store registry: the one place where a URL scheme picks a store.
//!
//! It stands above the stores and the composites (a composite URL lists
//! store URLs, even other composites' members), and hands its own
//! [`connect`] down to the composites as a [`ConnectFn`](crate::backend::ConnectFn), so that nothing
//! below imports it.

pub(crate) mod deferred;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

use std::sync::Arc;

use crate::backend::Backend;
use crate::vocabulary::error::{Error, Result};
pub use crate::vocabulary::url_text::redact_url;
use crate::vocabulary::url_text::split_scheme;

/// A store holdfast knows: the one list of them. Everything that needs the
/// list (the URL dispatch here; the test kit's servers, `verify`'s spawner
/// and the bench's floors in the other crates) matches on it without a
/// wildcard arm, so a store added here fails to compile until each of them
/// handles it. The composites over other stores' URLs (`layered://`,
/// `fallback://`) are not stores of their own and are not listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Store {
    /// Embedded SQLite (`sqlite://`).
    Sqlite,
    /// Redis: one server, Sentinel or Cluster (`redis://`, `rediss://`, `redis+sentinel://`, ...).
    Redis,
    /// RedLock over several Redis servers (`redlock://`).
    RedLock,
    /// etcd (`etcd://`, `etcds://`).
    Etcd,
    /// ZooKeeper (`zk://`, `zks://`, `zookeeper://`, `zookeepers://`).
    ZooKeeper,
    /// PostgreSQL (`postgres://`, `postgresql://`).
    Postgres,
    /// MySQL and MariaDB (`mysql://`).
    Mysql,
}

impl Store {
    /// Every store, in the order the docs list them.
    pub const ALL: [Store; 7] =
        [Store::Sqlite, Store::Redis, Store::RedLock, Store::Etcd, Store::ZooKeeper, Store::Postgres, Store::Mysql];

    /// The URL schemes that name this store (lowercase; URLs match them in any case).
    pub fn schemes(self) -> &'static [&'static str] {
        match self {
            Store::Sqlite => &["sqlite"],
            Store::Redis => &["redis", "rediss", "redis+sentinel", "redis+cluster", "rediss+cluster"],
            Store::RedLock => &["redlock"],
            Store::Etcd => &["etcd", "etcds"],
            Store::ZooKeeper => &["zk", "zks", "zookeeper", "zookeepers"],
            Store::Postgres => &["postgres", "postgresql"],
            Store::Mysql => &["mysql"],
        }
    }

    /// The cargo feature of `holdfast-lock` that compiles this store in.
    pub fn feature(self) -> &'static str {
        match self {
            Store::Sqlite => "sqlite",
            Store::Redis => "redis",
            Store::RedLock => "redlock",
            Store::Etcd => "etcd",
            Store::ZooKeeper => "zookeeper",
            Store::Postgres => "postgres",
            Store::Mysql => "mysql",
        }
    }

    /// Whether this build has the store (its feature was enabled).
    pub fn compiled_in(self) -> bool {
        match self {
            Store::Sqlite => cfg!(feature = "sqlite"),
            Store::Redis => cfg!(feature = "redis"),
            Store::RedLock => cfg!(feature = "redlock"),
            Store::Etcd => cfg!(feature = "etcd"),
            Store::ZooKeeper => cfg!(feature = "zookeeper"),
            Store::Postgres => cfg!(feature = "postgres"),
            Store::Mysql => cfg!(feature = "mysql"),
        }
    }

    /// The store a URL scheme names, in any case; `None` for a composite
    /// scheme or an unknown one.
    pub fn from_scheme(scheme: &str) -> Option<Store> {
        Store::ALL.into_iter().find(|s| s.schemes().iter().any(|x| x.eq_ignore_ascii_case(scheme)))
    }
}

/// Connects to the store `url` names.
///
/// # Cancel safety
///
/// Cancel-safe: connecting takes no lock. A dropped call leaves nothing
/// the store keeps beyond an idle connection, closed when dropped.
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    let Some((scheme, _)) = split_scheme(url) else {
        return Err(Error::invalid(
            "url",
            format!("{:?} has no scheme; expected for example sqlite:///path/to/locks.db", redact_url(url)),
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    match scheme.as_str() {
        "layered" => return Ok(Arc::new(crate::composites::layered::Layered::open_url(url).await?)),
        "fallback" => return Ok(Arc::new(crate::composites::fallback::Fallback::open_url(url).await?)),
        _ => {}
    }
    let Some(store) = Store::from_scheme(&scheme) else {
        let known: Vec<&str> = Store::ALL
            .iter()
            .flat_map(|s| s.schemes().iter().copied())
            .chain(crate::composites::url::COMPOSITE_SCHEMES.iter().copied())
            .collect();
        return Err(Error::invalid("url", format!("unknown scheme {scheme:?}; known: {}", known.join(", "))));
    };
    if !store.compiled_in() {
        return Err(Error::FeatureDisabled { scheme, feature: store.feature() });
    }
    open(store, url).await
}

/// Opens `store` from `url`: one arm per store, without a wildcard. An arm
/// whose feature is off is never reached ([`connect`] checked
/// [`Store::compiled_in`]).
#[allow(unreachable_code, unused_variables)] // the arms of stores not compiled in
async fn open(store: Store, url: &str) -> Result<Arc<dyn Backend>> {
    let off = || Err(Error::FeatureDisabled { scheme: String::new(), feature: store.feature() });
    match store {
        Store::Sqlite => {
            #[cfg(feature = "sqlite")]
            {
                use crate::stores::sqlite::{SqliteBackend as B, SqliteConfig as C};
                let c = C::from_url(url)?;
                return located(c.endpoint(), B::open(c)).await;
            }
            off()
        }
        Store::Redis => {
            #[cfg(feature = "redis")]
            {
                use crate::stores::redis::{RedisBackend as B, RedisConfig as C};
                let c = C::from_url(url)?;
                return located(c.endpoint(), B::open(c)).await;
            }
            off()
        }
        Store::RedLock => {
            #[cfg(feature = "redlock")]
            return Ok(Arc::new(crate::composites::redlock::RedLock::open_url(url).await?));
            off()
        }
        Store::Etcd => {
            #[cfg(feature = "etcd")]
            {
                use crate::stores::etcd::{EtcdBackend as B, EtcdConfig as C};
                let c = C::from_url(url)?;
                return located(c.endpoint(), B::open(c)).await;
            }
            off()
        }
        Store::ZooKeeper => {
            #[cfg(feature = "zookeeper")]
            {
                use crate::stores::zookeeper::{ZkBackend as B, ZkConfig as C};
                let c = C::from_url(url)?;
                return located(c.endpoint(), B::open(c)).await;
            }
            off()
        }
        Store::Postgres => {
            #[cfg(feature = "postgres")]
            {
                use crate::stores::postgres::{PostgresBackend as B, PostgresConfig as C};
                let c = C::from_url(url)?;
                return located(c.endpoint(), B::open(c)).await;
            }
            off()
        }
        Store::Mysql => {
            #[cfg(feature = "mysql")]
            {
                use crate::stores::mysql::{MysqlBackend as B, MysqlConfig as C};
                let c = C::from_url(url)?;
                return located(c.endpoint(), B::open(c)).await;
            }
            off()
        }
    }
}

/// [`connect`] as a `ConnectFn`, for deferred members to retry with.
fn connect_boxed(url: &str) -> futures::future::BoxFuture<'_, Result<Arc<dyn Backend>>> {
    Box::pin(connect(url))
}

/// Connects to the store `url` names, like [`connect`]; if that fails with
/// a retryable error, returns a store that keeps connecting in the
/// background (doubling its delay from 100 ms to 2 s, jittered) and fails
/// every call retryably until it is connected, so that a composite starts
/// during the outage of a member it exists to ride out. For members of
/// composites built in code ([`RedLock::new`](crate::composites::redlock::RedLock::new),
/// [`Layered::new`](crate::composites::layered::Layered::new),
/// [`Fallback::new`](crate::composites::fallback::Fallback::new)); their `open_url`s
/// and the composite URLs of [`Client::connect`](crate::Client::connect)
/// connect their members this way.
///
/// # Errors
///
/// [`Error::InvalidInput`] for a malformed URL,
/// [`Error::FeatureDisabled`] for a scheme not compiled in, and any
/// permanent connection error, at once.
///
/// # Cancel safety
///
/// Cancel-safe: connecting takes no lock. A dropped call starts no
/// background connection.
pub async fn connect_or_defer(url: &str) -> Result<Arc<dyn Backend>> {
    deferred::connect_or_defer_with(url, connect_boxed).await
}

/// [`connect_or_defer`] as a `ConnectFn`: what the composites open their
/// members with, so that a member down at start is deferred, not fatal.
fn connect_or_defer_boxed(url: &str) -> futures::future::BoxFuture<'_, Result<Arc<dyn Backend>>> {
    Box::pin(connect_or_defer(url))
}

// The composites' `open_url`s live here, beside the registry they need to
// open their members; the rest of each composite knows only `ConnectFn`.

impl crate::composites::layered::Layered {
    /// Opens `layered://FAST_URL|AUTH_URL`: each part a whole store URL with
    /// its own credentials and options (`layered://redis://h:6379|postgres://u@h/db`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a malformed URL (not exactly two parts, a
    /// part that is a composite URL itself, an unknown option); a store's
    /// permanent connection error (bad credentials). A store that cannot be
    /// reached is no error (see [A store down at start](crate::composites::layered#a-store-down-at-start)).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: connecting takes no lock.
    pub async fn open_url(url: &str) -> Result<Self> {
        Self::open_url_with(url, connect_or_defer_boxed).await
    }
}

impl crate::composites::fallback::Fallback {
    /// Opens `fallback://[?options|]STORE_URL|STORE_URL|...`: one store per
    /// URL, in order, the last the arbiter. Options: `mode_ttl_ms`,
    /// `switch_after_ms`, `fail_back_after_ms` (0 never), `name`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed URL; a store's permanent
    /// connection error (bad credentials). A store that cannot be reached is
    /// no error (see [Stores down at start](crate::composites::fallback#stores-down-at-start)).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: connecting takes no lock.
    pub async fn open_url(url: &str) -> Result<Self> {
        Self::open_url_with(url, connect_or_defer_boxed).await
    }
}

#[cfg(feature = "redlock")]
impl crate::composites::redlock::RedLock {
    /// Opens `redlock://host:port,host:port,...[?options]`: one Redis member
    /// per address, with the options every Redis URL takes, plus
    /// `call_timeout_ms`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed URL, or a member's permanent
    /// connection error (bad credentials). A member that cannot be reached
    /// is no error: it counts as a failed vote and is connected in the
    /// background (see [Members down at start](crate::composites::redlock#members-down-at-start)).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: connecting takes no lock.
    pub async fn open_url(url: &str) -> Result<Self> {
        Self::open_url_with(url, connect_or_defer_boxed).await
    }
}

/// The store `open` connects to, its errors naming `endpoint`.
#[allow(dead_code)] // unused when no single store's feature is enabled
async fn located<B: Backend>(endpoint: String, open: impl Future<Output = Result<B>>) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(crate::backend::located::Located::new(open.await?, endpoint)))
}

#[cfg(test)]
#[path = "url_props.rs"]
mod props;

/// Each store's URL options and its page, for the test that holds one
/// against the other: one arm per store without a wildcard, so a store
/// added to [`Store`] fails to compile here until it has both.
#[cfg(test)]
fn options_and_page(store: Store) -> Option<(&'static [crate::vocabulary::url_options::Opt], &'static str)> {
    match store {
        Store::Sqlite => {
            #[cfg(feature = "sqlite")]
            return Some((sqlite::OPTIONS, include_str!("sqlite/docs.md")));
            #[cfg(not(feature = "sqlite"))]
            None
        }
        Store::Redis => {
            #[cfg(feature = "redis")]
            return Some((redis::OPTIONS, include_str!("redis/docs.md")));
            #[cfg(not(feature = "redis"))]
            None
        }
        // Redis's options and `call_timeout_ms`, on the RedLock module's page.
        Store::RedLock => None,
        Store::Etcd => {
            #[cfg(feature = "etcd")]
            return Some((etcd::OPTIONS, include_str!("etcd/docs.md")));
            #[cfg(not(feature = "etcd"))]
            None
        }
        Store::ZooKeeper => {
            #[cfg(feature = "zookeeper")]
            return Some((zookeeper::OPTIONS, include_str!("zookeeper/docs.md")));
            #[cfg(not(feature = "zookeeper"))]
            None
        }
        Store::Postgres => {
            #[cfg(feature = "postgres")]
            return Some((postgres::OPTIONS, include_str!("postgres/docs.md")));
            #[cfg(not(feature = "postgres"))]
            None
        }
        Store::Mysql => {
            #[cfg(feature = "mysql")]
            return Some((mysql::OPTIONS, include_str!("mysql/docs.md")));
            #[cfg(not(feature = "mysql"))]
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every store compiled in documents every URL option it reads, and
    /// nothing else, in its page's "URL options" table.
    #[test]
    fn every_store_documents_its_url_options() {
        for store in Store::ALL {
            match options_and_page(store) {
                Some((options, page)) => crate::vocabulary::url_options::check_docs_table(page, options),
                None => assert!(store == Store::RedLock || !store.compiled_in(), "{store:?} has no options table"),
            }
        }
    }

    /// A URL without a scheme used to be echoed whole, password included.
    #[tokio::test]
    async fn errors_never_quote_a_password() {
        for url in ["app:s3cret@127.0.0.1:6379", "gopher://app:s3cret@h", "app:s3cret@h/x?y=1"] {
            let err = connect(url).await.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("url") && !err.contains("s3cret"), "{url}: {err}");
        }
    }

    #[tokio::test]
    async fn bad_urls_are_typed_errors() {
        assert!(matches!(connect("no-scheme").await, Err(Error::InvalidInput { what: "url", .. })));
        assert!(matches!(connect("gopher://x").await, Err(Error::InvalidInput { what: "url", .. })));
        #[cfg(not(feature = "redis"))]
        assert!(matches!(connect("redis://127.0.0.1:1").await, Err(Error::FeatureDisabled { feature: "redis", .. })));
    }
}
