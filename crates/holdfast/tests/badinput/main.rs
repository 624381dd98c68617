//! Bad input, at volume (docs/design.md clause C10 beyond its fixed cases):
//! property tests of every builder a user can feed, on SQLite with many
//! cases and on every store with a real server with a few (`inputs`), and of
//! every store's client against a hostile peer that answers with garbage
//! (`garbage`). Every outcome is a typed [`holdfast::Error`] or a working
//! grant; nothing panics, hangs, allocates gigabytes for a length prefix, or
//! shows a password. Each test prints how many cases it ran.
//!
//! `BADINPUT_CASES=n` sets every test's case count, for a longer run than
//! CI's.

mod alloc;
mod endpoints;
mod found;
#[cfg(feature = "redis")]
mod garbage;
mod inputs;
#[cfg(feature = "redis")]
mod scripts;

use std::sync::Arc;

use holdfast::backend::Backend;

/// Cases per test: `BADINPUT_CASES`, or `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("BADINPUT_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(default)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// Runs the input properties against the store at `url`.
fn inputs_against(url: &str, store: &str, default_cases: u32) {
    let rt = rt();
    let backend: Arc<dyn Backend> =
        rt.block_on(holdfast::stores::connect(url)).unwrap_or_else(|e| panic!("connect {store}: {e}"));
    inputs::run(&rt, &backend, cases(default_cases), store);
}

#[cfg(feature = "sqlite")]
#[test]
fn inputs_sqlite() {
    let dir = tempfile::tempdir().expect("temp dir");
    inputs_against(&format!("sqlite://{}/locks.db", dir.path().display()), "sqlite", 512);
}

#[cfg(feature = "redis")]
#[test]
fn inputs_redis() {
    let server = holdfast_testkit::servers::redis::RedisServer::start();
    inputs_against(&server.url(), "redis", 64);
}

#[cfg(feature = "redlock")]
#[test]
fn inputs_redlock() {
    let servers: Vec<_> = (0..3).map(|_| holdfast_testkit::servers::redis::RedisServer::start()).collect();
    let hosts: Vec<String> = servers.iter().map(|s| format!("127.0.0.1:{}", s.port())).collect();
    inputs_against(&format!("redlock://{}", hosts.join(",")), "redlock", 64);
}

#[cfg(feature = "etcd")]
#[test]
fn inputs_etcd() {
    let cluster = holdfast_testkit::servers::etcd::EtcdCluster::start();
    inputs_against(&cluster.url(), "etcd", 64);
}

#[cfg(feature = "zookeeper")]
#[test]
fn inputs_zookeeper() {
    let server = holdfast_testkit::servers::zookeeper::ZkServer::start();
    inputs_against(&server.url(), "zookeeper", 64);
}

#[cfg(feature = "postgres")]
#[test]
fn inputs_postgres() {
    let server = holdfast_testkit::servers::postgres::PostgresServer::start();
    inputs_against(&server.url(), "postgres", 64);
}

#[cfg(feature = "mysql")]
#[test]
fn inputs_mysql() {
    let server = holdfast_testkit::servers::mysql::MysqlServer::start();
    inputs_against(&server.url(), "mysql", 64);
}
