//! A `redis-server` on a free loopback port in a temp dir, killed on drop.
//!
//! [`RedisServer::kill`] and [`RedisServer::restart`] simulate a crash and a
//! restart on the same port and directory, so that a durable server
//! ([`RedisServer::start_durable`]: `appendonly yes`, `appendfsync always`)
//! comes back with its data and a volatile one ([`RedisServer::start`]:
//! no RDB, no AOF) comes back empty.
//!
//! [`RedisSentinel`] starts a master, a replica and three sentinels;
//! [`RedisCluster`] a Redis Cluster of three masters.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{ServerProcess, free_port, port_open, require_binary, wait_until};

pub mod cluster;
pub mod sentinel;
pub use cluster::RedisCluster;
pub use sentinel::RedisSentinel;

/// A running (or killed, until restarted) redis-server.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    durable: bool,
    tls: bool,
    binary: PathBuf,
    process: ServerProcess,
}

impl RedisServer {
    /// Starts a server without persistence (`--save '' --appendonly no`).
    pub fn start() -> Self {
        Self::launch(false, false)
    }

    /// Starts a server with `--appendonly yes --appendfsync always`.
    pub fn start_durable() -> Self {
        Self::launch(true, false)
    }

    /// Starts a server that speaks only TLS, with a certificate for
    /// 127.0.0.1 signed by a fresh CA (made with the `openssl` command);
    /// [`url`](Self::url) is then `rediss://127.0.0.1:PORT?ca_file=DIR/ca.pem`.
    pub fn start_tls() -> Self {
        Self::launch(false, true)
    }

    fn launch(durable: bool, tls: bool) -> Self {
        let binary = require_binary("redis-server", &["/usr/bin", "/usr/local/bin"], "redis-server");
        let dir = tempfile::Builder::new().prefix("holdfast-redis.").tempdir().expect("temp dir");
        if tls {
            super::tls::make_server_certificate(dir.path());
        }
        let port = free_port();
        let process = spawn(&binary, port, dir.path(), durable, tls);
        let server = RedisServer { port, dir, durable, tls, binary, process };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let log = self.log_path();
        if self.tls {
            wait_until("redis-server (tls)", Duration::from_secs(20), Some(&log), || {
                port_open(self.port)
                    && std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Ready to accept connections"))
            });
        } else {
            wait_until("redis-server", Duration::from_secs(20), Some(&log), || ping(self.port));
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        if self.tls {
            format!("rediss://127.0.0.1:{}?ca_file={}", self.port, self.dir.path().join("ca.pem").display())
        } else {
            format!("redis://127.0.0.1:{}", self.port)
        }
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
        self.process = spawn(&self.binary, self.port, self.dir.path(), self.durable, self.tls);
        self.wait_ready();
    }
}

fn spawn(binary: &Path, port: u16, dir: &Path, durable: bool, tls: bool) -> ServerProcess {
    let mut cmd = Command::new(binary);
    if tls {
        cmd.arg("--port").arg("0").arg("--tls-port").arg(port.to_string());
        cmd.arg("--tls-cert-file").arg(dir.join("server.pem"));
        cmd.arg("--tls-key-file").arg(dir.join("server.key"));
        cmd.arg("--tls-ca-cert-file").arg(dir.join("ca.pem"));
        cmd.arg("--tls-auth-clients").arg("no");
    } else {
        cmd.arg("--port").arg(port.to_string());
    }
    cmd.arg("--bind")
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
