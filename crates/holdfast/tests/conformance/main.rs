//! The conformance suite C1..C17 against every enabled store, one test per clause.

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(all(feature = "redis", feature = "sqlite"))]
mod fallback;
#[cfg(all(feature = "redis", feature = "postgres"))]
mod layered;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redis_cluster;
#[cfg(feature = "redis")]
mod redis_fair;
#[cfg(feature = "redis")]
mod redis_sentinel;
#[cfg(feature = "redlock")]
mod redlock;
mod sim;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "zookeeper")]
mod zookeeper;
