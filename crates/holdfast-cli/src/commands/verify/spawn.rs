//! `--spawn STORE`: verify starts the store's server itself, on loopback in
//! a temp dir (`holdfast_verify::servers`, which the tests use too), and can
//! then fault the server too: `restart` (SIGKILL and start again on the
//! same data: with persistence the locks survive, without it they are gone)
//! and `leader` (SIGKILL the leader of a 3-member etcd or ZooKeeper ensemble).

use std::sync::{Arc, Mutex};

use holdfast::stores::Store;
use holdfast_verify::servers::{
    etcd::EtcdCluster, mysql::MysqlServer, postgres::PostgresServer, redis::RedisServer, zookeeper::ZkServer,
};

use crate::exit::{Failure, UNAVAILABLE, USAGE};

/// The `--spawn` names that start `store`: one arm per store, without a
/// wildcard, so that a store added to the library fails to compile here
/// until `verify` can start it or says why not.
pub fn spawn_names(store: Store) -> &'static [&'static str] {
    match store {
        Store::Sqlite => &["sqlite"],
        Store::Redis => &["redis", "redis-durable"],
        // RedLock is verified over members the user runs (--backend redlock://...).
        Store::RedLock => &[],
        Store::Etcd => &["etcd", "etcd3"],
        Store::ZooKeeper => &["zookeeper", "zookeeper3"],
        Store::Postgres => &["postgres"],
        Store::Mysql => &["mysql"],
    }
}

/// A server verify started.
pub enum Spawned {
    /// No server: an SQLite file in a temp dir.
    Sqlite(tempfile::TempDir),
    /// Redis; durable (`appendfsync always`) or without persistence.
    Redis(RedisServer, bool),
    /// PostgreSQL.
    Postgres(PostgresServer),
    /// MariaDB.
    Mysql(MysqlServer),
    /// etcd, 1 or 3 members.
    Etcd(EtcdCluster, usize),
    /// ZooKeeper, 1 or 3 members; whether a member was killed (the
    /// spawners cannot start one again, so only one leader kill keeps a quorum).
    Zk(ZkServer, bool),
}

/// Every `--spawn` name.
fn names() -> Vec<&'static str> {
    Store::ALL.into_iter().flat_map(spawn_names).copied().collect()
}

/// A spawned server shared with the fault injector.
pub type Shared = Arc<Mutex<Spawned>>;

impl Spawned {
    /// Starts `name` (blocking: call on a blocking thread). A missing
    /// server binary is an error naming the package to install.
    pub fn start(name: &str) -> Result<Self, Failure> {
        let name = name.to_owned();
        let started = std::panic::catch_unwind(move || match name.as_str() {
            "sqlite" => tempfile::tempdir().map(Spawned::Sqlite).map_err(|e| e.to_string()),
            "redis" => Ok(Spawned::Redis(RedisServer::start(), false)),
            "redis-durable" => Ok(Spawned::Redis(RedisServer::start_durable(), true)),
            "postgres" => Ok(Spawned::Postgres(PostgresServer::start())),
            "mysql" => Ok(Spawned::Mysql(MysqlServer::start())),
            "etcd" => Ok(Spawned::Etcd(EtcdCluster::start(), 1)),
            "etcd3" => Ok(Spawned::Etcd(EtcdCluster::start_members(3), 3)),
            "zookeeper" => Ok(Spawned::Zk(ZkServer::start(), false)),
            "zookeeper3" => Ok(Spawned::Zk(ZkServer::start_ensemble(3), false)),
            other => Err(format!("--spawn {other}: not a store verify can start ({})", names().join(", "))),
        });
        match started {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(Failure::new(USAGE, e)),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                Err(Failure::new(UNAVAILABLE, format!("could not start the server: {why}")))
            }
        }
    }

    /// The store URL.
    pub fn url(&self) -> String {
        match self {
            Spawned::Sqlite(dir) => format!("sqlite://{}", dir.path().join("locks.db").display()),
            Spawned::Redis(s, _) => s.url(),
            Spawned::Postgres(s) => s.url(),
            Spawned::Mysql(s) => s.url(),
            Spawned::Etcd(s, _) => s.url(),
            Spawned::Zk(s, _) => s.url(),
        }
    }

    /// Whether `restart` is possible, and whether the locks survive it.
    pub fn restart_keeps_state(&self) -> Option<bool> {
        match self {
            Spawned::Sqlite(_) | Spawned::Zk(..) => None,
            // The plain `RedisServer` runs with --save '' --appendonly no.
            Spawned::Redis(_, durable) => Some(*durable),
            Spawned::Postgres(_) | Spawned::Mysql(_) | Spawned::Etcd(..) => Some(true),
        }
    }

    /// Whether `leader` is possible (a 3-member ensemble).
    pub fn has_leader(&self) -> bool {
        match self {
            Spawned::Etcd(_, n) => *n > 1,
            Spawned::Zk(s, _) => s.len() > 1,
            _ => false,
        }
    }

    /// SIGKILLs the server and starts it again on the same port and data.
    pub fn restart(&mut self) {
        match self {
            Spawned::Sqlite(_) | Spawned::Zk(..) => {}
            Spawned::Redis(s, _) => s.restart(),
            Spawned::Postgres(s) => {
                s.kill9();
                s.start_again();
            }
            Spawned::Mysql(s) => {
                s.kill();
                s.start_again();
            }
            Spawned::Etcd(s, _) => s.restart(0),
        }
    }

    /// SIGKILLs the ensemble's leader; returns its index. An etcd member
    /// is started again by [`revive`](Self::revive); a ZooKeeper member
    /// stays down (the other two keep a quorum), so ZooKeeper's leader is
    /// killed once per run.
    pub fn kill_leader(&mut self) -> Option<usize> {
        match self {
            Spawned::Etcd(s, n) if *n > 1 => {
                let i = s.leader()?;
                s.kill(i);
                Some(i)
            }
            Spawned::Zk(s, killed) if s.len() > 1 && !*killed => {
                let i = s.leader()?;
                s.kill(i);
                *killed = true;
                Some(i)
            }
            _ => None,
        }
    }

    /// Starts a killed etcd member again.
    pub fn revive(&mut self, i: usize) {
        if let Spawned::Etcd(s, n) = self
            && *n > 1
        {
            s.restart(i);
        }
    }
}

/// `url` with its one `127.0.0.1:PORT` replaced by `proxy`, and the port;
/// `None` when the URL names no such address or more than one (an ensemble).
pub fn through_proxy(url: &str, proxy: std::net::SocketAddr) -> Option<String> {
    let upstream = upstream_of(url)?;
    Some(url.replacen(&upstream.to_string(), &proxy.to_string(), 1))
}

/// The one loopback server address in `url`, if there is exactly one.
pub fn upstream_of(url: &str) -> Option<std::net::SocketAddr> {
    const HOST: &str = "127.0.0.1:";
    if url.matches(HOST).count() != 1 {
        return None;
    }
    let at = url.find(HOST)? + HOST.len();
    let port: String = url[at..].chars().take_while(char::is_ascii_digit).collect();
    format!("{HOST}{port}").parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_go_through_the_proxy_when_they_name_one_server() {
        let proxy: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
        let pg = "postgres://postgres@127.0.0.1:5433/postgres?sslmode=disable";
        assert_eq!(
            super::through_proxy(pg, proxy).as_deref(),
            Some("postgres://postgres@127.0.0.1:9/postgres?sslmode=disable")
        );
        assert_eq!(super::through_proxy("zk://127.0.0.1:1,127.0.0.1:2", proxy), None);
        assert_eq!(super::through_proxy("sqlite:///tmp/x.db", proxy), None);
    }
}
