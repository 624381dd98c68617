//! ZooKeeper 3.5+ on loopback: one standalone server or an ensemble, each
//! member a JVM started directly (not zkServer.sh), in a temp dir, killed on drop.

mod txnlog;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{ServerProcess, free_port, require_binary, wait_until};

/// The server's tickTime in the tests: sessions may last 2 ticks (0.4 s) to [`MAX_SESSION_TIMEOUT_MS`].
pub const TICK_MS: u64 = 200;

/// The longest session timeout the servers grant.
pub const MAX_SESSION_TIMEOUT_MS: u64 = 60_000;

/// The session timeout the conformance tests ask for.
pub const SESSION_TIMEOUT_MS: u64 = 4_000;

// netty-codec: the Netty connection factory (TLS) needs it, and Debian's
// zookeeper.jar does not name it in its class path.
const JARS: [&str; 3] =
    ["/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar", "/usr/share/java/netty-codec.jar"];

/// One ensemble member.
#[derive(Debug)]
struct Member {
    id: usize,
    client_port: u16,
    config: PathBuf,
    log: PathBuf,
    process: Option<ServerProcess>,
    /// Replay a transaction log without a snapshot (a seeded server).
    trust_empty_snapshot: bool,
    /// Extra JVM flags (the JAAS file of a secured server).
    jvm_flags: Vec<String>,
}

/// A secured server's settings: SASL `DIGEST-MD5` users (enforced: a session
/// that did not authenticate can do nothing) and a TLS port.
#[derive(Debug)]
struct Secured {
    /// `(user, password)` of the one SASL user.
    user: (String, String),
    /// The TLS client port.
    secure_port: u16,
}

/// A running standalone ZooKeeper or ensemble.
#[derive(Debug)]
pub struct ZkServer {
    members: Vec<Member>,
    java: PathBuf,
    secured: Option<Secured>,
    _dir: tempfile::TempDir,
}

/// A four-letter word's answer from 127.0.0.1:`port` (whitelisted: `srvr`,
/// `ruok`, `stat`, `mntr`, `wchp`, `cons`), if any.
pub fn four_letter(port: u16, word: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(1000))).ok()?;
    s.write_all(word.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The `srvr` four-letter word's answer from 127.0.0.1:`port`, if any.
pub fn srvr(port: u16) -> Option<String> {
    four_letter(port, "srvr")
}

/// The requests a server has received since it started (`srvr`'s
/// `Received:`), if it answers.
pub fn requests_received(port: u16) -> Option<u64> {
    srvr(port)?.lines().find_map(|l| l.strip_prefix("Received: ")?.trim().parse().ok())
}

/// The watched paths of a server and how many sessions watch each (`wchp`).
pub fn watches_by_path(port: u16) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for line in four_letter(port, "wchp").unwrap_or_default().lines() {
        if line.starts_with('/') {
            out.push((line.trim().to_owned(), 0));
        } else if let Some(last) = out.last_mut().filter(|_| !line.trim().is_empty()) {
            last.1 += 1;
        }
    }
    out
}

/// The `Mode:` line of `srvr` (`standalone`, `leader`, `follower`), if serving.
pub fn mode(port: u16) -> Option<String> {
    srvr(port)?.lines().find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_owned()))
}

impl ZkServer {
    /// A standalone server.
    pub fn start() -> Self {
        Self::start_members(1, None, None)
    }

    /// A standalone server that demands SASL `DIGEST-MD5` authentication as
    /// `user` / `password` (`enforce.auth.enabled`) and also serves TLS on a
    /// second port, with a certificate for 127.0.0.1 from a throwaway CA
    /// (`ca.pem` in [`tls_dir`](Self::tls_dir)). The plain port stays open
    /// for the four-letter words.
    pub fn start_secured(user: &str, password: &str) -> Self {
        let secured = Secured { user: (user.to_owned(), password.to_owned()), secure_port: free_port() };
        Self::start_members(1, None, Some(secured))
    }

    /// The directory with the CA (`ca.pem`) of a secured server's certificate.
    pub fn tls_dir(&self) -> PathBuf {
        self._dir.path().join("tls")
    }

    /// A secured server's `zk://` URL for the SASL user (`auth=sasl`, plain
    /// port); panics on a server that is not secured.
    pub fn secured_url(&self) -> String {
        let s = self.secured.as_ref().expect("a secured server (start_secured)");
        let enc = |t: &str| -> String {
            t.bytes()
                .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
                .collect()
        };
        format!("zk://{}:{}@127.0.0.1:{}?auth=sasl", enc(&s.user.0), enc(&s.user.1), self.members[0].client_port)
    }

    /// A secured server's TLS port.
    pub fn secure_port(&self) -> u16 {
        self.secured.as_ref().expect("a secured server (start_secured)").secure_port
    }

    /// An ensemble of `n` members (3 for failover tests), every member serving.
    pub fn start_ensemble(n: usize) -> Self {
        Self::start_members(n, None, None)
    }

    /// A standalone server on which the node `path` (created persistent, with
    /// its ancestors, open to anyone) starts empty with child version
    /// `cversion` (positive): its next sequential children are numbered
    /// `cversion`, `cversion + 1`, ..., past `2147483647` on to
    /// `-2147483648`, as on a server that has created that many children
    /// under it. See `txnlog.rs` for how.
    pub fn start_with_child_version(path: &str, cversion: i32) -> Self {
        Self::start_members(1, Some((path, cversion)), None)
    }

    fn start_members(n: usize, seed: Option<(&str, i32)>, secured: Option<Secured>) -> Self {
        let java = require_binary("java", &[], "zookeeper");
        for jar in JARS {
            if !Path::new(jar).is_file() {
                panic!("{jar} is missing; install it with: apt-get install -y zookeeper");
            }
        }
        let dir = tempfile::Builder::new().prefix("holdfast-zk").tempdir().expect("tempdir");
        let ports: Vec<(u16, u16, u16)> = (0..n).map(|_| (free_port(), free_port(), free_port())).collect();
        let mut members = Vec::new();
        for (i, (client, quorum, election)) in ports.iter().enumerate() {
            let id = i + 1;
            let data = dir.path().join(format!("zk{id}"));
            std::fs::create_dir_all(&data).expect("data dir");
            std::fs::write(data.join("myid"), format!("{id}\n")).expect("myid");
            let mut cfg = format!(
                "tickTime={TICK_MS}\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={client}\n\
                 clientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=srvr,ruok,stat,mntr,wchp,cons\n\
                 maxSessionTimeout={MAX_SESSION_TIMEOUT_MS}\n\
                 maxClientCnxns=0\n",
                data.display()
            );
            if n > 1 {
                let _ = (quorum, election);
                for (j, (_, q, e)) in ports.iter().enumerate() {
                    cfg.push_str(&format!("server.{}=127.0.0.1:{q}:{e}\n", j + 1));
                }
            }
            let mut jvm_flags = Vec::new();
            if let Some(sec) = &secured {
                jvm_flags = secure(dir.path(), &mut cfg, sec);
            }
            let config = data.join("zoo.cfg");
            std::fs::write(&config, cfg).expect("zoo.cfg");
            let log = data.join("zk.log");
            if let Some((path, cversion)) = seed {
                txnlog::write_child_version_log(&data, path, cversion).expect("seed transaction log");
            }
            let trust_empty_snapshot = seed.is_some();
            members.push(Member {
                id,
                client_port: *client,
                config,
                log,
                process: None,
                trust_empty_snapshot,
                jvm_flags,
            });
        }
        let mut server = ZkServer { members, java, secured, _dir: dir };
        for i in 0..n {
            server.spawn(i);
        }
        for i in 0..n {
            server.wait_serving(i, Duration::from_secs(60));
        }
        server
    }

    fn spawn(&mut self, i: usize) {
        let m = &mut self.members[i];
        let mut cmd = Command::new(&self.java);
        if m.trust_empty_snapshot {
            cmd.arg("-Dzookeeper.snapshot.trust.empty=true");
        }
        cmd.args(&m.jvm_flags);
        cmd.args([
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.admin.enableServer=false",
            // Empty lock parents (containers) are removed within a second.
            "-Dznode.container.checkIntervalMs=500",
            "-cp",
            &JARS.join(":"),
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
        ])
        .arg(&m.config);
        m.process = Some(ServerProcess::spawn(cmd, &m.log));
    }

    /// Waits until member `i` answers `srvr` with a `Mode:` line.
    pub fn wait_serving(&self, i: usize, timeout: Duration) {
        let m = &self.members[i];
        wait_until(&format!("zookeeper member {}", m.id), timeout, Some(&m.log), || mode(m.client_port).is_some());
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are no members (never: a server has at least one).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The client port of member `i`.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// `zk://` URL of every member.
    pub fn url(&self) -> String {
        self.url_of(&(0..self.members.len()).collect::<Vec<_>>())
    }

    /// `zk://` URL of the given members only.
    pub fn url_of(&self, members: &[usize]) -> String {
        let hosts: Vec<String> =
            members.iter().map(|&i| format!("127.0.0.1:{}", self.members[i].client_port)).collect();
        format!("zk://{}", hosts.join(","))
    }

    /// The index of the leader (or the standalone server), by `srvr`.
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(|m| {
            m.process.is_some() && matches!(mode(m.client_port).as_deref(), Some("leader" | "standalone"))
        })
    }

    /// SIGKILLs member `i` (a crash).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].process.take() {
            p.kill();
        }
    }

    /// Sends SIGSTOP (`pause = true`) or SIGCONT to member `i`: a hung server.
    pub fn pause(&self, i: usize, pause: bool) {
        if let Some(p) = &self.members[i].process {
            let sig = if pause { "STOP" } else { "CONT" };
            let _ = Command::new("kill").arg("-s").arg(sig).arg(p.pid().to_string()).status();
        }
    }

    /// The member whose connection carries ZooKeeper session `session_id`
    /// (by the `cons` four-letter word), if any.
    pub fn member_serving(&self, session_id: i64) -> Option<usize> {
        let sid = format!("sid=0x{session_id:x},");
        self.members
            .iter()
            .position(|m| m.process.is_some() && four_letter(m.client_port, "cons").is_some_and(|c| c.contains(&sid)))
    }

    /// The log of member `i`.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.members[i].log).unwrap_or_default()
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(p) = &m.process {
                // A paused JVM must be continued to die promptly on some kernels; SIGKILL works anyway.
                let _ = Command::new("kill").arg("-s").arg("CONT").arg(p.pid().to_string()).status();
            }
            m.process.take();
        }
    }
}

/// Adds SASL (a JAAS file with the one user, enforced) and a TLS port (Netty,
/// PEM key store and trust store) to a member's `cfg`; returns the JVM flags
/// that name the JAAS file.
fn secure(dir: &Path, cfg: &mut String, sec: &Secured) -> Vec<String> {
    let tls = dir.join("tls");
    super::tls::make_server_certificate(&tls);
    // Java's PEM key store: the private key, then the certificate.
    let key = std::fs::read_to_string(tls.join("server.key")).expect("server.key");
    let cert = std::fs::read_to_string(tls.join("server.pem")).expect("server.pem");
    std::fs::write(tls.join("keystore.pem"), format!("{key}{cert}")).expect("keystore.pem");
    let jaas = dir.join("jaas.conf");
    let (user, password) = (&sec.user.0, sec.user.1.replace('\\', "\\\\").replace('"', "\\\""));
    std::fs::write(
        &jaas,
        format!("Server {{\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n  user_{user}=\"{password}\";\n}};\n"),
    )
    .expect("jaas.conf");
    cfg.push_str(&format!(
        "authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider\n\
         enforce.auth.enabled=true\nenforce.auth.schemes=sasl\n\
         serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
         secureClientPort={}\nsecureClientPortAddress=127.0.0.1\n\
         ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
         ssl.trustStore.location={}\nssl.trustStore.type=PEM\nssl.clientAuth=none\n",
        sec.secure_port,
        tls.join("keystore.pem").display(),
        tls.join("ca.pem").display(),
    ));
    vec![format!("-Djava.security.auth.login.config={}", jaas.display())]
}
