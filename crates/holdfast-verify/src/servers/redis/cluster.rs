//! A Redis Cluster on loopback: three masters (and, if asked, a replica of
//! each), each node on its own client port and cluster-bus port
//! (`--cluster-port`, all chosen together so they are distinct), each with
//! its own directory in one temp dir, all SIGKILLed on drop.
//!
//! The cluster is formed without `redis-cli`: each node takes a third of
//! the 16384 slots (`CLUSTER ADDSLOTSRANGE`, Redis 7) and a distinct config
//! epoch, then the first node meets the others (`CLUSTER MEET`). It is
//! ready when every node reports `cluster_state:ok`, knows the three
//! nodes, and every node's `CLUSTER SLOTS` maps the slots to the same ports.
//!
//! [`RedisCluster::begin_migration`], [`RedisCluster::migrate_keys`] and
//! [`RedisCluster::finish_migration`] move one slot to another master in
//! the steps `redis-cli --cluster reshard` takes, so a test can act between
//! them.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::sentinel::{Reply, command, pipeline};
use crate::servers::{ServerProcess, require_binary, wait_until};

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// Three masters sharing the slots (and, with
/// [`start_with_replicas`](RedisCluster::start_with_replicas), a replica of each).
#[derive(Debug)]
pub struct RedisCluster {
    /// (client port, bus port, process): the masters in slot order (node 0
    /// has the first third), then their replicas in the same order.
    nodes: Vec<(u16, u16, ServerProcess)>,
    /// How many of `nodes` are the first masters (3).
    masters: usize,
    /// Dropped last, after the processes were killed.
    dir: tempfile::TempDir,
}

fn text(reply: Option<Reply>) -> Option<String> {
    match reply {
        Some(Reply::Text(t)) => Some(t),
        _ => None,
    }
}

/// `command`, panicking unless the reply is `+OK`.
fn ok(port: u16, args: &[&str]) {
    let reply = command(port, args);
    assert_eq!(reply, Some(Reply::Text("OK".into())), "{args:?} on 127.0.0.1:{port}");
}

impl RedisCluster {
    /// Starts three masters and forms the cluster; returns once every node
    /// agrees on who owns every slot.
    pub fn start() -> Self {
        Self::launch(false)
    }

    /// Three masters and a replica of each (`CLUSTER REPLICATE`), with a
    /// `cluster-node-timeout` of 2 s, so that a master killed is replaced by
    /// its replica within a few seconds. Returns once every replica is in
    /// sync.
    pub fn start_with_replicas() -> Self {
        Self::launch(true)
    }

    fn launch(replicas: bool) -> Self {
        let server = require_binary("redis-server", &["/usr/bin", "/usr/local/bin"], "redis-server redis-tools");
        let dir = tempfile::Builder::new().prefix("holdfast-cluster.").tempdir().expect("temp dir");
        let count = if replicas { 6 } else { 3 };
        let ports = (0..2 * count).map(|_| crate::servers::free_port()).collect::<Vec<u16>>();
        let timeout = if replicas { "2000" } else { "5000" };
        let mut nodes = Vec::new();
        for i in 0..count {
            let (port, bus) = (ports[2 * i], ports[2 * i + 1]);
            let d = dir.path().join(format!("node{i}"));
            std::fs::create_dir_all(&d).expect("node dir");
            let mut cmd = Command::new(&server);
            cmd.arg("--port").arg(port.to_string()).arg("--bind").arg("127.0.0.1").arg("--dir").arg(&d);
            cmd.args(["--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no"]);
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", timeout]);
            cmd.args(["--repl-diskless-sync-delay", "0"]);
            cmd.arg("--cluster-config-file").arg(d.join("nodes.conf"));
            cmd.arg("--cluster-port").arg(bus.to_string());
            nodes.push((port, bus, ServerProcess::spawn(cmd, &d.join("redis.log"))));
        }
        let cluster = RedisCluster { nodes, masters: 3, dir };
        cluster.form();
        cluster
    }

    fn log(&self, i: usize) -> std::path::PathBuf {
        self.dir.path().join(format!("node{i}/redis.log"))
    }

    fn form(&self) {
        let third = SLOTS / 3;
        for (i, (port, _, _)) in self.nodes.iter().enumerate() {
            wait_until("redis-server (cluster node)", Duration::from_secs(20), Some(&self.log(i)), || {
                command(*port, &["PING"]) == Some(Reply::Text("PONG".into()))
            });
            if i >= self.masters {
                continue;
            }
            let first = third * i as u16;
            let last = if i == 2 { SLOTS - 1 } else { third * (i as u16 + 1) - 1 };
            ok(*port, &["CLUSTER", "ADDSLOTSRANGE", &first.to_string(), &last.to_string()]);
            ok(*port, &["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()]);
        }
        let first = self.nodes[0].0;
        for (port, bus, _) in &self.nodes[1..] {
            ok(first, &["CLUSTER", "MEET", "127.0.0.1", &port.to_string(), &bus.to_string()]);
        }
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        for (i, (port, _, _)) in self.nodes.iter().enumerate() {
            wait_until("redis cluster formed (cluster_state:ok)", Duration::from_secs(30), Some(&self.log(i)), || {
                let info = text(command(*port, &["CLUSTER", "INFO"])).unwrap_or_default();
                info.contains("cluster_state:ok") && info.contains(&known)
            });
        }
        for i in self.masters..self.nodes.len() {
            let (port, master) = (self.nodes[i].0, self.nodes[i - self.masters].0);
            let id = self.node_id(master);
            wait_until("redis cluster replica attached", Duration::from_secs(30), Some(&self.log(i)), || {
                command(port, &["CLUSTER", "REPLICATE", &id]) == Some(Reply::Text("OK".into()))
            });
            wait_until(
                "redis cluster replica in sync",
                Duration::from_secs(30),
                Some(&self.log(i)),
                || matches!(command(port, &["INFO", "replication"]), Some(Reply::Text(t)) if t.contains("master_link_status:up")),
            );
            // "Linked" is not yet streaming (see the Sentinel launcher): the
            // master sends a fresh replica its writes only after the
            // replica's first REPLCONF ACK, and a master killed before then
            // takes them with it (`redis_cluster::follows_a_failover_to_the_replica`
            // failed about one run in three: the promoted replica had
            // offset 0). A write to a key of the master's slots that WAIT
            // confirms shows the stream flows; WAIT alone, with no write
            // since the sync, answers 1 at once.
            let probe = self.key_on(i - self.masters);
            wait_until(
                "redis cluster replica streaming (a write WAIT confirms)",
                Duration::from_secs(30),
                Some(&self.log(i)),
                || {
                    let replies = pipeline(master, &[&["SET", &probe, "1"], &["WAIT", "1", "200"], &["DEL", &probe]]);
                    matches!(replies.as_deref(), Some([_, Reply::Text(n), _]) if n == "1")
                },
            );
        }
        wait_until("redis cluster nodes agree on the slots", Duration::from_secs(30), Some(&self.log(0)), || {
            self.agree()
        });
    }

    /// A key in the slots of master `m` (0..3), for the launcher's probes.
    fn key_on(&self, m: usize) -> String {
        let (first, last) = (SLOTS / 3 * m as u16, if m == 2 { SLOTS - 1 } else { SLOTS / 3 * (m as u16 + 1) - 1 });
        (0..)
            .map(|n| format!("holdfast-testkit:ready:{n}"))
            .find(|k| {
                text(command(self.nodes[m].0, &["CLUSTER", "KEYSLOT", k]))
                    .and_then(|t| t.parse::<u16>().ok())
                    .is_some_and(|slot| (first..=last).contains(&slot))
            })
            .unwrap_or_default()
    }

    /// True when every node maps every slot to the same port.
    fn agree(&self) -> bool {
        let maps: Vec<Option<Vec<(u16, u16, u16)>>> = self.ports().iter().map(|p| slot_ranges(*p)).collect();
        let Some(Some(first)) = maps.first() else { return false };
        let covered: u32 = first.iter().map(|(a, b, _)| u32::from(b - a) + 1).sum();
        covered == u32::from(SLOTS) && maps.iter().all(|m| m.as_ref() == Some(first))
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.ports().iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The client ports of the three first masters.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().take(self.masters).map(|(p, _, _)| *p).collect()
    }

    /// The client ports of the replicas, in the order of their masters.
    pub fn replica_ports(&self) -> Vec<u16> {
        self.nodes.iter().skip(self.masters).map(|(p, _, _)| *p).collect()
    }

    /// A node that answers, to ask about the cluster.
    fn live(&self) -> u16 {
        self.nodes
            .iter()
            .map(|(p, _, _)| *p)
            .find(|p| command(*p, &["PING"]) == Some(Reply::Text("PONG".into())))
            .unwrap_or_else(|| panic!("no cluster node answers"))
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|(p, _, _)| *p == port).expect("not a node's port");
        node.2.kill();
    }

    /// Waits until a node other than `old` owns `slot`, as every live node
    /// sees it, and takes writes there; returns its port and the time waited.
    pub fn wait_failover(&self, slot: u16, old: u16, timeout: Duration) -> (u16, Duration) {
        let started = std::time::Instant::now();
        let mut found = None;
        wait_until("redis cluster failover", timeout, Some(&self.log(self.masters)), || {
            let Some(owner) = self.owner_seen_by(self.live(), slot).filter(|p| *p != old) else { return false };
            let role = matches!(command(owner, &["ROLE"]), Some(Reply::Array(a)) if a.first() == Some(&Reply::Text("master".into())));
            let info = text(command(owner, &["CLUSTER", "INFO"])).unwrap_or_default();
            if role && info.contains("cluster_state:ok") {
                found = Some(owner);
            }
            found.is_some()
        });
        (found.unwrap_or(old), started.elapsed())
    }

    /// The temp dir holding every node's directory and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The node id of the master on `port`.
    pub fn node_id(&self, port: u16) -> String {
        text(command(port, &["CLUSTER", "MYID"])).unwrap_or_else(|| panic!("CLUSTER MYID on {port}"))
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        text(command(self.live(), &["CLUSTER", "KEYSLOT", key]))
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("CLUSTER KEYSLOT {key}"))
    }

    /// The port of the master that owns `slot`, as the node on `asked` sees it.
    pub fn owner_seen_by(&self, asked: u16, slot: u16) -> Option<u16> {
        slot_ranges(asked)?.into_iter().find(|(a, b, _)| (*a..=*b).contains(&slot)).map(|(_, _, p)| p)
    }

    /// The port of the master that owns `slot`, as the first node sees it.
    pub fn owner(&self, slot: u16) -> u16 {
        self.owner_seen_by(self.live(), slot).unwrap_or_else(|| panic!("no owner of slot {slot}"))
    }

    /// Step 1 of moving `slot` to the master on `to`: the target imports
    /// it and the owner migrates it (`CLUSTER SETSLOT ... IMPORTING` /
    /// `MIGRATING`). From here the owner answers `ASK` for keys of the
    /// slot it no longer has, and `TRYAGAIN` for a call naming some it has
    /// and some it has not.
    pub fn begin_migration(&self, slot: u16, to: u16) {
        let from = self.owner(slot);
        assert_ne!(from, to, "slot {slot} is on {to} already");
        let s = slot.to_string();
        ok(to, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &self.node_id(from)]);
        ok(from, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &self.node_id(to)]);
    }

    /// Step 2: moves every key of `slot` from its owner to the master on
    /// `to` (`CLUSTER GETKEYSINSLOT`, `MIGRATE`); returns how many.
    pub fn migrate_keys(&self, slot: u16, to: u16) -> usize {
        let from = self.owner(slot);
        let mut moved = 0;
        loop {
            let keys = match command(from, &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"]) {
                Some(Reply::Array(keys)) => keys,
                other => panic!("CLUSTER GETKEYSINSLOT on {from}: {other:?}"),
            };
            let keys: Vec<String> = keys.into_iter().filter_map(|k| text(Some(k))).collect();
            if keys.is_empty() {
                return moved;
            }
            let to_s = to.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_s, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let reply = command(from, &args);
            assert!(matches!(&reply, Some(Reply::Text(t)) if t == "OK" || t == "NOKEY"), "MIGRATE: {reply:?}");
            moved += keys.len();
        }
    }

    /// Step 3: every master is told that `to` owns `slot` (`CLUSTER SETSLOT
    /// ... NODE`, the target first); returns once all of them agree.
    pub fn finish_migration(&self, slot: u16, to: u16) {
        let from = self.owner(slot);
        let id = self.node_id(to);
        let s = slot.to_string();
        ok(to, &["CLUSTER", "SETSLOT", &s, "NODE", &id]);
        ok(from, &["CLUSTER", "SETSLOT", &s, "NODE", &id]);
        for port in self.ports().into_iter().filter(|p| *p != from && *p != to) {
            ok(port, &["CLUSTER", "SETSLOT", &s, "NODE", &id]);
        }
        wait_until("redis cluster nodes agree after a migration", Duration::from_secs(30), Some(&self.log(0)), || {
            self.ports().iter().all(|p| self.owner_seen_by(*p, slot) == Some(to))
        });
    }

    /// Moves `slot` to the master on `to`, all three steps.
    pub fn migrate_slot(&self, slot: u16, to: u16) -> usize {
        self.begin_migration(slot, to);
        let moved = self.migrate_keys(slot, to);
        self.finish_migration(slot, to);
        moved
    }

    /// The number of keys the master on `port` holds (`DBSIZE`).
    pub fn dbsize(&self, port: u16) -> u64 {
        text(command(port, &["DBSIZE"])).and_then(|t| t.parse().ok()).unwrap_or_else(|| panic!("DBSIZE on {port}"))
    }

    /// How many times the master on `port` ran `command_name` (lower case,
    /// e.g. `evalsha`) since the last [`reset_stats`](Self::reset_stats),
    /// from `INFO commandstats`.
    pub fn calls(&self, port: u16, command_name: &str) -> u64 {
        let info = text(command(port, &["INFO", "commandstats"])).unwrap_or_default();
        let prefix = format!("cmdstat_{command_name}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// `CONFIG RESETSTAT` on every master.
    pub fn reset_stats(&self) {
        for port in self.ports() {
            ok(port, &["CONFIG", "RESETSTAT"]);
        }
    }
}

/// `CLUSTER SLOTS` of the node on `port`: (first, last, master port) per range, sorted.
fn slot_ranges(port: u16) -> Option<Vec<(u16, u16, u16)>> {
    let Some(Reply::Array(ranges)) = command(port, &["CLUSTER", "SLOTS"]) else { return None };
    let mut out = Vec::new();
    for range in ranges {
        let Reply::Array(r) = range else { return None };
        let num = |v: Option<&Reply>| match v {
            Some(Reply::Text(t)) => t.parse::<u16>().ok(),
            _ => None,
        };
        let master = match r.get(2) {
            Some(Reply::Array(m)) => num(m.get(1))?,
            _ => return None,
        };
        out.push((num(r.first())?, num(r.get(1))?, master));
    }
    out.sort_unstable();
    Some(out)
}
