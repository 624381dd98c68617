//! etcd 3.4 on loopback: a single node, or a three-member cluster whose
//! members can be killed (leader first) for failover tests.
//!
//! Every member runs with `--heartbeat-interval 100 --election-timeout 1000`
//! (etcd's defaults), so the server's minimum lease TTL is 2 s.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::{ServerProcess, free_port, require_binary, wait_until};

/// One etcd member process.
#[derive(Debug)]
pub struct EtcdMember {
    /// The member's name (`e1`..).
    pub name: String,
    /// The client port on 127.0.0.1.
    pub client_port: u16,
    /// The peer port on 127.0.0.1.
    pub peer_port: u16,
    log: PathBuf,
    process: ServerProcess,
}

impl EtcdMember {
    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// `/health` says true (the member has a leader and no alarm).
    pub fn healthy(&self) -> bool {
        http(self.client_port, "GET", "/health", "").is_some_and(|b| b.contains("\"health\":\"true\""))
    }

    /// The sum of a Prometheus counter from `/metrics` over every line whose
    /// name and labels contain all of `parts` (e.g. `grpc_server_msg_received_total`,
    /// `grpc_method="LeaseKeepAlive"`).
    pub fn metric(&self, parts: &[&str]) -> f64 {
        let body = http(self.client_port, "GET", "/metrics", "").unwrap_or_default();
        body.lines()
            .filter(|l| !l.starts_with('#') && parts.iter().all(|p| l.contains(p)))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    }

    /// Stops the member's process (SIGSTOP): its connections stay open but
    /// nothing is answered, as with a hung server or a silent network.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Lets a paused member run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.process.pid().to_string();
        let status = Command::new("kill").args(["-s", signal, &pid]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -s {signal} {pid} failed");
    }

    /// `(member id, leader id)` from the member's status, as decimal strings.
    pub fn status(&self) -> Option<(String, String)> {
        let body = http(self.client_port, "POST", "/v3/maintenance/status", "{}")?;
        Some((json_str(&body, "member_id")?, json_str(&body, "leader")?))
    }
}

/// A plain HTTP/1.0 request to 127.0.0.1:`port`; the response body.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}

/// The string value of `"field":"..."` in a flat JSON text (ids are quoted in etcd's gateway JSON).
fn json_str(body: &str, field: &str) -> Option<String> {
    let at = body.find(&format!("\"{field}\":"))? + field.len() + 3;
    let rest = body[at..].trim_start().strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_owned())
}

fn spawn_member(dir: &std::path::Path, name: &str, cp: u16, pp: u16, initial_cluster: &str) -> EtcdMember {
    let etcd = require_binary("etcd", &[], "etcd-server");
    let data = dir.join(format!("{name}.data"));
    let log = dir.join(format!("{name}.log"));
    let mut cmd = Command::new(etcd);
    cmd.arg("--name")
        .arg(name)
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen-client-urls", &format!("http://127.0.0.1:{cp}")])
        .args(["--advertise-client-urls", &format!("http://127.0.0.1:{cp}")])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{pp}")])
        .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{pp}")])
        .args(["--initial-cluster", initial_cluster])
        .args(["--initial-cluster-state", "new"])
        .args(["--initial-cluster-token", &format!("holdfast-{}", dir.display())])
        .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
        .args(["--logger", "zap", "--log-outputs", "stderr"]);
    let process = ServerProcess::spawn(cmd, &log);
    EtcdMember { name: name.to_owned(), client_port: cp, peer_port: pp, log, process }
}

/// An etcd cluster of one or more members on loopback, killed on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    /// The members, in start order.
    pub members: Vec<EtcdMember>,
    dir: tempfile::TempDir,
}

/// A single-node etcd (a cluster of one).
pub type EtcdServer = EtcdCluster;

impl EtcdCluster {
    /// Starts a single node and waits until it serves.
    pub fn start() -> Self {
        Self::start_members(1)
    }

    /// Starts `n` members and waits until every one is healthy.
    pub fn start_members(n: usize) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> =
            ports.iter().enumerate().map(|(i, (_, pp))| format!("e{}=http://127.0.0.1:{pp}", i + 1)).collect();
        let initial = initial.join(",");
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, (cp, pp))| spawn_member(dir.path(), &format!("e{}", i + 1), *cp, *pp, &initial))
            .collect();
        let mut cluster = EtcdCluster { members, dir };
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// The `etcd://` URL naming every member (dead ones included, as a user's would).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.members.iter().map(|m| format!("127.0.0.1:{}", m.client_port)).collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// Waits until every running member is healthy and they agree on a leader.
    pub fn wait_healthy(&mut self, timeout: Duration) {
        let log = self.members.first().map(|m| m.log.clone());
        let dir = self.dir.path().to_owned();
        wait_until(&format!("etcd cluster in {}", dir.display()), timeout, log.as_deref(), || {
            let mut leaders = Vec::new();
            for m in &mut self.members {
                if !m.is_running() {
                    continue;
                }
                if !m.healthy() {
                    return false;
                }
                match m.status() {
                    Some((_, leader)) if leader != "0" => leaders.push(leader),
                    _ => return false,
                }
            }
            !leaders.is_empty() && leaders.iter().all(|l| *l == leaders[0])
        });
    }

    /// The index of the current leader among the running members, if one is known.
    pub fn leader(&mut self) -> Option<usize> {
        for i in 0..self.members.len() {
            if !self.members[i].is_running() {
                continue;
            }
            if self.members[i].status().is_some_and(|(me, leader)| me == leader) {
                return Some(i);
            }
        }
        None
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        self.members[i].process.kill();
    }

    /// SIGKILLs member `i` and starts it again on its data and ports (a
    /// crash and restart), then waits until the cluster is healthy. For
    /// clusters made by [`start_members`](Self::start_members).
    pub fn restart(&mut self, i: usize) {
        self.members[i].process.kill();
        let initial: Vec<String> =
            self.members.iter().map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port)).collect();
        let m = &self.members[i];
        let (name, cp, pp) = (m.name.clone(), m.client_port, m.peer_port);
        self.members[i] = spawn_member(self.dir.path(), &name, cp, pp, &initial.join(","));
        self.wait_healthy(Duration::from_secs(30));
    }

    /// The temp dir holding every member's data and log.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// A single etcd node serving clients over TLS (a test CA made with
/// `openssl`), with authentication enabled and a `root` user.
#[derive(Debug)]
pub struct EtcdTlsServer {
    /// The node.
    pub cluster: EtcdCluster,
    /// The PEM file of the CA that signed the server's certificate.
    pub ca_file: PathBuf,
    /// The root user's password.
    pub root_password: String,
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

impl EtcdTlsServer {
    /// Makes a CA and a server certificate for 127.0.0.1, starts etcd with
    /// them, adds user `root` and enables authentication.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// As [`start`](Self::start), and etcd demands a client certificate from
    /// the CA (`--client-cert-auth`), whose common name is the user when no
    /// password is given. Client certificates in [`dir`](Self::dir):
    /// `root`; `locker`, a user without a password whose role `locks` may
    /// read and write under `holdfast/` only; `nobody`, a user without roles.
    pub fn start_with_client_certs() -> Self {
        Self::start_with(true)
    }

    /// The directory of the CA and the certificates.
    pub fn dir(&self) -> &std::path::Path {
        self.cluster.dir.path()
    }

    fn start_with(client_certs: bool) -> Self {
        let etcdctl = require_binary("etcdctl", &[], "etcd-client");
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let p = |name: &str| dir.path().join(name);
        super::tls::make_server_certificate(dir.path());

        let etcd = require_binary("etcd", &[], "etcd-server");
        let (cp, pp) = (free_port(), free_port());
        let log = p("e1.log");
        let mut cmd = Command::new(etcd);
        cmd.args(["--name", "e1", "--data-dir"])
            .arg(p("e1.data"))
            .args(["--listen-client-urls", &format!("https://127.0.0.1:{cp}")])
            .args(["--advertise-client-urls", &format!("https://127.0.0.1:{cp}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{pp}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{pp}")])
            .args(["--initial-cluster", &format!("e1=http://127.0.0.1:{pp}")])
            .args(["--cert-file"])
            .arg(p("server.pem"))
            .args(["--key-file"])
            .arg(p("server.key"))
            .args(["--logger", "zap", "--log-outputs", "stderr"]);
        if client_certs {
            for name in ["root", "locker", "nobody"] {
                super::tls::make_client_certificate(dir.path(), name);
            }
            cmd.args(["--client-cert-auth", "--trusted-ca-file"]).arg(p("ca.pem"));
        }
        let process = ServerProcess::spawn(cmd, &log);
        let member = EtcdMember { name: "e1".into(), client_port: cp, peer_port: pp, log: log.clone(), process };
        let ctl = |args: &[&str]| {
            let mut c = Command::new(&etcdctl);
            c.arg(format!("--endpoints=https://127.0.0.1:{cp}")).arg(format!("--cacert={}", p("ca.pem").display()));
            if client_certs {
                c.arg(format!("--cert={}", p("root.pem").display())).arg(format!("--key={}", p("root.key").display()));
            }
            c.args(args);
            c
        };
        wait_until("etcd over TLS", Duration::from_secs(30), Some(&log), || {
            ctl(&["endpoint", "health"]).output().is_ok_and(|o| o.status.success())
        });
        let root_password = "s3cret-root:pw@x".to_owned();
        run(&mut ctl(&["user", "add", &format!("root:{root_password}"), "--interactive=false"]));
        if client_certs {
            run(&mut ctl(&["role", "add", "locks"]));
            run(&mut ctl(&["role", "grant-permission", "locks", "readwrite", "holdfast/", "--prefix=true"]));
            for user in ["locker", "nobody"] {
                run(&mut ctl(&["user", "add", user, "--no-password"]));
            }
            run(&mut ctl(&["user", "grant-role", "locker", "locks"]));
        }
        run(&mut ctl(&["auth", "enable"]));
        let ca_file = p("ca.pem");
        EtcdTlsServer { cluster: EtcdCluster { members: vec![member], dir }, ca_file, root_password }
    }

    /// `etcds://root:<password %-encoded>@127.0.0.1:port?ca_file=...`.
    pub fn url(&self) -> String {
        let pw: String = self
            .root_password
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        format!(
            "etcds://root:{pw}@127.0.0.1:{}?ca_file={}",
            self.cluster.members[0].client_port,
            self.ca_file.display()
        )
    }
}
