//! The command line, as clap types.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::duration;
use crate::exit::{Failure, HELP_TABLE};

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

const VERIFY_HELP: &str = "\
Each worker loops: acquire, a critical section of writes to a fenced register (each write
first checks that the lease is still believed held), release. The register (in this process)
accepts a write whose fence is at least the highest it accepted (equal only from the same
grant) and refuses the rest: a refused write is a stale write that fencing stopped.

Faults (--faults, comma-separated, injected one at a time, round robin, on the current holder):
    kill    SIGKILL the holder; a new worker takes its lane. Measures the time the key stood
            free after the death (must be at most TTL + 1s).
    pause   SIGSTOP the holder for 1.5 x TTL + 200ms, then SIGCONT (a GC pause; on etcd, whose
            leases are whole seconds and at least 2s, 1.5 x that lease). Every other pause
            stops the holder right after it checked its lease and before its write reaches
            the register, so the write arrives late and the fence must refuse it.
    slow    SIGSTOP the holder for 0.6 x TTL: its renewal runs late (the lease may survive).
With --spawn STORE (verify starts the server on loopback), server faults too:
    restart SIGKILL the server, start it again on its data. Without persistence (--spawn redis)
            the locks and fence counters are gone: what breaks then is reported as that
            store's documented weakness and does not fail the run.
    leader  SIGKILL the leader of a 3-member ensemble (--spawn etcd3 | zookeeper3); an etcd
            member is started again after one TTL; ZooKeeper's leader is killed once per run
            (the testkit cannot start a member again; two members keep the quorum).
    partition  the holder keeps running but its traffic to the store stops (each worker
            reaches the server through a fault proxy of its own; this one blackholes for
            1.5 x the store's lease + 200ms, then drops the stuck connections and heals).
            --spawn of a one-server store (redis, redis-durable, postgres, mysql, etcd,
            zookeeper). Not network namespaces: the proxy cuts one client, not a host.

All times are CLOCK_MONOTONIC, one clock for every process on the machine: each event is
timed by the process that saw it (a worker for its grants, lost() and releases; the parent
for faults and the register's decisions), so a paused worker's events keep their true times.

Output (--out DIR, default a new temp dir, kept): history.jsonl, report.txt, report.html.
Exit: 0 every guarantee held; 1 a guarantee broke (the report says which, with the events
around it); 64 usage; 69 the store is unreachable.

Examples:
    holdfast verify --backend redis://127.0.0.1:6379 --workers 4 --duration 60s --ttl 2s --faults kill,pause
    holdfast verify --backend sqlite:///tmp/v.db --duration 10s --ttl 1s --faults kill,pause,slow --out ./v";

const RUN_HELP: &str = "\
CMD runs with HOLDFAST_KEY (the key) and HOLDFAST_FENCE (the grant's fencing token) set.
holdfast renews the lease while CMD runs and exits with CMD's status. SIGINT, SIGTERM and
SIGHUP sent to holdfast are forwarded to CMD; the lock is released once CMD has exited.
The lock still busy when --wait runs out: exit 75. The store failing: exit 69.

A lease that runs out stops CMD before anyone else can get the lock: once renewal has failed
and the lease has --kill-after plus a margin left, CMD gets SIGTERM; --kill-after later CMD
and its process group get SIGKILL, the margin before the lease ends (margin: min(25ms, ttl/10)
+ ttl/50). holdfast then exits 74. --kill-after defaults to min(5s, ttl/4) and, plus the
margin, must be at most half of --ttl (renewal runs every ttl/3; more would stop CMD between
renewals). If holdfast itself is killed, the kernel kills CMD (SIGKILL; Linux).

CMD runs in a process group of its own; signals go to the whole group, so a script's children
are stopped too. On a terminal CMD's group becomes the foreground group, as a shell runs a job:
CMD can read the terminal and gets Ctrl-C and Ctrl-Z. Exception: when holdfast shares its
process group with other processes (a pipeline such as `holdfast run ... | less`), CMD stays in
that group and signals from holdfast go to CMD alone.

ZooKeeper frees a dead holder's lock when its session expires: on zk:// URLs without a
session_timeout option, holdfast asks for a session timeout of --ttl. The server clamps it to
[2, 20] x its tickTime (4s to 40s by default): the lock of a killed holdfast is freed after
2 x tickTime when --ttl is shorter than that, and after 20 x tickTime when it is longer.

Examples:
    holdfast run --key nightly-report --ttl 30s -- ./report.sh
    holdfast run --key deploy --wait 0 -- make deploy      # skip if someone else deploys
    holdfast run --backend redis://127.0.0.1:6379 --key k --wait 10s -- sh -c 'echo $HOLDFAST_FENCE'";

const BENCH_HELP: &str = "\
Scale workloads (instead of the default ones unless --workloads is given too):
    --held N    one client holds N leases (--lease-ttl, default 6s) for --duration (default five
                renewal periods) while a probe on the same client takes and frees another key every
                20 ms; --churn adds 16 tasks acquiring and releasing other keys at full speed.
                Reports acquisition cost at the first and last 1,000 leases, the probe's p50/p99/max
                against an idle client, leases lost, renew calls and their size and length, store
                commands per period, memory per held lease, and releasing them all.
    --hot W     W tasks loop acquire, hold --hold-ms (default 0.2), release on one key for --duration
                (default 20s), split over --procs P processes (this binary, re-executed); --fair for
                FIFO locks. Reports acquisitions/s, library calls, store requests and server commands
                per acquisition, tasks that never acquired, the longest wait, busiest/least busy task,
                and how often the releasing task takes the key again.

Examples:
    holdfast bench --backend redis://127.0.0.1:6379 --held 100000 --churn
    holdfast bench --backend sqlite:///tmp/bench.db --hot 1024 --procs 4 --json";

/// Where the locks live.
#[derive(Debug, Clone, Args)]
pub struct BackendArg {
    /// Lock store URL: sqlite://PATH, redis://HOST:PORT, etcd://..., zk://..., postgres://..., mysql://...
    /// [default: sqlite:// file in the user's state directory]
    #[arg(long, env = ENV_BACKEND, value_name = "URL", hide_env_values = true)]
    pub backend: Option<String>,
}

impl BackendArg {
    /// The store URL: the flag, the environment, or the default SQLite file.
    pub fn url(&self) -> Result<String, Failure> {
        if let Some(url) = &self.backend {
            return Ok(url.clone());
        }
        let path = default_db_path().ok_or_else(|| {
            Failure::usage(format!("no state directory to keep locks in; pass --backend URL or set {ENV_BACKEND}"))
        })?;
        Ok(format!("sqlite://{}", path.display()))
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
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=holdfast::MAX_SEGMENTS as i64))]
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
    #[arg(long, default_value = "30s", value_parser = duration::parse, value_name = "DURATION")]
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
    /// The command and its arguments (after `--`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
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

const RELEASE_HELP: &str = "\
Removes every lease of each KEY (a mutex's holder, a semaphore's permits, readers), whoever
holds them, and prints the fences removed (or that the key was free). The key can be taken
again at once, with a higher fence; waiters are woken. A holder that is still alive is not
stopped: its next renewal fails and its lost() fires (`holdfast run` then stops its command),
and a resource that checks fences refuses its writes. Without --force: exit 64.

Examples:
    holdfast list jobs/
    holdfast release --force jobs/nightly-report";

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

/// A fault `verify` injects into a worker process.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum FaultKind {
    /// SIGKILL the holder.
    Kill,
    /// SIGSTOP the holder past its TTL, then SIGCONT.
    Pause,
    /// SIGSTOP the holder for part of its TTL: renewal runs late.
    Slow,
    /// SIGKILL the store's server and start it again on its data (`--spawn` only).
    Restart,
    /// SIGKILL the leader of a 3-member ensemble (`--spawn etcd3|zookeeper3` only).
    Leader,
    /// Cut the holder off from the store (a blackholing proxy) while it keeps running
    /// (`--spawn` of a one-server store only).
    Partition,
}

impl FaultKind {
    /// Whether the fault hits the store's server rather than a worker.
    pub fn is_server(self) -> bool {
        matches!(self, FaultKind::Restart | FaultKind::Leader)
    }
}

/// `holdfast verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub backend: BackendArg,
    /// Worker processes contending for the lock.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// How long the workers run.
    #[arg(long, default_value = "10s", value_parser = duration::parse, value_name = "DURATION")]
    pub duration: Duration,
    /// Lease TTL of every grant.
    #[arg(long, default_value = "1s", value_parser = duration::parse, value_name = "DURATION")]
    pub ttl: Duration,
    /// Faults to inject, comma-separated (none: `--faults` with no value).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "kill,pause")]
    pub faults: Vec<FaultKind>,
    /// The primitive under test (only the mutex for now).
    #[arg(long, default_value = "mutex", value_parser = ["mutex"])]
    pub primitive: String,
    /// Directory for history.jsonl, report.txt and report.html [default: a new temp dir].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The lock key [default: a fresh one per run].
    #[arg(long)]
    pub key: Option<String>,
    /// Start the store's server here, on loopback in a temp dir, instead of --backend: sqlite,
    /// redis, redis-durable, postgres, mysql, etcd, etcd3, zookeeper, zookeeper3. Allows the
    /// faults `restart`, `leader` and `partition`.
    #[arg(long, value_name = "STORE", conflicts_with = "backend")]
    pub spawn: Option<String>,
}

/// `holdfast __verify-worker` (the backend comes from HOLDFAST_BACKEND).
#[derive(Debug, Args)]
pub struct VerifyWorkerArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub backend: BackendArg,
    /// The lock key.
    #[arg(long)]
    pub key: String,
    /// The parent's register, `127.0.0.1:PORT`.
    #[arg(long)]
    pub register: String,
    /// This worker's lane.
    #[arg(long)]
    pub lane: u32,
    /// Lease TTL in milliseconds.
    #[arg(long)]
    pub ttl_ms: u64,
    /// The run's start, CLOCK_MONOTONIC in microseconds: times are reported from it.
    #[arg(long)]
    pub epoch_us: i64,
    /// Stop taking the lock this many microseconds after the start.
    #[arg(long)]
    pub until_us: i64,
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
