//! A MariaDB (or MySQL-compatible) server on a random loopback port.
//!
//! `mariadb-install-db` initialises a data dir in a temp dir, then `mariadbd`
//! runs on `127.0.0.1:<free port>` with its socket, pid file and error log in
//! the same dir (`--no-defaults` so nothing from `/etc/mysql` is read,
//! `--user=root` because the tests may run as root, `--skip-log-bin`, a small
//! buffer pool). A database `holdfast` and a user `holdfast` with a password
//! are created, so URLs exercise password authentication.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{ServerProcess, free_port, require_binary, wait_until};

/// The database the tests use.
pub const DATABASE: &str = "holdfast";
/// The user the tests log in as.
pub const USER: &str = "holdfast";
/// Its password (with characters that need URL encoding).
pub const PASSWORD: &str = "hf pw/#?:@secret";

/// Flags for both bootstrap and server: a small buffer pool and redo log,
/// and no Linux native AIO (parallel test servers can exhaust the kernel's
/// `aio-max-nr`, and InnoDB then fails to start).
const SERVER_FLAGS: &[&str] =
    &["--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M", "--innodb-use-native-aio=0"];

const SBIN: &[&str] = &["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"];

/// A running MariaDB server, SIGKILLed on drop; its data dir is removed on drop.
#[derive(Debug)]
pub struct MysqlServer {
    port: u16,
    dir: tempfile::TempDir,
    mariadbd: PathBuf,
    admin: PathBuf,
    client: PathBuf,
    tls: bool,
    statement_binlog: bool,
    process: Option<ServerProcess>,
}

impl MysqlServer {
    /// Initialises a data dir and starts the server; panics (with the log) on failure.
    pub fn start() -> Self {
        Self::start_with(false, false)
    }

    /// Like [`start`](Self::start), with the binary log on and written as
    /// statements (`--log-bin --binlog-format=STATEMENT`), as some older
    /// replication setups run: a server that refuses writes of
    /// `READ COMMITTED` transactions.
    pub fn start_statement_binlog() -> Self {
        Self::start_with(false, true)
    }

    /// Like [`start`](Self::start), with TLS: a throwaway CA and a server
    /// certificate for `127.0.0.1` made with `openssl`; the CA is
    /// at [`ca_file`](Self::ca_file).
    pub fn start_tls() -> Self {
        Self::start_with(true, false)
    }

    fn start_with(tls: bool, statement_binlog: bool) -> Self {
        let install = require_binary("mariadb-install-db", SBIN, "mariadb-server");
        let mariadbd = require_binary("mariadbd", SBIN, "mariadb-server");
        let admin = require_binary("mariadb-admin", SBIN, "mariadb-client");
        let client = require_binary("mariadb", SBIN, "mariadb-client");
        let dir = tempfile::Builder::new().prefix("holdfast-maria").tempdir().expect("tempdir");
        let data = dir.path().join("data");
        // A private tmpdir: parallel bootstraps sharing /tmp collide on
        // their temporary table names and abort.
        let tmp = dir.path().join("tmp");
        std::fs::create_dir_all(&tmp).expect("tmpdir");
        let log = dir.path().join("install.log");
        let out = std::fs::File::create(&log).expect("install log");
        let status = Command::new(&install)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--user=root", "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve"])
            .args(SERVER_FLAGS)
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .status()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", install.display()));
        if !status.success() {
            panic!("mariadb-install-db failed: {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        if tls {
            super::tls::make_server_certificate(&dir.path().join("tls"));
        }
        let mut server =
            MysqlServer { port: free_port(), dir, mariadbd, admin, client, tls, statement_binlog, process: None };
        server.spawn();
        server.sql(&format!(
            "CREATE DATABASE IF NOT EXISTS {DATABASE}; \
             CREATE USER IF NOT EXISTS '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'; \
             GRANT ALL ON {DATABASE}.* TO '{USER}'@'127.0.0.1';"
        ));
        server
    }

    /// Runs `sql` as root with the `mariadb` client (batch mode, no column
    /// names) and returns its output; panics if the client fails.
    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Runs `sql` as [`sql`](Self::sql) does; the client's error output if
    /// it fails (a statement the server refused).
    pub fn try_sql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new(&self.client)
            .args(["--no-defaults", "-h", "127.0.0.1", "-P", &self.port.to_string(), "-u", "root"])
            .args(["--batch", "--skip-column-names", "-e", sql])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.client.display()));
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn spawn(&mut self) {
        let d = self.dir.path();
        let mut cmd = Command::new(&self.mariadbd);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--tmpdir={}", d.join("tmp").display()))
            .arg("--user=root")
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", d.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", d.join("mysqld.pid").display()))
            .args(["--skip-name-resolve", "--skip-log-bin"])
            .args(SERVER_FLAGS)
            .arg(format!("--log-error={}", self.error_log().display()));
        if self.statement_binlog {
            // After --skip-log-bin: the later option wins.
            cmd.arg(format!("--log-bin={}", d.join("binlog").display()))
                .args(["--binlog-format=STATEMENT", "--server-id=1"]);
        }
        if self.tls {
            let t = d.join("tls");
            cmd.arg(format!("--ssl-ca={}", t.join("ca.pem").display()))
                .arg(format!("--ssl-cert={}", t.join("server.pem").display()))
                .arg(format!("--ssl-key={}", t.join("server.key").display()));
        }
        self.process = Some(ServerProcess::spawn(cmd, &d.join("stdout.log")));
        let (admin, port, log) = (self.admin.clone(), self.port, self.error_log());
        wait_until("mariadbd", Duration::from_secs(60), Some(&log), || {
            Command::new(&admin)
                .args(["--no-defaults", "-h", "127.0.0.1", "-P", &port.to_string(), "-u", "root", "ping"])
                .output()
                .is_ok_and(|o| o.status.success())
        });
    }

    /// The CA certificate of a [`start_tls`](Self::start_tls) server.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("tls").join("ca.pem")
    }

    fn error_log(&self) -> PathBuf {
        self.dir.path().join("error.log")
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The temp dir of this server (data, socket, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A `mysql://` URL for the test user and database, with `options`
    /// (`"namespace=x&poll_max_ms=5"`, or empty) appended as the query.
    pub fn url_with(&self, options: &str) -> String {
        let pw: String = PASSWORD
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b == b'-' { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        let q = if options.is_empty() { String::new() } else { format!("?{options}") };
        format!("mysql://{USER}:{pw}@127.0.0.1:{}/{DATABASE}{q}", self.port)
    }

    /// A `mysql://` URL for the test user and database.
    pub fn url(&self) -> String {
        self.url_with("")
    }

    /// Clean shutdown (SIGTERM, waits for exit); the data dir stays.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop_with("TERM");
        }
    }

    /// SIGKILL (a crash); the data dir stays.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    /// Starts the server again on the same port and data dir (after
    /// [`stop`](Self::stop) or [`kill`](Self::kill)); waits until it answers.
    pub fn start_again(&mut self) {
        assert!(self.process.is_none(), "the server is still running");
        self.spawn();
    }

    /// Clean stop, then start on the same port and data dir.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Whether the server process runs.
    pub fn is_running(&mut self) -> bool {
        self.process.as_mut().is_some_and(|p| p.is_running())
    }
}
