//! A PostgreSQL 15 server on a loopback port in a temp dir.
//!
//! PostgreSQL refuses to run as root, so when the tests run as root the
//! server runs as the `postgres` user through `setpriv` (which execs in
//! place, so the child is the postmaster itself). The cluster is made with
//! `initdb` once per machine (and user and PostgreSQL build) into a template
//! dir kept in /tmp and copied for every server (`cp -a`), which is much
//! faster than one `initdb` per server.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::{ServerProcess, free_port, log_tail, port_open, require_binary, wait_until};

const PG_BIN_DIRS: &[&str] =
    &["/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin"];
const PACKAGE: &str = "postgresql-15";

fn bin(name: &str) -> PathBuf {
    require_binary(name, PG_BIN_DIRS, PACKAGE)
}

fn running_as_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

/// A command that runs as the `postgres` user when we are root.
fn as_postgres(program: &Path) -> Command {
    if running_as_root() {
        let setpriv = require_binary("setpriv", &["/usr/bin", "/bin"], "util-linux");
        let mut c = Command::new(setpriv);
        c.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// A temp dir the postgres user can use: created under /tmp, chowned to
/// `postgres` when we are root.
fn pg_tempdir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir_in("/tmp").unwrap_or_else(|e| panic!("tempdir: {e}"));
    if running_as_root() {
        let ok = Command::new("chown").arg("postgres:postgres").arg(dir.path()).status().is_ok_and(|s| s.success());
        assert!(ok, "cannot chown {} to postgres (is the postgres user there? {PACKAGE})", dir.path().display());
    }
    dir
}

/// What the template cluster is made with (part of its name, so that a
/// change here makes a new one).
const INITDB_ARGS: &[&str] = &["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"];

/// The initdb'd template cluster every server is copied from: one per user,
/// `initdb` build and [`INITDB_ARGS`] on the machine, kept in /tmp for the
/// next process. (One per process, in a temp dir a static never drops, left
/// 39 MB in /tmp for every test binary and every `verify --spawn postgres`:
/// 312 MB a CI run.)
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(shared_template).as_path()
}

fn shared_template() -> PathBuf {
    let initdb = bin("initdb");
    let mut made_by = Command::new(&initdb).arg("--version").output().map(|o| o.stdout).unwrap_or_default();
    made_by.extend_from_slice(initdb.as_os_str().as_encoded_bytes());
    made_by.extend_from_slice(INITDB_ARGS.join(" ").as_bytes());
    let uid = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let dir = PathBuf::from(format!(
        "/tmp/holdfast-pg-template-{}-{:08x}",
        uid.unwrap_or_default(),
        adler2::adler32_slice(&made_by)
    ));
    // The marker is written last: a dir with it holds a whole cluster.
    let whole = |d: &Path| d.join("complete").is_file() && d.join("data/global/pg_control").is_file();
    if whole(&dir) {
        return dir;
    }
    let staging = pg_tempdir("holdfast-pg-template-new-");
    let out = as_postgres(&initdb)
        .arg("-D")
        .arg(staging.path().join("data"))
        .args(INITDB_ARGS)
        .output()
        .unwrap_or_else(|e| panic!("cannot run initdb: {e}"));
    assert!(
        out.status.success(),
        "initdb failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(staging.path().join("complete"), b"")
        .unwrap_or_else(|e| panic!("cannot mark the template in {}: {e}", staging.path().display()));
    // Renamed into place whole, so a process that finds the name finds all
    // of it; if another process was first, its template is as good.
    let staging = staging.keep();
    if std::fs::rename(&staging, &dir).is_err() {
        if !whole(&dir) {
            // Something else under the name (a leftover of another kind): replaced.
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&staging, &dir)
                .unwrap_or_else(|e| panic!("cannot move the template cluster to {}: {e}", dir.display()));
            return dir;
        }
        let _ = std::fs::remove_dir_all(&staging);
    }
    dir
}

/// A running PostgreSQL server, shut down (immediate) and its dir and
/// shared memory removed on drop.
#[derive(Debug)]
pub struct PostgresServer {
    dir: tempfile::TempDir,
    port: u16,
    durable: bool,
    settings: Vec<(String, String)>,
    process: Option<ServerProcess>,
}

impl PostgresServer {
    /// A fast test server: `fsync=off` (no fsync; a server process crash
    /// loses nothing, an OS crash could).
    pub fn start() -> Self {
        Self::start_with(false, &[])
    }

    /// A fast test server with extra `-c name=value` settings (kept across restarts).
    pub fn start_with_settings(settings: &[(&str, &str)]) -> Self {
        Self::start_with(false, settings)
    }

    /// A server with `fsync=on` and `synchronous_commit=on`, for durability tests.
    pub fn start_durable() -> Self {
        Self::start_with(true, &[])
    }

    fn start_with(durable: bool, settings: &[(&str, &str)]) -> Self {
        let dir = pg_tempdir("holdfast-pg-");
        let status = as_postgres(Path::new("cp"))
            .arg("-a")
            .arg(template().join("data"))
            .arg(dir.path().join("data"))
            .status()
            .unwrap_or_else(|e| panic!("cannot copy the template cluster: {e}"));
        assert!(status.success(), "cp -a of the template cluster failed");
        let settings = settings.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let mut server = PostgresServer { dir, port: free_port(), durable, settings, process: None };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let mut cmd = as_postgres(&bin("postgres"));
        cmd.arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200"]);
        if self.durable {
            cmd.args(["-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on"]);
        } else {
            cmd.args(["-c", "fsync=off", "-c", "synchronous_commit=on", "-c", "full_page_writes=off"]);
        }
        for (k, v) in &self.settings {
            cmd.arg("-c").arg(format!("{k}={v}"));
        }
        // Its own process group, so a crash test can SIGKILL the postmaster
        // and all its backends at once.
        cmd.process_group(0);
        let log = self.dir.path().join(format!("pg-{}.log", std::process::id()));
        self.process = Some(ServerProcess::spawn(cmd, &log));
        let isready = bin("pg_isready");
        let port = self.port;
        let process = &mut self.process;
        wait_until("postgres", Duration::from_secs(30), Some(&log), || {
            // A postmaster that exited will not start: say why now, not
            // after the 30 s wait.
            if process.as_mut().is_some_and(|p| !p.is_running()) {
                panic!("{}", exited_at_start(&log_tail(&log)));
            }
            port_open(port)
                && Command::new(&isready)
                    .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres", "-t", "1"])
                    .output()
                    .is_ok_and(|o| o.status.success())
        });
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for the `postgres` database as user `postgres`, TLS off.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable", self.port)
    }

    /// The server's temp dir (owned by `postgres`; holds `data/`, the socket and the log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The data directory (owned by `postgres`).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Fast shutdown (SIGINT: sessions are ended, a checkpoint is written),
    /// then nothing runs until [`start_again`](Self::start_again).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop_with("INT");
        }
    }

    /// SIGKILL of the postmaster and all its backends at once (a server
    /// crash); a start afterwards runs crash recovery from the WAL.
    ///
    /// Each backend and auxiliary process of PostgreSQL is the leader of a
    /// process group of its own (it calls `setsid`), so the postmaster's
    /// group is not all of them: they are SIGKILLed one by one too, and this
    /// returns once they are gone. (Left alone they exit only when they
    /// notice the postmaster died, and a server started meanwhile refused
    /// with "pre-existing shared memory block is still in use": found by
    /// `holdfast verify --spawn postgres --faults restart`.)
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.process.take() {
            let children = children_of(p.pid());
            kill_group(p.pid());
            p.kill();
            for child in &children {
                let _ = Command::new("kill").args(["-s", "KILL", &child.to_string()]).status();
            }
            wait_until("postgres backends gone", Duration::from_secs(20), None, || {
                children.iter().all(|c| !std::path::Path::new(&format!("/proc/{c}")).exists() || is_zombie(*c))
            });
        }
        let port = self.port;
        wait_until("postgres port closed", Duration::from_secs(20), None, || !port_open(port));
    }

    /// Starts the server again on the same port and data dir.
    pub fn start_again(&mut self) {
        assert!(self.process.is_none(), "postgres is still running");
        self.launch();
    }

    /// Fast shutdown and start again on the same port and dir.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Runs `sql` with psql as the `postgres` user and returns its output
    /// (unaligned, tuples only).
    pub fn psql(&self, sql: &str) -> String {
        let psql = require_binary("psql", PG_BIN_DIRS, "postgresql-client-15");
        let out = Command::new(psql)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", "-d", "postgres"])
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .unwrap_or_else(|e| panic!("cannot run psql: {e}"));
        assert!(out.status.success(), "psql {sql:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

/// The processes whose parent is `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|c| {
            std::fs::read_to_string(format!("/proc/{c}/stat"))
                .ok()
                .and_then(|s| s.rsplit(')').next()?.split_whitespace().nth(1)?.parse::<u32>().ok())
                == Some(pid)
        })
        .collect()
}

/// Whether `pid` is a zombie (dead, not reaped yet).
fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
}

fn kill_group(pid: u32) {
    if pid != 0 {
        let _ = Command::new("kill").args(["-s", "KILL", "--", &format!("-{pid}")]).status();
    }
}

/// Why a postmaster exited before it was ready, from its log's `tail`, and
/// what to do where the log alone does not say it.
fn exited_at_start(tail: &str) -> String {
    if tail.contains("could not create shared memory segment") {
        format!(
            "postgres could not start: the kernel's System V shared memory segments are used up \
             (kernel.shmmni). Servers that were killed leave theirs behind: `ipcs -m` lists them, \
             and the ones of 56 bytes with 0 attached are PostgreSQL's; remove each with \
             `ipcrm -m ID`. Log tail:\n{tail}"
        )
    } else {
        format!("postgres exited before it was ready; log tail:\n{tail}")
    }
}

/// The System V shared memory segment a postmaster holds, by the id line 7
/// of its `postmaster.pid` names ("key id"); `None` once the server has shut
/// down (it removes the file and the segment).
fn segment_id(data_dir: &Path) -> Option<u32> {
    let pid_file = std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    pid_file.lines().nth(6)?.split_whitespace().nth(1)?.parse().ok()
}

impl Drop for PostgresServer {
    /// An immediate shutdown (SIGQUIT), not a SIGKILL. A running PostgreSQL
    /// holds a small System V shared memory segment that it removes only when
    /// it exits by itself; a SIGKILLed server leaves it in the kernel for
    /// good. A CI machine that had run the tests many times reached its
    /// segment limit (`kernel.shmmni`) that way, and every server after that
    /// failed to start with "could not create shared memory segment: No space
    /// left on device". The segment of a server that [`kill9`](Self::kill9)
    /// crashed and nothing started again is removed here too.
    fn drop(&mut self) {
        if let Some(mut p) = self.process.take() {
            // Falls back to SIGKILL if the server is not gone in 20 s.
            p.stop_with("QUIT");
        }
        if let Some(id) = segment_id(&self.data_dir()) {
            let _ = Command::new("ipcrm")
                .args(["-m", &id.to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// A PgBouncer in **transaction** pooling mode in front of a
/// [`PostgresServer`], with a pool of 2 server connections, so that
/// consecutive statements of one client land on different server sessions.
/// Runs as `postgres` when we are root (PgBouncer refuses root).
#[derive(Debug)]
pub struct PgBouncer {
    dir: tempfile::TempDir,
    port: u16,
    process: ServerProcess,
}

impl PgBouncer {
    /// Starts PgBouncer for `server`'s `postgres` database.
    pub fn start(server: &PostgresServer) -> Self {
        let binary = require_binary("pgbouncer", &["/usr/sbin", "/usr/bin"], "pgbouncer");
        let dir = pg_tempdir("holdfast-pgbouncer-");
        let port = free_port();
        let d = dir.path().display();
        let ini = format!(
            "[databases]\n\
             postgres = host=127.0.0.1 port={} dbname=postgres user=postgres\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {d}/userlist.txt\n\
             pool_mode = transaction\n\
             default_pool_size = 2\n\
             max_client_conn = 500\n\
             ignore_startup_parameters = extra_float_digits\n",
            server.port()
        );
        std::fs::write(dir.path().join("pgbouncer.ini"), ini).unwrap_or_else(|e| panic!("pgbouncer.ini: {e}"));
        std::fs::write(dir.path().join("userlist.txt"), "\"postgres\" \"\"\n")
            .unwrap_or_else(|e| panic!("userlist.txt: {e}"));
        if running_as_root() {
            let _ = Command::new("chown").arg("-R").arg("postgres:postgres").arg(dir.path()).status();
        }
        let mut cmd = as_postgres(&binary);
        cmd.arg(dir.path().join("pgbouncer.ini"));
        let log = dir.path().join("pgbouncer.log");
        let process = ServerProcess::spawn(cmd, &log);
        wait_until("pgbouncer", Duration::from_secs(20), Some(&log), || port_open(port));
        PgBouncer { dir, port, process }
    }

    /// A URL through the pooler (TLS off).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable", self.port)
    }

    /// The pooler's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Its temp dir (config and log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the kernel still holds System V segment `id` (`ipcs -i`
    /// exits 0 either way; only a held segment prints its `shmid=`).
    fn segment_held(id: u32) -> bool {
        let out = Command::new("ipcs").args(["-m", "-i", &id.to_string()]).output().expect("ipcs (util-linux) runs");
        String::from_utf8_lossy(&out.stdout).contains(&format!("shmid={id}"))
    }

    /// A server that cannot start fails at once with its log, not after
    /// the 30 s wait for it to be ready (here: a setting it refuses).
    #[test]
    fn a_server_that_exits_at_start_fails_at_once_with_its_log() {
        let started = std::time::Instant::now();
        let failed = std::panic::catch_unwind(|| PostgresServer::start_with_settings(&[("shared_buffers", "-1")]))
            .expect_err("a server with shared_buffers=-1 does not start");
        let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("postgres exited before it was ready"), "{message}");
        assert!(message.contains("shared_buffers"), "the log names the setting: {message}");
        assert!(started.elapsed() < Duration::from_secs(15), "failed only after {:?}", started.elapsed());
    }

    /// Segments used up (a machine where killed servers left theirs) get
    /// what to do, beside the server's own words.
    #[test]
    fn used_up_shared_memory_says_how_to_free_it() {
        let tail = "FATAL:  could not create shared memory segment: No space left on device";
        let message = exited_at_start(tail);
        assert!(message.contains("ipcs -m") && message.contains("ipcrm -m ID"), "{message}");
        assert!(message.ends_with(tail), "{message}");
    }

    /// The template cluster is found again by the next process, not made
    /// (and left in /tmp) by each: its name holds nothing random, and a
    /// second look for it takes the one there.
    #[test]
    fn the_template_cluster_is_made_once_and_kept() {
        let first = template().to_path_buf();
        let marked = || std::fs::metadata(first.join("complete")).and_then(|m| m.modified()).expect("the marker");
        let made = marked();
        let uid = Command::new("id").arg("-u").output().expect("id runs").stdout;
        let prefix = format!("/tmp/holdfast-pg-template-{}-", String::from_utf8_lossy(&uid).trim());
        assert!(first.to_string_lossy().starts_with(&prefix), "{} is not under {prefix}", first.display());
        assert_eq!(shared_template(), first, "another process would make another template");
        assert_eq!(marked(), made, "the template was made again");
    }

    /// A server dropped while it runs leaves no shared memory behind (a
    /// SIGKILL on drop left one segment per server until the kernel's limit).
    #[test]
    fn a_dropped_server_leaves_no_shared_memory() {
        let server = PostgresServer::start();
        let id = segment_id(&server.data_dir()).expect("a running postmaster names its segment");
        assert!(segment_held(id), "the running server holds segment {id}");
        drop(server);
        assert!(!segment_held(id), "segment {id} outlived its server");
    }

    /// A crash keeps the segment, as a real one does (the next start finds
    /// and replaces it), and dropping the crashed server removes it.
    #[test]
    fn a_crashed_server_keeps_its_segment_until_dropped() {
        let mut server = PostgresServer::start();
        let id = segment_id(&server.data_dir()).expect("a running postmaster names its segment");
        server.kill9();
        assert!(segment_held(id), "a crashed server's segment {id} stays, as after a real crash");
        drop(server);
        assert!(!segment_held(id), "segment {id} outlived its crashed server");
    }
}
