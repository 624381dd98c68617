//! # holdfast-bench: the workloads behind `holdfast bench`
//!
//! One call, [`run`], measures holdfast on a store and, in the same run, the
//! store's **raw floor**: the fewest store commands that do the same work with
//! the store's plain client (see [`floor`]). The report gives holdfast/floor
//! ratios, so a figure means something on any machine.
//!
//! ```no_run
//! # async fn demo() -> holdfast::Result<()> {
//! let opts = holdfast_bench::BenchOptions::new("sqlite:///tmp/holdfast-bench.db");
//! let report = holdfast_bench::run(&opts, |event| eprintln!("{event}")).await?;
//! println!("{report}"); // the human table; `serde_json::to_string(&report)` for --json
//! # Ok(()) }
//! ```
//!
//! ## Workloads
//!
//! - [`Workload::Uncontended`]: T tasks (default 64), each acquiring and
//!   releasing its own key in a loop.
//! - [`Workload::Contended`]: T tasks (default 16) on one key: acquire with
//!   waiting, a tiny critical section, release.
//! - [`Workload::ContendedThink`]: the same with a think time (default 1 ms)
//!   after each release, so that the lock really passes between tasks.
//! - [`Workload::Readers`]: T tasks (default 64), each taking a read lock of
//!   its own key in a loop (the floor: its read-write lock where it has one,
//!   else its mutex on the same keys).
//! - [`Workload::ManyLeases`]: one client holding N leases (default 10,000)
//!   with renewal on: renewal round trips per renewal period, and the
//!   client's resident memory for them.
//! - [`Workload::Held`] (`holdfast bench --held N`, [`held`]): one client
//!   holding N leases (TTL 6 s) for several renewal periods, with a probe
//!   timing other lock calls of the same client during renewal, optionally
//!   with churn on other keys; acquisition cost at the first and the last
//!   1,000 leases, leases lost, renew calls and their size and length, memory
//!   per held lease, releasing them all.
//! - [`Workload::Hot`] (`holdfast bench --hot W --procs P`, [`hot`]): W tasks
//!   over P processes looping acquire, hold 0.2 ms, release on one key:
//!   acquisitions/s, library calls, store requests and server commands per
//!   acquisition, tasks that never acquired, longest wait, busiest/least busy
//!   task, and how often the releasing task takes the key again.
//! - [`run_layered`] (the `layered` example): N clients on one key over an
//!   authoritative store alone and behind a fast store
//!   (`layered://FAST|AUTH`): acquisitions/s, acquire latency, calls to
//!   the authoritative store and its server's own count per acquisition.
//!
//! ## Metrics
//!
//! cycles/s; acquire latency p50/p99 (call to return, waiting included);
//! hand-off latency p50/p99 (a release returned -> the next acquire of
//! another task returned); acquisitions per task (min/max: fairness); owner
//! switches; store commands per acquisition where the store can count them
//! (Redis: `INFO commandstats` deltas read on a separate plain connection;
//! n/a elsewhere); renewal calls per renewal period (counted at holdfast's
//! `Backend` trait, so for every store); and the invariants: overlapping
//! holders (must be 0) and tasks that never acquired.
//!
//! ## Reading the figures
//!
//! Bench figures depend on the machine and on whatever else runs on it: run
//! in `--release`, with `rounds = 3` (each figure is then the median round,
//! the subjects interleaved round by round), and compare ratios measured in
//! the same run rather than absolute rates across runs.
//!
//! The peer crates (rslock, ...) are measured by the separate `peers` binary
//! of this crate (feature `peers`), so their dependencies never reach the
//! library or the CLI.

#[cfg(feature = "cli")]
pub mod args;
mod counter;
pub mod floor;
pub mod held;
pub mod hot;
mod layered;
mod layered_counter;
mod locker;
mod machine;
mod report;
mod scale_report;
mod stats;
mod warm_up;
mod workload;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use counter::{CommandCounter, CommandCounts, CountingBackend, RenewPeaks, command_counter_for};
pub use floor::{Floor, floor_for};
pub use held::{HeldOptions, HeldResult, run_held};
pub use hot::{HotOptions, HotResult, WorkerCommand, run_hot, serve_hot_worker};
pub use layered::{LayeredOptions, LayeredResult, LayeredSubject, run_layered};
pub use locker::{ACQUIRE_LIMIT, FloorGuard, FloorLocker, HoldfastGuard, HoldfastLocker, Locker, Role};
pub use machine::Machine;
pub use report::{BenchReport, LeaseResult, Ratio, WorkloadResult};
pub use stats::{ProbeStats, RateWindow};
pub use workload::{CycleSpec, Mix, run_cycles, run_many_leases};

use holdfast::{Client, ClientOptions, Error, Result};

/// One of the bench's workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// T tasks, each acquiring and releasing its own key.
    Uncontended,
    /// T tasks on one key: acquire with waiting, tiny critical section, release.
    Contended,
    /// As [`Contended`](Self::Contended) with a think time after each release.
    ContendedThink,
    /// One client holding N leases with renewal on.
    ManyLeases,
    /// One client holding N leases with a probe of its other calls
    /// ([`BenchOptions::held`]; not run from [`BenchOptions::workloads`]).
    Held,
    /// W tasks over P processes on one key ([`BenchOptions::hot`]; not run
    /// from [`BenchOptions::workloads`]).
    Hot,
    /// T tasks (default 64) on one semaphore of N permits (default 8), one
    /// permit per cycle.
    Semaphore,
    /// T tasks (default 32) on one read-write lock, one write in ten cycles.
    RwLock,
    /// T tasks (default 64), each taking a read lock of its own key: what a
    /// read-write lock per resource costs where nobody writes (and whether
    /// shares of different keys wait for each other).
    Readers,
}

impl Workload {
    /// The workloads `holdfast bench` runs unless told otherwise, in the order they run.
    pub const ALL: [Workload; 7] = [
        Workload::Uncontended,
        Workload::Contended,
        Workload::ContendedThink,
        Workload::Semaphore,
        Workload::RwLock,
        Workload::Readers,
        Workload::ManyLeases,
    ];

    /// Whether each task has a key of its own (else they share one).
    pub fn own_keys(self) -> bool {
        matches!(self, Workload::Uncontended | Workload::Readers)
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Uncontended => "uncontended",
            Workload::Contended => "contended",
            Workload::ContendedThink => "contended-think",
            Workload::ManyLeases => "many-leases",
            Workload::Held => "held",
            Workload::Hot => "hot",
            Workload::Semaphore => "semaphore",
            Workload::RwLock => "rwlock",
            Workload::Readers => "readers",
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = Error;

    /// Parses `uncontended`, `contended`, `contended-think` (or `think`),
    /// `semaphore`, `rwlock`, `readers`, `many-leases` (or `leases`).
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "uncontended" | "a" => Ok(Workload::Uncontended),
            "contended" | "b" => Ok(Workload::Contended),
            "contended-think" | "think" | "b2" => Ok(Workload::ContendedThink),
            "many-leases" | "leases" | "c" => Ok(Workload::ManyLeases),
            "semaphore" => Ok(Workload::Semaphore),
            "rwlock" | "read-write" => Ok(Workload::RwLock),
            "readers" => Ok(Workload::Readers),
            other => Err(Error::invalid(
                "workload",
                format!(
                    "unknown workload {other:?}; known: uncontended, contended, contended-think, semaphore, rwlock, \
                     readers, many-leases"
                ),
            )),
        }
    }
}

/// What to run. [`BenchOptions::new`] gives the defaults of `holdfast bench`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BenchOptions {
    /// The store URL, as for [`holdfast::Client::connect`].
    pub url: String,
    /// Tasks in [`Workload::Uncontended`] (default 64).
    pub tasks_uncontended: usize,
    /// Tasks in the contended workloads (default 16).
    pub tasks_contended: usize,
    /// Tasks in [`Workload::Semaphore`] (default 64).
    pub tasks_semaphore: usize,
    /// Permits of the semaphore in [`Workload::Semaphore`] (default 8).
    pub permits: u32,
    /// Tasks in [`Workload::RwLock`] (default 32).
    pub tasks_rwlock: usize,
    /// How long each workload runs for each subject (holdfast, floor); default 5 s.
    pub duration: Duration,
    /// Stop a cycle workload after this many cycles even if `duration` has not passed.
    pub max_cycles: Option<u64>,
    /// Think time after each release in [`Workload::ContendedThink`] (default 1 ms).
    pub think_time: Duration,
    /// Leases held in [`Workload::ManyLeases`] (default 10,000).
    pub leases: usize,
    /// TTL of the held leases in [`Workload::ManyLeases`] (default 3 s, so
    /// renewal runs every 1 s; the hold lasts `duration`, at least 3 periods).
    pub lease_ttl: Duration,
    /// Lock TTL in the cycle workloads (default 30 s).
    pub ttl: Duration,
    /// Ask holdfast for fair (FIFO) locks; fails with
    /// [`Error::Unsupported`] on a store that cannot queue.
    pub fair: bool,
    /// Which workloads to run (default: all).
    pub workloads: Vec<Workload>,
    /// Measure the raw floor too (default true) and report ratios.
    pub floor: bool,
    /// Rounds of each (workload, subject), interleaved; the report keeps the
    /// round with the median cycles/s (default 1; use 3 for published figures).
    pub rounds: u32,
    /// Run the `--held N` workload after [`workloads`](Self::workloads) (default: no).
    pub held: Option<HeldOptions>,
    /// Run the `--hot W` workload after [`workloads`](Self::workloads) (default: no).
    pub hot: Option<HotOptions>,
    /// Before everything else, run uncontended, contended, semaphore and
    /// rwlock on holdfast for this long each, unmeasured (default: no), so
    /// that the measured workloads find a store that has served other lock
    /// work, as a production store has (`--warm-up 3s`).
    pub warm_up: Option<Duration>,
}

impl BenchOptions {
    /// The defaults of `holdfast bench` for `url`.
    pub fn new(url: impl Into<String>) -> Self {
        BenchOptions {
            url: url.into(),
            tasks_uncontended: 64,
            tasks_contended: 16,
            tasks_semaphore: 64,
            permits: 8,
            tasks_rwlock: 32,
            duration: Duration::from_secs(5),
            max_cycles: None,
            think_time: Duration::from_millis(1),
            leases: 10_000,
            lease_ttl: Duration::from_secs(3),
            ttl: Duration::from_secs(30),
            fair: false,
            workloads: Workload::ALL.to_vec(),
            floor: true,
            rounds: 1,
            held: None,
            hot: None,
            warm_up: None,
        }
    }

    fn check(&self) -> Result<()> {
        let positive = |what: &'static str, v: usize| {
            if v == 0 { Err(Error::invalid(what, "must be at least 1")) } else { Ok(()) }
        };
        positive("tasks", self.tasks_uncontended)?;
        positive("tasks", self.tasks_contended)?;
        positive("tasks", self.tasks_semaphore)?;
        positive("tasks", self.tasks_rwlock)?;
        positive("permits", self.permits as usize)?;
        positive("leases", self.leases)?;
        positive("rounds", self.rounds as usize)?;
        if self.duration.is_zero() {
            return Err(Error::invalid("duration", "must be above zero"));
        }
        if self.warm_up.is_some_and(|d| d.is_zero()) {
            return Err(Error::invalid("warm-up", "must be above zero"));
        }
        holdfast::LockOptions::check_ttl(self.ttl)?;
        holdfast::LockOptions::check_ttl(self.lease_ttl)?;
        if self.workloads.is_empty() && self.held.is_none() && self.hot.is_none() {
            return Err(Error::invalid("workloads", "name at least one workload"));
        }
        if let Some(w) = self.workloads.iter().find(|w| matches!(w, Workload::Held | Workload::Hot)) {
            return Err(Error::invalid("workloads", format!("{w} runs from its own options (--held N, --hot W)")));
        }
        if let Some(held) = &self.held {
            held.check()?;
        }
        if let Some(hot) = &self.hot {
            hot.check()?;
        }
        Ok(())
    }
}

/// What [`run`] reports while it works, for a progress bar.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ProgressEvent {
    /// A workload started for a subject (`"holdfast"`, `"floor"`).
    Started {
        /// The workload.
        workload: Workload,
        /// Who is measured.
        subject: String,
        /// Its planned duration.
        duration: Duration,
    },
    /// About four times a second while a workload runs.
    Tick {
        /// The workload.
        workload: Workload,
        /// Who is measured.
        subject: String,
        /// Cycles (or leases acquired) so far.
        done: u64,
        /// Time since the workload started.
        elapsed: Duration,
    },
    /// A workload finished for a subject.
    Finished {
        /// The workload.
        workload: Workload,
        /// Who is measured.
        subject: String,
        /// Its cycles per second (leases acquired per second for many-leases).
        per_sec: f64,
    },
}

impl fmt::Display for ProgressEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgressEvent::Started { workload, subject, duration } => {
                write!(f, "{workload} / {subject}: running for {duration:?}")
            }
            ProgressEvent::Tick { workload, subject, done, elapsed } => {
                write!(f, "{workload} / {subject}: {done} after {:.1} s", elapsed.as_secs_f64())
            }
            ProgressEvent::Finished { workload, subject, per_sec } => {
                write!(f, "{workload} / {subject}: {per_sec:.0}/s")
            }
        }
    }
}

/// Runs the selected workloads on holdfast and (with `opts.floor`) on the
/// store's raw floor, interleaved, and reports both with ratios.
///
/// Keys live under a fresh random prefix (`holdfast-bench/<hex>/...`), so
/// runs never meet each other's keys; every lock is released at the end.
/// Fails with [`Error::InvalidInput`] for bad options or URLs,
/// [`Error::Unsupported`] for `fair` on a store that cannot queue, and the
/// store's errors otherwise.
pub async fn run(opts: &BenchOptions, progress: impl Fn(ProgressEvent)) -> Result<BenchReport> {
    opts.check()?;
    let machine = Machine::here();
    let counting = Arc::new(CountingBackend::new(holdfast::stores::connect(&opts.url).await?));
    let client = Client::with_backend(counting.clone(), ClientOptions::default().with_label("holdfast-bench"));
    if opts.fair && !client.capabilities().fair {
        return Err(Error::Unsupported { store: client.store_name(), what: "fair locks" });
    }
    let counter = command_counter_for(&opts.url).await?;
    let floor = if opts.floor && !opts.workloads.is_empty() {
        Some(Arc::new(FloorLocker::new(floor_for(&opts.url).await?).with_ttl(opts.ttl)))
    } else {
        None
    };
    let holdfast = Arc::new(HoldfastLocker::new(client.clone(), opts.ttl, opts.fair));
    let run_id = format!("{:016x}", holdfast::OwnerToken::random().as_u128() as u64);

    let mut results = Vec::new();
    let mut leases = Vec::new();
    let mut notes = Vec::new();
    if let Some(each) = opts.warm_up {
        let prefix = format!("holdfast-bench/{run_id}/warm-up");
        let shared = client.capabilities().shared_leases;
        notes.push(warm_up::warm_up(&holdfast, shared, opts, each, &prefix, &progress).await?);
    }
    for &workload in dedup(&opts.workloads).iter() {
        if workload == Workload::ManyLeases {
            let mut rounds = Vec::new();
            for round in 0..opts.rounds {
                let prefix = format!("holdfast-bench/{run_id}/r{round}");
                rounds.push(run_many_leases(&client, &counting, counter.as_deref(), opts, &prefix, &progress).await?);
            }
            // Later rounds reuse memory the allocator kept from the first,
            // so the memory figure is the largest growth of any round.
            let rss = rounds.iter().filter_map(|r| r.rss_delta_bytes).max();
            let mut median = stats::median_by(rounds, |r| r.acquired_per_sec);
            median.rss_delta_bytes = rss;
            leases.push(median);
            continue;
        }
        let (tasks, mix) = match workload {
            Workload::Uncontended => (opts.tasks_uncontended, Mix::Exclusive),
            Workload::Semaphore => (opts.tasks_semaphore, Mix::Semaphore { permits: opts.permits }),
            Workload::RwLock => (opts.tasks_rwlock, Mix::ReadWrite { write_every: 10 }),
            Workload::Readers => (opts.tasks_uncontended, Mix::Read),
            _ => (opts.tasks_contended, Mix::Exclusive),
        };
        let shares = matches!(workload, Workload::Semaphore | Workload::RwLock | Workload::Readers);
        if shares && !client.capabilities().shared_leases {
            notes.push(format!("{workload}: not run: the {} store has no shared leases yet", client.store_name()));
            continue;
        }
        let floor = floor.as_ref();
        let mut hf_rounds = Vec::new();
        let mut floor_rounds = Vec::new();
        for round in 0..opts.rounds {
            let spec = |subject: &str, mix| CycleSpec::round_of(opts, (workload, tasks, mix), &run_id, round, subject);
            hf_rounds.push(run_cycles(holdfast.clone(), &spec("holdfast", mix), counter.as_deref(), &progress).await?);
            if let Some(floor) = floor {
                let spec = spec("floor", mix);
                floor_rounds.push(run_cycles(floor.clone(), &spec, counter.as_deref(), &progress).await?);
            }
        }
        results.push(stats::median_by(hf_rounds, |r| r.cycles_per_sec));
        if !floor_rounds.is_empty() {
            results.push(stats::median_by(floor_rounds, |r| r.cycles_per_sec));
        }
    }
    let mut report =
        BenchReport::new(opts, client.store_name(), floor.map(|f| f.describe().to_owned()), results, leases);
    report.machine = machine;
    report.notes = notes;
    if let Some(held) = &opts.held {
        let prefix = format!("holdfast-bench/{run_id}/held");
        report.held = Some(run_held(&opts.url, held, counter.as_deref(), &prefix, &progress).await?);
    }
    if let Some(hot) = &opts.hot {
        let key = format!("holdfast-bench/{run_id}/hot");
        report.hot = Some(run_hot(&opts.url, hot, counter.as_deref(), &key, &progress).await?);
    }
    Ok(report)
}

fn dedup(workloads: &[Workload]) -> Vec<Workload> {
    let mut out: Vec<Workload> = Vec::new();
    for w in workloads {
        if !out.contains(w) {
            out.push(*w);
        }
    }
    out
}
