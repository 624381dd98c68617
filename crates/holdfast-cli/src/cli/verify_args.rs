//! `holdfast verify`'s arguments, and its hidden worker's.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::BackendArg;
use crate::duration;

/// The primitive `verify` exercises, and so the property it checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Primitive {
    /// The mutex: never two holders at once.
    #[default]
    Mutex,
    /// The semaphore: never more than N permits' weight held at once.
    Semaphore,
    /// The read-write lock: a writer holds alone; readers share.
    Rwlock,
    /// The election: at most one leader at a time, terms increasing.
    Election,
}

impl Primitive {
    /// Its name, as `--primitive` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Primitive::Mutex => "mutex",
            Primitive::Semaphore => "semaphore",
            Primitive::Rwlock => "rwlock",
            Primitive::Election => "election",
        }
    }
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
    #[arg(long, default_value = "1s", value_parser = duration::parse_ttl, value_name = "DURATION")]
    pub ttl: Duration,
    /// Faults to inject, comma-separated (none: `--faults` with no value).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "kill,pause")]
    pub faults: Vec<FaultKind>,
    /// The primitive the workers exercise: mutex, semaphore (--permits, grants of 1 or 2
    /// permits), rwlock (readers and writers), election (campaign, resign, lose).
    #[arg(long, value_enum, default_value_t = Primitive::Mutex)]
    pub primitive: Primitive,
    /// The semaphore's permit count (with --primitive semaphore) [default: 2].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub permits: Option<u32>,
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
    /// The primitive to exercise.
    #[arg(long, value_enum, default_value_t = Primitive::Mutex)]
    pub primitive: Primitive,
    /// The semaphore's permit count.
    #[arg(long, default_value_t = 2)]
    pub permits: u32,
}
