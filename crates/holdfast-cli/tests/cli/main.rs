//! CLI tests: one binary, one module per command; most tests run against a
//! real SQLite file in their own temp dir, the `*_on_every_store` ones against
//! every store's real server too (see [`stores`]).

mod admin;
mod bench;
mod composite;
mod credentials;
mod cron;
mod demo;
mod elect;
mod errors;
mod metrics;
mod paths;
mod run;
mod run_faults;
mod shared;
mod status;
mod terminal;
mod verify;
mod verify_ui;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// A temp dir with a lock store in it, and a way to run `holdfast` in a clean environment.
pub struct Env {
    /// The temp dir, removed on drop.
    pub dir: TempDir,
    /// `sqlite://<dir>/locks.db`.
    pub url: String,
}

impl Default for Env {
    fn default() -> Self {
        Self::new()
    }
}

impl Env {
    /// A fresh temp dir and store URL.
    pub fn new() -> Self {
        let dir = tempfile::Builder::new().prefix("holdfast-cli-test-").tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("locks.db").display());
        Env { dir, url }
    }

    /// A path inside the temp dir.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `holdfast` with no `HOLDFAST_*`/`RUST_LOG` from the caller and the
    /// state directory inside the temp dir.
    pub fn cmd(&self) -> assert_cmd::Command {
        let mut cmd = assert_cmd::Command::new(bin());
        scrub(cmd.env_remove("HOLDFAST_BACKEND"));
        cmd.env("XDG_STATE_HOME", self.path("state")).timeout(Duration::from_secs(60));
        cmd
    }

    /// `holdfast run --backend URL --key KEY <extra> -- <cmd>`.
    pub fn run(&self, key: &str, extra: &[&str], command: &[&str]) -> assert_cmd::Command {
        let mut cmd = self.cmd();
        cmd.args(["run", "--backend", &self.url, "--key", key]).args(extra).arg("--").args(command);
        cmd
    }

    /// The same as a `std::process::Command`, for tests that signal it.
    pub fn run_std(&self, key: &str, extra: &[&str], command: &[&str]) -> std::process::Command {
        self.run_on(&self.url, key, extra, command)
    }

    /// [`Env::run_std`] on the store at `url`.
    pub fn run_on(&self, url: &str, key: &str, extra: &[&str], command: &[&str]) -> std::process::Command {
        let mut cmd = std::process::Command::new(bin());
        cmd.env_remove("HOLDFAST_BACKEND").env_remove("HOLDFAST_KEY").env_remove("HOLDFAST_FENCE");
        cmd.env_remove("RUST_LOG").env_remove("HOLDFAST_PASSWORD").env_remove("HOLDFAST_PASSWORD_FILE");
        cmd.env("XDG_STATE_HOME", self.path("state"));
        cmd.args(["run", "--backend", url, "--key", key]).args(extra).arg("--").args(command);
        cmd
    }

    /// A library client on the same store, with its own runtime.
    pub fn client(&self) -> Lib {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let client = rt.block_on(holdfast::Client::connect_with(
            &self.url,
            holdfast::ClientOptions::default().with_label("test-holder"),
        ));
        Lib { client: client.expect("connect"), rt }
    }
}

/// A store for tests that must pass on every store: its name, its URL, and
/// whatever keeps its server running (dropped at the end of the test).
pub struct Store {
    /// The store's name, for failure messages.
    pub name: &'static str,
    /// Its URL.
    pub url: String,
    /// The server handle, if any.
    pub _server: Option<Box<dyn std::any::Any>>,
}

impl Store {
    /// Crashes the store: SIGKILLs its server. SQLite has no server; its
    /// failure is another connection holding the file's write lock, kept for
    /// as long as the returned connection lives.
    pub fn crash(&mut self, env: &Env) -> Option<rusqlite::Connection> {
        use holdfast_verify::servers::{
            etcd::EtcdCluster, mysql::MysqlServer, postgres::PostgresServer, redis::RedisServer, zookeeper::ZkServer,
        };
        let Some(server) = self._server.as_mut() else {
            let db = rusqlite::Connection::open(env.path("locks.db")).expect("open the SQLite file");
            db.busy_timeout(Duration::from_secs(10)).expect("busy timeout");
            db.execute_batch("BEGIN EXCLUSIVE").expect("take SQLite's write lock");
            return Some(db);
        };
        if let Some(s) = server.downcast_mut::<RedisServer>() {
            s.kill();
        } else if let Some(s) = server.downcast_mut::<EtcdCluster>() {
            s.kill(0);
        } else if let Some(s) = server.downcast_mut::<MysqlServer>() {
            s.kill();
        } else if let Some(s) = server.downcast_mut::<PostgresServer>() {
            s.kill9();
        } else if let Some(s) = server.downcast_mut::<ZkServer>() {
            s.kill(0);
        } else {
            panic!("{}: no way to crash this store's server", self.name);
        }
        None
    }
}

/// Every store the CLI is tested on. As a store lands, add it here, started
/// with its `holdfast_verify::servers` module; the tests that call this run
/// unchanged on it.
pub fn stores(env: &Env) -> Vec<Store> {
    use holdfast_verify::servers::{
        etcd::EtcdCluster, mysql::MysqlServer, postgres::PostgresServer, redis::RedisServer, zookeeper::ZkServer,
    };
    let (redis, etcd, mysql, postgres, zk) =
        (RedisServer::start(), EtcdCluster::start(), MysqlServer::start(), PostgresServer::start(), ZkServer::start());
    vec![
        Store { name: "sqlite", url: env.url.clone(), _server: None },
        Store { name: "redis", url: redis.url(), _server: Some(Box::new(redis)) },
        Store { name: "etcd", url: etcd.url(), _server: Some(Box::new(etcd)) },
        Store { name: "mysql", url: mysql.url(), _server: Some(Box::new(mysql)) },
        Store { name: "postgres", url: postgres.url(), _server: Some(Box::new(postgres)) },
        Store { name: "zookeeper", url: zk.url(), _server: Some(Box::new(zk)) },
    ]
}

fn scrub(cmd: &mut assert_cmd::Command) -> &mut assert_cmd::Command {
    cmd.env_remove("HOLDFAST_KEY").env_remove("HOLDFAST_FENCE").env_remove("RUST_LOG");
    cmd.env_remove("HOLDFAST_PASSWORD").env_remove("HOLDFAST_PASSWORD_FILE")
}

/// The `holdfast` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_holdfast")
}

/// The library, driven from a synchronous test.
pub struct Lib {
    /// The client.
    pub client: holdfast::Client,
    /// Its runtime (renewal runs on its worker thread).
    pub rt: tokio::runtime::Runtime,
}

impl Lib {
    /// Takes `key`, waiting at most 10 s.
    pub fn hold(&self, key: &str) -> holdfast::MutexGuard {
        self.rt.block_on(self.client.mutex(key).acquire_timeout(Duration::from_secs(10))).expect("hold the lock")
    }

    /// Releases a guard taken by [`Lib::hold`].
    pub fn release(&self, guard: holdfast::MutexGuard) {
        self.rt.block_on(guard.release()).expect("release");
    }

    /// Whether the key is free now (takes and releases it).
    pub fn is_free(&self, key: &str) -> bool {
        match self.rt.block_on(self.client.mutex(key).try_acquire()).expect("try_acquire") {
            Some(g) => {
                self.release(g);
                true
            }
            None => false,
        }
    }
}

/// Waits until `path` exists (a child says it is ready).
pub fn wait_for_file(path: &Path, within: Duration) {
    let deadline = Instant::now() + within;
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} did not appear within {within:?}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` to exit; kills it and fails the test after `within`.
pub fn wait_timeout(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("holdfast did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` has ended: gone, or a zombie nobody reaped yet
/// (a zombie runs nothing).
pub fn has_ended(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
        .unwrap_or(true)
}

/// Waits until process `pid` has ended; false if it still runs after `within`.
pub fn ends_within(pid: i32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while !has_ended(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Reads a pid a command wrote to `path`.
pub fn read_pid(path: &Path) -> i32 {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.trim().parse().unwrap_or_else(|e| panic!("{}: {text:?}: {e}", path.display()))
}

/// Asserts stderr is exactly one `holdfast: ...` line containing `needle`, and no panic.
pub fn assert_one_line(stderr: &[u8], needle: &str) {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {text:?}");
    assert!(lines[0].starts_with("holdfast: "), "{text:?}");
    assert!(lines[0].contains(needle), "{text:?} should mention {needle:?}");
    assert!(!text.contains("panicked") && !text.contains("backtrace"), "{text:?}");
}
