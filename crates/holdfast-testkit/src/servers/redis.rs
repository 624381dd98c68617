//! A `redis-server` on a free loopback port in a temp dir, killed on drop.
//!
//! [`RedisServer::kill`] and [`RedisServer::restart`] simulate a crash and a
//! restart on the same port and directory, so that a durable server
//! ([`RedisServer::start_durable`]: `appendonly yes`, `appendfsync always`)
//! comes back with its data and a volatile one ([`RedisServer::start`]:
//! no RDB, no AOF) comes back empty.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{ServerProcess, free_port, port_open, require_binary, wait_until};

/// A running (or killed, until restarted) redis-server.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    durable: bool,
    binary: PathBuf,
    process: ServerProcess,
}

impl RedisServer {
    /// Starts a server without persistence (`--save '' --appendonly no`).
    pub fn start() -> Self {
        Self::launch(false)
    }

    /// Starts a server with `--appendonly yes --appendfsync always`.
    pub fn start_durable() -> Self {
        Self::launch(true)
    }

    fn launch(durable: bool) -> Self {
        let binary = require_binary("redis-server", &["/usr/bin", "/usr/local/bin"], "redis-server");
        let dir = tempfile::Builder::new().prefix("holdfast-redis.").tempdir().expect("temp dir");
        let port = free_port();
        let process = spawn(&binary, port, dir.path(), durable);
        let server = RedisServer { port, dir, durable, binary, process };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let log = self.log_path();
        wait_until("redis-server", Duration::from_secs(20), Some(&log), || ping(self.port));
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// SIGKILL (a crash; nothing is flushed beyond what the config fsyncs).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Kills the server if it runs, then starts it again on the same port and dir.
    pub fn restart(&mut self) {
        self.process.kill();
        self.process = spawn(&self.binary, self.port, self.dir.path(), self.durable);
        self.wait_ready();
    }
}

fn spawn(binary: &Path, port: u16, dir: &Path, durable: bool) -> ServerProcess {
    let mut cmd = Command::new(binary);
    cmd.arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--dir")
        .arg(dir)
        .arg("--save")
        .arg("")
        .arg("--daemonize")
        .arg("no")
        .arg("--protected-mode")
        .arg("no");
    if durable {
        cmd.arg("--appendonly").arg("yes").arg("--appendfsync").arg("always");
    } else {
        cmd.arg("--appendonly").arg("no");
    }
    // Server output goes to the log file that ServerProcess opens.
    ServerProcess::spawn(cmd, &dir.join("redis.log"))
}

/// True if the server answers PING with PONG (a raw RESP exchange, no client crate).
fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    if !port_open(port) {
        return false;
    }
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
}
