//! Real store servers on loopback ports in temp dirs, killed on drop.
//!
//! Every launcher follows the same rules: a free port from [`free_port`]
//! (below the ephemeral range, never twice in a process); data in a fresh
//! temp dir removed on drop; the server process killed on drop; a missing
//! binary is a test failure naming the command that installs it (never a
//! silent skip).

pub mod mysql;
pub mod postgres;
pub mod redis;
pub mod tls;
pub mod zookeeper;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use holdfast::stores::Store;

pub mod etcd;

/// The Debian packages that bring `store`'s server and the tools the
/// tests drive it with, as the launchers here start them: one arm per store
/// without a wildcard, so a store added to the library's registry fails to
/// compile here until its server is named. `.ci/run` installs every one
/// (the `stores` test `registry::ci_installs_every_store_server` checks).
pub fn packages(store: Store) -> &'static [&'static str] {
    match store {
        // Embedded: the library is the store.
        Store::Sqlite => &[],
        Store::Redis | Store::RedLock => &["redis-server", "redis-tools"],
        Store::Etcd => &["etcd-server", "etcd-client"],
        Store::ZooKeeper => &["zookeeper"],
        Store::Postgres => &["postgresql-15", "pgbouncer", "util-linux"],
        Store::Mysql => &["mariadb-server", "mariadb-client"],
    }
}

/// What the build and the tests need beside the servers: `protoc` for the
/// etcd client's build, `openssl` to make the TLS tests' certificates,
/// `chromium` to render `verify`'s HTML report in the CLI's tests.
pub const TOOLS: &[&str] = &["protobuf-compiler", "openssl", "chromium"];

/// The command that installs every server the tests start, and the tools.
pub fn apt_install() -> String {
    let mut all: Vec<&str> = Vec::new();
    for package in Store::ALL.into_iter().flat_map(packages).chain(TOOLS) {
        if !all.contains(package) {
            all.push(package);
        }
    }
    format!("apt-get install -y {}", all.join(" "))
}

/// A TCP port on 127.0.0.1 that refuses connections for the rest of the
/// process: a socket is bound to it, never listens and is kept open, so no
/// server can take the port. For an unreachable store's URL: a port from
/// [`free_port`] is let go, and a server another test starts later may take
/// it (then the "unreachable" store answers, as it once did in the etcd
/// conformance suite).
pub fn closed_port() -> u16 {
    static HELD: std::sync::Mutex<Vec<tokio::net::TcpSocket>> = std::sync::Mutex::new(Vec::new());
    let socket = tokio::net::TcpSocket::new_v4()
        .and_then(|s| s.bind(([127, 0, 0, 1], 0).into()).map(|()| s))
        .unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"));
    let port = socket.local_addr().map(|a| a.port()).unwrap_or_else(|e| panic!("cannot read a bound port: {e}"));
    HELD.lock().unwrap_or_else(|p| p.into_inner()).push(socket);
    port
}

/// A free TCP port on 127.0.0.1 for a server to listen on, never the same
/// twice in one process, and below the kernel's ephemeral range.
///
/// Why not a port from binding `127.0.0.1:0`: that port comes from the
/// ephemeral range, and between letting it go and the server binding it any
/// outgoing connection of the busy test process could take it as its local
/// port (CI once saw PostgreSQL fail "could not create any TCP/IP sockets"
/// that way), and a later bind to port 0 could hand it out again. Ports
/// below `ip_local_port_range` are never picked for outgoing connections;
/// a per-process counter (started at a point drawn from the process id, so
/// processes that start servers side by side start apart) walks them, and a
/// port something already listens on is skipped.
///
/// Across processes a port is also [`reserved`](reserve) for the life of
/// the process that took it: a listening probe alone let another process
/// (`holdfast verify --spawn` under the CLI's tests) hand out the port of
/// an etcd member it had killed to restart, and the two servers met on it
/// (CI: "redis-server ... bind: Address already in use").
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let Some((low, high)) = listen_range() else {
        return ephemeral_port();
    };
    let span = u32::from(high - low);
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    let _ = NEXT.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = low + u16::try_from(offset).unwrap_or(0);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && reserve(port) {
            return port;
        }
    }
    panic!("no free loopback port in {low}..{high}")
}

/// Takes `port` for this process until it exits, across every process on
/// the machine that calls it: a Unix socket bound in Linux's abstract
/// namespace under a name of the port (no file to leave behind; the kernel
/// frees the name when the process dies, however it dies). False if
/// another process holds it. Elsewhere than Linux, always true.
pub fn reserve(port: u16) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixListener};
        static HELD: std::sync::Mutex<Vec<UnixListener>> = std::sync::Mutex::new(Vec::new());
        let Ok(name) = SocketAddr::from_abstract_name(reservation_name(port)) else { return true };
        match UnixListener::bind_addr(&name) {
            Ok(listener) => HELD.lock().unwrap_or_else(|p| p.into_inner()).push(listener),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => return false,
            // No Unix sockets here: the listening probe alone decides.
            Err(_) => {}
        }
    }
    true
}

/// The abstract socket name under which [`reserve`] holds `port`.
fn reservation_name(port: u16) -> String {
    format!("holdfast-test-server-port-{port}")
}

/// The ports [`free_port`] hands out: from 10000 up to the kernel's
/// ephemeral range, or `None` when that range leaves fewer than 1000 ports
/// below it (then a port from binding port 0 it is).
pub fn listen_range() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let ephemeral_low: u16 = text.split_whitespace().next()?.parse().ok()?;
    (ephemeral_low >= 11_000).then_some((10_000, ephemeral_low))
}

fn ephemeral_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"))
}

/// The path of `binary`, searching `PATH` and `extra_dirs`; panics with the
/// install command when it is missing, so the test fails loudly.
pub fn require_binary(binary: &str, extra_dirs: &[&str], package: &str) -> PathBuf {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path_var).chain(extra_dirs.iter().map(PathBuf::from));
    for dir in dirs {
        let candidate = dir.join(binary);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "`{binary}` is not installed; install it with: apt-get install -y {package}   (all servers: {})",
        apt_install()
    );
}

/// Polls `ready` every 25 ms until it returns true or `timeout` passes;
/// panics with `what` and the log tail on timeout.
pub fn wait_until(what: &str, timeout: Duration, log: Option<&Path>, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ready() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let tail = log.map(log_tail).unwrap_or_default();
    panic!("{what} not ready after {timeout:?}; log tail:\n{tail}");
}

/// The last 30 lines of a server's log (empty if it cannot be read).
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// True if something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

/// A server child process, SIGKILLed and reaped on drop.
#[derive(Debug)]
pub struct ServerProcess {
    child: Option<Child>,
}

impl ServerProcess {
    /// Spawns `cmd` with stdin closed and output to `log`.
    pub fn spawn(mut cmd: Command, log: &Path) -> Self {
        let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let err = out.try_clone().unwrap_or_else(|e| panic!("cannot dup log handle: {e}"));
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        ServerProcess { child: Some(child) }
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGKILL and reap now (a crash, for fault tests).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `signal` (e.g. `libc`-free: "TERM", "INT") with `kill -s` and waits for exit.
    pub fn stop_with(&mut self, signal: &str) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-s").arg(signal).arg(c.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A closed port refuses connections, and no listener (a server another
    /// test starts) can take it while this process lives.
    #[test]
    fn a_closed_port_refuses_and_cannot_be_taken() {
        let port = closed_port();
        let refused = std::net::TcpStream::connect(("127.0.0.1", port)).expect_err("nothing listens there");
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "{refused}");
        assert!(TcpListener::bind(("127.0.0.1", port)).is_err(), "a listener took the closed port {port}");
        assert!(!port_open(port));
    }

    /// Servers' ports are never handed out twice in a process and lie
    /// below the ephemeral range, where no outgoing connection takes them
    /// (from binding port 0, 3,000 calls repeat ports about 150 times).
    #[test]
    fn server_ports_are_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..3_000).map(|_| free_port()).collect();
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
        let (low, high) = listen_range().expect("this test needs an ephemeral range starting above 11000");
        assert!(ports.iter().all(|p| (low..high).contains(p)), "a port outside {low}..{high}");
    }

    /// A port another process reserved (its server down for a restart,
    /// so nothing listens on it) is never handed out here.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_port_reserved_by_another_process_is_skipped() {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixListener};
        let taken = free_port();
        let name = SocketAddr::from_abstract_name(reservation_name(taken)).expect("a name");
        assert!(UnixListener::bind_addr(&name).is_err(), "port {taken} handed out but not reserved");
        // Stand in for another process: hold the names of the next ports.
        let (low, high) = listen_range().expect("this test needs an ephemeral range starting above 11000");
        let ahead: Vec<u16> = (1..=200).map(|i| low + (taken - low + i) % (high - low)).collect();
        let held: Vec<(u16, UnixListener)> = ahead
            .iter()
            .filter_map(|p| {
                Some((*p, UnixListener::bind_addr(&SocketAddr::from_abstract_name(reservation_name(*p)).ok()?).ok()?))
            })
            .collect();
        let (other, _) = held.first().expect("one of the next 200 names free to hold");
        assert!(!reserve(*other), "reserve took port {other}, held elsewhere");
        let got: Vec<u16> = (0..3).map(|_| free_port()).collect();
        assert!(got.iter().all(|p| !ahead.contains(p)), "free_port handed out a port held elsewhere: {got:?}");
    }

    /// A port something already listens on is skipped.
    #[test]
    fn a_listening_port_is_skipped() {
        let held =
            (free_port() + 1..).find_map(|p| TcpListener::bind(("127.0.0.1", p)).ok()).expect("a port to listen on");
        let next = held.local_addr().expect("the listener's port").port();
        let got: Vec<u16> = (0..3).map(|_| free_port()).collect();
        assert!(!got.contains(&next), "free_port handed out {next}, which is listened on");
        drop(held);
    }
}
