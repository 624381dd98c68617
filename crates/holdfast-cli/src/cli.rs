//! The command line, as clap types.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::duration;

mod credentials;
mod help;
mod verify_args;
use crate::exit::{Failure, HELP_TABLE};
pub use credentials::{ENV_PASSWORD, ENV_PASSWORD_FILE};
use help::{BENCH_HELP, ELECT_HELP, RELEASE_HELP, RUN_HELP, VERIFY_HELP};
pub use verify_args::{FaultKind, Primitive, VerifyArgs, VerifyWorkerArgs};

/// The environment variable that names the store when `--backend` is not given.
pub const ENV_BACKEND: &str = "HOLDFAST_BACKEND";
/// Set for `run`'s command: the lock key.
pub const ENV_KEY: &str = "HOLDFAST_KEY";
/// Set for `run`'s command: the fencing token of the grant.
pub const ENV_FENCE: &str = "HOLDFAST_FENCE";

/// Distributed locks from the shell: run a command under a lock, inspect locks, watch a demo.
#[derive(Debug, Parser)]
#[command(name = "holdfast", version, after_help = HELP_TABLE)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Flash sale: worker processes sell a stock under the lock; checks nothing is oversold.
    Demo(DemoArgs),
    /// Run a command while holding a lock.
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),
    /// Leader election: run CMD while leading NAME (or lead until a signal); --observe prints
    /// each new leader.
    #[command(after_help = ELECT_HELP)]
    Elect(ElectArgs),
    /// Show who holds locks; --watch keeps showing it.
    Status(StatusArgs),
    /// List every held lock (under PREFIX).
    List(ListArgs),
    /// Free locks whatever their holders (needs --force): for a holder that is gone.
    #[command(after_help = RELEASE_HELP)]
    Release(ReleaseArgs),
    /// Measure the store: cycles/s, latencies, hand-offs, store commands, against the raw floor;
    /// --held N and --hot W [--procs P] for the scale workloads.
    #[command(after_help = BENCH_HELP)]
    Bench(BenchArgs),
    /// Check the store's guarantees under faults: worker processes take the lock and write to a
    /// fenced register while holders are killed and paused; the history is checked and reported.
    #[command(after_help = VERIFY_HELP)]
    Verify(VerifyArgs),
    /// One worker process of `demo` (internal).
    #[command(name = "__demo-worker", hide = true)]
    DemoWorker(DemoWorkerArgs),
    /// One worker process of `bench --hot W --procs P` (internal; talks JSON on stdin/stdout).
    #[command(name = "__bench-worker", hide = true)]
    BenchWorker,
    /// One worker process of `verify` (internal; talks JSON lines to the parent's register).
    #[command(name = "__verify-worker", hide = true)]
    VerifyWorker(VerifyWorkerArgs),
}

/// Where the locks live.
#[derive(Debug, Clone, Args)]
pub struct BackendArg {
    /// Lock store URL: sqlite://PATH, redis://HOST:PORT, etcd://..., zk://..., postgres://..., mysql://...
    /// [default: sqlite:// file in the user's state directory]
    #[arg(long, env = ENV_BACKEND, value_name = "URL", hide_env_values = true)]
    pub backend: Option<String>,
    /// Read the store's password from the first line of FILE, kept out of the URL (and so out of
    /// `ps` and shell history); HOLDFAST_PASSWORD gives it from the environment instead
    #[arg(long, env = ENV_PASSWORD_FILE, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
}

impl BackendArg {
    /// The store URL: the flag, the environment, or the default SQLite file;
    /// with the password of `--password-file` or `HOLDFAST_PASSWORD` put in it.
    pub fn url(&self) -> Result<String, Failure> {
        let password = self.password()?;
        let Some(url) = &self.backend else {
            if password.is_some() {
                return Err(Failure::usage(format!(
                    "a password (--password-file or {ENV_PASSWORD}) needs a store: pass --backend URL or set \
                     {ENV_BACKEND}"
                )));
            }
            return Ok(format!("sqlite://{}", self.default_path()?.display()));
        };
        match password {
            Some(password) => credentials::with_password(url, &password),
            None => Ok(url.clone()),
        }
    }

    /// The password from `--password-file` or `HOLDFAST_PASSWORD`, if one is given; both is an error.
    fn password(&self) -> Result<Option<String>, Failure> {
        let from_env = std::env::var_os(ENV_PASSWORD).filter(|v| !v.is_empty());
        match (&self.password_file, from_env) {
            (Some(_), Some(_)) => {
                Err(Failure::usage(format!("both --password-file and {ENV_PASSWORD} give a password: unset one")))
            }
            (Some(path), None) => credentials::read_password_file(path).map(Some),
            (None, Some(value)) => {
                value.into_string().map(Some).map_err(|_| Failure::usage(format!("{ENV_PASSWORD} is not valid UTF-8")))
            }
            (None, None) => Ok(None),
        }
    }

    /// Whether neither `--backend` nor `HOLDFAST_BACKEND` named a store, so the
    /// local default file is used.
    pub fn is_implicit(&self) -> bool {
        self.backend.is_none()
    }

    /// The store URL for a command that takes locks: as [`url`](Self::url),
    /// and the default file's own directory is created (only that one: a
    /// directory in a URL the user gave is never created).
    pub fn url_for_locking(&self) -> Result<String, Failure> {
        // First the checks (a password for no store is refused), then the directory.
        let url = self.url()?;
        if self.is_implicit() {
            let path = self.default_path()?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Failure::new(
                        crate::exit::UNAVAILABLE,
                        format!("cannot create the default store's directory {}: {e}", dir.display()),
                    )
                })?;
            }
        }
        Ok(url)
    }

    /// The store URL for a command that only reads or frees locks (`status`,
    /// `list`, `release`): an `sqlite://` file must exist (`mode=rw`), so a
    /// mistyped path is an error rather than a new, empty store.
    pub fn url_read_only(&self) -> Result<String, Failure> {
        let url = self.url()?;
        Ok(must_exist(&url))
    }

    fn default_path(&self) -> Result<PathBuf, Failure> {
        default_db_path().ok_or_else(|| {
            Failure::usage(format!("no state directory to keep locks in; pass --backend URL or set {ENV_BACKEND}"))
        })
    }
}

/// `url` with `mode=rw` added if it is an `sqlite://` URL without a `mode`.
fn must_exist(url: &str) -> String {
    if !url.starts_with("sqlite://") {
        return url.to_owned();
    }
    let query = url.split_once('?').map_or("", |(_, q)| q);
    if query.split('&').any(|pair| pair.split_once('=').map_or(pair, |(k, _)| k) == "mode") {
        return url.to_owned();
    }
    let separator = match url.split_once('?') {
        None => "?",
        Some((_, "")) => "",
        Some(_) if url.ends_with('&') => "",
        Some(_) => "&",
    };
    format!("{url}{separator}mode=rw")
}

#[cfg(test)]
mod tests {
    use super::must_exist;

    #[test]
    fn read_only_sqlite_urls_ask_for_an_existing_file() {
        assert_eq!(must_exist("sqlite:///a/b.db"), "sqlite:///a/b.db?mode=rw");
        assert_eq!(must_exist("sqlite:///a/b.db?timeout_ms=5"), "sqlite:///a/b.db?timeout_ms=5&mode=rw");
        assert_eq!(must_exist("sqlite:///a/b.db?"), "sqlite:///a/b.db?mode=rw");
        assert_eq!(must_exist("sqlite:///a/b.db?mode=rwc"), "sqlite:///a/b.db?mode=rwc");
        assert_eq!(must_exist("redis://h:1"), "redis://h:1");
    }
}

/// The default SQLite file: `holdfast/locks.db` in the user's state directory
/// (`$XDG_STATE_HOME`, `~/.local/state`), else the local data directory.
pub fn default_db_path() -> Option<PathBuf> {
    let base = dirs::state_dir().or_else(dirs::data_local_dir)?;
    Some(base.join("holdfast").join("locks.db"))
}

/// `holdfast demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Lock store URL [default: an SQLite file in a fresh temp dir]. HOLDFAST_BACKEND is not read.
    #[arg(long, value_name = "URL")]
    pub backend: Option<String>,
    /// Worker processes.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: u32,
    /// Items for sale.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub stock: u64,
    /// Sell without the lock, to see what it prevents (expect exit 1).
    #[arg(long, conflicts_with = "segments")]
    pub without_lock: bool,
    /// Split the stock evenly over N segments, each under its own lock (`KEY/seg-I`) with its own
    /// witness; a buyer is routed to a segment by a hash of their id and falls over to the next
    /// segment with stock when theirs is empty. `--segments 1` is the one-lock baseline.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=holdfast::Segmented::MAX_SEGMENTS as i64))]
    pub segments: Option<u32>,
    /// Buyer tasks per worker process, each buying one item at a time.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub tasks: u32,
    /// Simulated work per item, held under the lock (a payment call, say), in milliseconds. With 0
    /// the critical section is a few file operations and the lock store itself is what limits.
    #[arg(long, default_value_t = 0, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub work_ms: u64,
}

/// `holdfast run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub backend: BackendArg,
    /// Serve metrics in Prometheus text format at http://ADDR/metrics
    /// (ADDR as HOST:PORT) while this runs.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The lock key.
    #[arg(long, short)]
    pub key: String,
    /// Lease TTL: a holdfast that dies frees the lock after this long.
    #[arg(long, default_value = "30s", value_parser = duration::parse_ttl, value_name = "DURATION")]
    pub ttl: Duration,
    /// How long to wait for a busy lock; 0 = one try [default: wait forever].
    #[arg(long, value_parser = duration::parse, value_name = "DURATION")]
    pub wait: Option<Duration>,
    /// When the lease runs out: time between SIGTERM and SIGKILL [default: min(5s, ttl/4)].
    #[arg(long, value_parser = duration::parse, value_name = "DURATION")]
    pub kill_after: Option<Duration>,
    /// Stop renewing after this long: the lease then runs out within one TTL and CMD is stopped.
    #[arg(long, value_parser = duration::parse, value_name = "DURATION")]
    pub max_hold: Option<Duration>,
    /// Holder label shown by `status` [default: host:pid].
    #[arg(long)]
    pub label: Option<String>,
    /// Take one permit of a semaphore of N permits on KEY instead of the
    /// mutex: at most N commands run at once.
    #[arg(long, value_name = "N", conflicts_with = "shared")]
    pub permits: Option<u32>,
    /// Take a read lock on KEY instead of the mutex: shared with other
    /// `--shared` runs. A plain `run` on the same KEY excludes them and is
    /// excluded by them (it does not hold back new readers while it waits).
    #[arg(long)]
    pub shared: bool,
    /// Take the lock in request order (FIFO): no later `run` overtakes a
    /// waiting one. Needs a store that queues waiters (a usage error, 64, on one that cannot).
    #[arg(long, conflicts_with_all = ["permits", "shared"])]
    pub fair: bool,
    /// Exit with CODE instead of 75 when the lock stays busy until --wait runs out (flock's -E).
    #[arg(long, value_name = "CODE")]
    pub busy_exit: Option<u8>,
    /// Say nothing when the lock is busy (for cron: a skipped run mails nothing; the exit code
    /// still tells), show no waiting line, and no note about the implicit local store.
    #[arg(long, short)]
    pub quiet: bool,
    /// The command and its arguments (after `--`). Without one, holdfast holds the lock until
    /// SIGINT, SIGTERM or SIGHUP (as `etcdctl lock`), then releases it and exits 0.
    // No allow_hyphen_values: a mistyped flag (`--wiat 5s`) is an error with a
    // suggestion, not a command named `--wiat`; after `--` anything goes.
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `holdfast status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub backend: BackendArg,
    /// The lock keys.
    #[arg(required = true, value_name = "KEY")]
    pub keys: Vec<String>,
    /// Print JSON (an array, one object per key; with --watch, one array per line).
    #[arg(long)]
    pub json: bool,
    /// Keep showing the keys, read again every --interval: on a terminal a live view; otherwise a
    /// new table each time a key's holder, fence, shares or waiters change. Ctrl-C ends it (exit 0).
    #[arg(long)]
    pub watch: bool,
    /// How often --watch reads the keys.
    #[arg(long, default_value = "1s", value_parser = duration::parse, value_name = "DURATION", requires = "watch")]
    pub interval: Duration,
}

/// `holdfast list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub backend: BackendArg,
    /// Only keys that start with this [default: every key].
    #[arg(value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// Print JSON (an array, one object per key, as `status --json`).
    #[arg(long)]
    pub json: bool,
}

/// `holdfast release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub backend: BackendArg,
    /// Required: free the keys whatever their holders.
    #[arg(long)]
    pub force: bool,
    /// The lock keys.
    #[arg(required = true, value_name = "KEY")]
    pub keys: Vec<String>,
}

/// `holdfast __demo-worker` (the backend comes from HOLDFAST_BACKEND).
#[derive(Debug, Args)]
pub struct DemoWorkerArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub backend: BackendArg,
    /// The lock key of this demo run.
    #[arg(long)]
    pub key: String,
    /// The witness directory holding the stock.
    #[arg(long)]
    pub witness: PathBuf,
    /// Sell without the lock.
    #[arg(long)]
    pub without_lock: bool,
    /// Segments of the stock (witness subdirectories `seg-I`), if segmented.
    #[arg(long)]
    pub segments: Option<u32>,
    /// Buyer tasks in this worker.
    #[arg(long, default_value_t = 1)]
    pub tasks: u32,
    /// Simulated work per item under the lock, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub work_ms: u64,
    /// This worker's number, for its buyers' ids.
    #[arg(long, default_value_t = 0)]
    pub index: u32,
}

/// `holdfast bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Serve metrics in Prometheus text format at http://ADDR/metrics
    /// (ADDR as HOST:PORT) while this runs.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The workloads and their sizes.
    #[command(flatten)]
    pub bench: holdfast_bench::args::Args,
}

/// `holdfast elect`.
#[derive(Debug, Args)]
pub struct ElectArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub backend: BackendArg,
    /// The election's name (its lock key).
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The value published while this candidate leads [default: host:pid].
    #[arg(long, conflicts_with = "observe")]
    pub value: Option<String>,
    /// Campaign for nothing: print each new leader as `term T: VALUE` until a signal (etcdctl elect -l).
    #[arg(long, short = 'l')]
    pub observe: bool,
    /// Leadership lease TTL: a leader that dies is replaced within it.
    #[arg(long, default_value = "30s", value_parser = duration::parse_ttl, value_name = "DURATION")]
    pub ttl: Duration,
    /// How long to wait to lead; 0 = one try (exit 75 if someone leads) [default: wait forever].
    #[arg(long, value_parser = duration::parse, value_name = "DURATION", conflicts_with = "observe")]
    pub wait: Option<Duration>,
    /// As for `run`: when leadership is being lost, time between SIGTERM and SIGKILL for CMD.
    #[arg(long, value_parser = duration::parse, value_name = "DURATION", conflicts_with = "observe")]
    pub kill_after: Option<Duration>,
    /// No note about the implicit local store, no message when --wait runs out.
    #[arg(long, short)]
    pub quiet: bool,
    /// The command to run while leading, after `--` [default: lead until a signal].
    #[arg(trailing_var_arg = true, value_name = "CMD", conflicts_with = "observe")]
    pub command: Vec<String>,
}
