//! The raw floor: the fewest store commands that do one lock cycle, sent with
//! the store's plain client and the same connection setup holdfast uses.
//!
//! holdfast is measured against this in the same run. A floor has no
//! fencing, no renewal, no reentrancy and no notification: it is what a
//! hand-written `SET NX PX` lock costs, so `holdfast / floor` says what
//! holdfast's guarantees cost.
//!
//! # Adding a store
//!
//! One module per store, behind the crate feature of the same name (which
//! forwards to holdfast's feature):
//!
//! 1. `src/floor/<store>.rs` with a `pub struct <Store>Floor`, a
//!    `pub async fn connect(url: &str) -> Result<Self>` and `impl Floor`.
//!    Acquire is one conditional write that succeeds only if the key is free
//!    or expired, with the expiry on the store's clock; release is one
//!    owner-checked delete. Map errors with
//!    `holdfast::Error::backend("<store>", retryable, e)` and bound every call
//!    with a timeout ([`OP_TIMEOUT`]). Its read-write lock (`acquire_rw`,
//!    `release_rw`) is the least a hand-written one costs on the store, with
//!    the same expiry.
//! 2. One `#[cfg(feature = "<store>")] pub mod <store>;` line below.
//! 3. One arm in [`floor_for`].
//!
//! Waiting is the same for every floor: [`FloorLocker`](crate::FloorLocker)
//! polls `acquire` every 1 ms, the plain loop users write by hand.

use std::time::Duration;

use async_trait::async_trait;
use holdfast::stores::Store;
use holdfast::{Error, OwnerToken, Result};

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

/// The timeout of every floor call: an unreachable store is an error, never a hang.
pub const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// One store's raw lock commands.
#[async_trait]
pub trait Floor: Send + Sync + 'static {
    /// What the floor sends, for the report (e.g. `SET NX PX + EVALSHA compare-and-delete`).
    fn describe(&self) -> &'static str;

    /// One attempt: takes `key` for `token` for `ttl` if it is free or
    /// expired. `true` if taken.
    async fn acquire(&self, key: &str, token: OwnerToken, ttl: Duration) -> Result<bool>;

    /// Deletes `key` if `token` holds it. `true` if it did.
    async fn release(&self, key: &str, token: OwnerToken) -> Result<bool>;

    /// One attempt at a read share (`write` false: granted unless a writer
    /// holds `key`) or the write side (granted if nobody holds it), in the
    /// fewest requests the store allows.
    async fn acquire_rw(&self, key: &str, token: OwnerToken, ttl: Duration, write: bool) -> Result<bool>;

    /// Releases a read or write share of `token`. `true` if it held one.
    async fn release_rw(&self, key: &str, token: OwnerToken) -> Result<bool>;
}

/// The floor of the store `url` names (the same URL holdfast connects to).
/// One arm per [`Store`], without a wildcard: a new store fails to compile
/// here until it has a floor or says why not.
#[allow(unreachable_code)] // the arms of stores not compiled in
pub async fn floor_for(url: &str) -> Result<Box<dyn Floor>> {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase()).unwrap_or_default();
    let none = |what: &'static str| Err(Error::Unsupported { store: "holdfast-bench", what });
    let Some(store) = Store::from_scheme(&scheme) else {
        return none("a raw floor for this URL scheme (run with --no-floor)");
    };
    match store {
        Store::Sqlite => {
            #[cfg(feature = "sqlite")]
            return Ok(Box::new(sqlite::SqliteFloor::connect(url).await?));
        }
        Store::Mysql => {
            #[cfg(feature = "mysql")]
            return Ok(Box::new(mysql::MysqlFloor::connect(url).await?));
        }
        Store::Postgres => {
            #[cfg(feature = "postgres")]
            return Ok(Box::new(postgres::PostgresFloor::connect(url).await?));
        }
        Store::ZooKeeper if scheme == "zks" || scheme == "zookeepers" => {
            return none("a raw floor over TLS (run with --no-floor)");
        }
        // Sentinel discovery is not part of a raw SET NX floor.
        Store::Redis if scheme == "redis+sentinel" => {
            return none("a raw floor through Sentinel (run with --no-floor, or give the master's redis:// URL)");
        }
        Store::Redis => {
            #[cfg(feature = "redis")]
            return Ok(Box::new(redis::RedisFloor::connect(url).await?));
        }
        Store::Etcd => {
            #[cfg(feature = "etcd")]
            return Ok(Box::new(etcd::EtcdFloor::connect(url).await?));
        }
        Store::ZooKeeper => {
            #[cfg(feature = "zookeeper")]
            return Ok(Box::new(zookeeper::ZkFloor::connect(url).await?));
        }
        // RedLock's floor is its members' SET NX, which `peers` measures
        // against rslock; a floor of its own would be one more RedLock.
        Store::RedLock => return none("a raw floor for RedLock (run with --no-floor; see the peers benchmark)"),
    }
    none("a raw floor for this store in this build (its feature is off)")
}
