//! Redis Sentinel on loopback: one master, one replica (`replicaof`) and
//! three sentinels (`sentinel monitor NAME 127.0.0.1 PORT 2`,
//! `down-after-milliseconds 1000`), each on a free port with its own
//! directory in one temp dir, all SIGKILLed on drop.
//!
//! The sentinels are told each other and the replica in their config files
//! (`sentinel myid`, `known-sentinel`, `known-replica`), so they need not
//! discover them from the master's `INFO` (3 to 10 s, measured), and a
//! failover can start as soon as [`RedisSentinel::start`] returns.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::proxy::FaultProxy;
use crate::servers::{ServerProcess, require_binary, wait_until};

/// The master name the sentinels monitor.
pub const MASTER_NAME: &str = "holdfast-master";

/// A master, a replica and three sentinels.
#[derive(Debug)]
pub struct RedisSentinel {
    /// The two data nodes (master first at the start), by port.
    nodes: Vec<(u16, ServerProcess)>,
    /// The sentinels, by port.
    sentinels: Vec<(u16, ServerProcess)>,
    /// The proxy the replica replicates through, if asked for.
    replication: Option<FaultProxy>,
    /// Dropped last, after the processes were killed.
    dir: tempfile::TempDir,
}

/// A reply of a Redis server, as far as these helpers need one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`, a bulk string or an integer, as text.
    Text(String),
    /// `-ERR ...`.
    Error(String),
    /// A nil reply.
    Nil,
    /// An array.
    Array(Vec<Reply>),
}

impl RedisSentinel {
    /// Starts the five servers and waits until the replica is in sync and
    /// every sentinel answers with the master's address.
    pub fn start() -> Self {
        Self::start_with(1000)
    }

    /// [`start`](Self::start) with another `down-after-milliseconds` (a long
    /// one keeps a slow test from seeing a failover it did not ask for).
    pub fn start_with(down_after_ms: u64) -> Self {
        Self::launch(down_after_ms, false)
    }

    /// [`start`](Self::start), with the replica replicating through a
    /// [`FaultProxy`] ([`replication_proxy`](Self::replication_proxy)), so a
    /// test can make it lag (`blackhole`) while the master takes writes.
    /// The sentinels' `failover-timeout` is then 60 s: a sentinel "fixes" a
    /// replica that follows another address than the master's (here the
    /// proxy's) once that long has passed, which a test must not see.
    pub fn start_with_replication_proxy() -> Self {
        Self::launch(1000, true)
    }

    fn launch(down_after_ms: u64, via_proxy: bool) -> Self {
        let server = require_binary("redis-server", &["/usr/bin", "/usr/local/bin"], "redis-server");
        let dir = tempfile::Builder::new().prefix("holdfast-sentinel.").tempdir().expect("temp dir");
        // Five distinct ports (`free_port` never repeats one in a process).
        let ports = (0..5).map(|_| crate::servers::free_port()).collect::<Vec<u16>>();
        let (pm, pr) = (ports[0], ports[1]);
        let replication = via_proxy.then(|| FaultProxy::start(([127, 0, 0, 1], pm).into()));
        let replica_of = replication.as_ref().map_or(pm, |p| p.addr().port());
        let failover_timeout_ms = if via_proxy { 60_000 } else { 5000 };
        let mut nodes = Vec::new();
        for (i, port) in [pm, pr].into_iter().enumerate() {
            let d = dir.path().join(format!("node{i}"));
            std::fs::create_dir_all(&d).expect("node dir");
            let mut cmd = Command::new(&server);
            cmd.arg("--port").arg(port.to_string()).arg("--bind").arg("127.0.0.1").arg("--dir").arg(&d);
            cmd.args(["--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no"]);
            cmd.args(["--repl-diskless-sync-delay", "0"]);
            if i == 1 {
                cmd.arg("--replicaof").arg("127.0.0.1").arg(replica_of.to_string());
            }
            nodes.push((port, ServerProcess::spawn(cmd, &d.join("redis.log"))));
        }
        let ports: Vec<u16> = ports[2..].to_vec();
        // Distinct ids in every set, so two sets running at once never share one.
        let ids: Vec<String> = (0..3).map(|_| format!("{:032x}{:08x}", rand::random::<u128>(), 0)).collect();
        let mut sentinels = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let d = dir.path().join(format!("sentinel{i}"));
            std::fs::create_dir_all(&d).expect("sentinel dir");
            let mut conf = format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\nprotected-mode no\ndir {dir}\nsentinel myid {id}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {pm} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}\n\
                 sentinel failover-timeout {MASTER_NAME} {failover_timeout_ms}\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n\
                 sentinel known-replica {MASTER_NAME} 127.0.0.1 {pr}\n",
                dir = d.display(),
                id = ids[i],
            );
            for (j, other) in ports.iter().enumerate().filter(|(j, _)| *j != i) {
                conf.push_str(&format!("sentinel known-sentinel {MASTER_NAME} 127.0.0.1 {other} {}\n", ids[j]));
            }
            let conf_path = d.join("sentinel.conf");
            std::fs::write(&conf_path, conf).expect("sentinel.conf");
            let mut cmd = Command::new(&server);
            cmd.arg(&conf_path).arg("--sentinel");
            sentinels.push((*port, ServerProcess::spawn(cmd, &d.join("sentinel.log"))));
        }
        let set = RedisSentinel { nodes, sentinels, replication, dir };
        set.wait_ready(pm, pr);
        set
    }

    fn wait_ready(&self, pm: u16, pr: u16) {
        let node_log = |i: usize| self.dir.path().join(format!("node{i}/redis.log"));
        wait_until("redis master", Duration::from_secs(20), Some(&node_log(0)), || {
            command(pm, &["PING"]) == Some(Reply::Text("PONG".into()))
        });
        wait_until(
            "redis replica in sync",
            Duration::from_secs(20),
            Some(&node_log(1)),
            || matches!(command(pr, &["INFO", "replication"]), Some(Reply::Text(t)) if t.contains("master_link_status:up")),
        );
        // "Linked" is not yet streaming: after a diskless sync the master
        // sends the replica the writes made since only once the replica's
        // first REPLCONF ACK came (up to a second later), so a master killed
        // in that window takes them all with it (seen: a grant made 0.8 s
        // before the kill was not on the promoted replica). A write that
        // WAIT confirms shows the stream flows.
        wait_until(
            "redis replica streaming (a write WAIT confirms)",
            Duration::from_secs(20),
            Some(&node_log(0)),
            || {
                let write = ["SET", "holdfast-testkit:ready", "1"];
                let replies = pipeline(pm, &[&write, &["WAIT", "1", "200"], &["DEL", "holdfast-testkit:ready"]]);
                matches!(replies.as_deref(), Some([_, Reply::Text(n), _]) if n == "1")
            },
        );
        for (i, (port, _)) in self.sentinels.iter().enumerate() {
            let log = self.dir.path().join(format!("sentinel{i}/sentinel.log"));
            let what = "redis sentinel (redis-server --sentinel; apt-get install -y redis-server redis-sentinel)";
            wait_until(what, Duration::from_secs(20), Some(&log), || {
                let addr = command(*port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
                let master =
                    addr == Some(Reply::Array(vec![Reply::Text("127.0.0.1".into()), Reply::Text(pm.to_string())]));
                let info = self.sentinel_info(*port);
                let field = |k: &str| info.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone()).unwrap_or_default();
                master && field("num-slaves") == "1" && field("num-other-sentinels") == "2"
            });
        }
    }

    /// `SENTINEL MASTER` of one sentinel, as field/value pairs.
    fn sentinel_info(&self, port: u16) -> Vec<(String, String)> {
        match command(port, &["SENTINEL", "MASTER", MASTER_NAME]) {
            Some(Reply::Array(items)) => items
                .chunks(2)
                .filter_map(|kv| match kv {
                    [Reply::Text(k), Reply::Text(v)] => Some((k.clone(), v.clone())),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/holdfast-master`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.sentinels.iter().map(|(p, _)| format!("127.0.0.1:{p}")).collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The ports of the sentinels.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|(p, _)| *p).collect()
    }

    /// The ports of the two data nodes (the first master first).
    pub fn node_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|(p, _)| *p).collect()
    }

    /// The master's port as the first sentinel that answers names it.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|(port, _)| {
            match command(*port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]) {
                Some(Reply::Array(a)) => match a.get(1) {
                    Some(Reply::Text(p)) => p.parse().ok(),
                    _ => None,
                },
                _ => None,
            }
        })
    }

    /// SIGKILLs the current master; returns its port.
    pub fn kill_master(&mut self) -> u16 {
        let port = self.master_port().expect("no sentinel names a master");
        self.kill_node(port);
        port
    }

    /// SIGKILLs the data node on `port` (one of [`node_ports`](Self::node_ports)).
    pub fn kill_node(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|(p, _)| *p == port).expect("not a data node's port");
        node.1.kill();
    }

    /// The proxy the replica replicates through
    /// ([`start_with_replication_proxy`](Self::start_with_replication_proxy)).
    pub fn replication_proxy(&self) -> Option<&FaultProxy> {
        self.replication.as_ref()
    }

    /// Waits until the sentinels name a master other than `old_port` and it
    /// answers `ROLE` as a master that takes writes; returns that port and
    /// the time waited. Panics after `timeout` with the sentinels' logs.
    pub fn wait_promoted(&self, old_port: u16, timeout: Duration) -> (u16, Duration) {
        let start = Instant::now();
        let mut found = None;
        let log = self.dir.path().join("sentinel0/sentinel.log");
        wait_until("sentinel failover", timeout, Some(&log), || {
            let Some(port) = self.master_port().filter(|p| *p != old_port) else { return false };
            let role = matches!(command(port, &["ROLE"]), Some(Reply::Array(a)) if a.first() == Some(&Reply::Text("master".into())));
            if role {
                found = Some(port);
            }
            role
        });
        (found.unwrap_or(old_port), start.elapsed())
    }

    /// The temp dir holding every node's and sentinel's directory and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The log file of sentinel `i` (0..3).
    pub fn sentinel_log(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("sentinel{i}/sentinel.log"))
    }
}

/// Sends one command to `127.0.0.1:port` and reads the reply (a minimal RESP2
/// client, so this crate needs no Redis crate); `None` when the server
/// cannot be reached or the reply cannot be read within a second.
pub fn command(port: u16, args: &[&str]) -> Option<Reply> {
    pipeline(port, &[args]).and_then(|mut r| r.pop())
}

/// Sends `commands` on one connection to `127.0.0.1:port` and reads their
/// replies, as [`command`] does for one.
pub fn pipeline(port: u16, commands: &[&[&str]]) -> Option<Vec<Reply>> {
    let stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(300)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut req = String::new();
    for args in commands {
        req.push_str(&format!("*{}\r\n", args.len()));
        for a in *args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
    }
    (&stream).write_all(req.as_bytes()).ok()?;
    let mut reader = BufReader::new(stream);
    commands.iter().map(|_| read_reply(&mut reader)).collect()
}

fn read_reply(r: &mut BufReader<TcpStream>) -> Option<Reply> {
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at_checked(1)?;
    match kind {
        "+" | ":" => Some(Reply::Text(rest.to_owned())),
        "-" => Some(Reply::Error(rest.to_owned())),
        "$" => {
            let n: i64 = rest.parse().ok()?;
            if n < 0 {
                return Some(Reply::Nil);
            }
            let mut buf = vec![0; n as usize + 2];
            r.read_exact(&mut buf).ok()?;
            buf.truncate(n as usize);
            Some(Reply::Text(String::from_utf8_lossy(&buf).into_owned()))
        }
        "*" => {
            let n: i64 = rest.parse().ok()?;
            if n < 0 {
                return Some(Reply::Nil);
            }
            (0..n).map(|_| read_reply(r)).collect::<Option<Vec<_>>>().map(Reply::Array)
        }
        _ => None,
    }
}
