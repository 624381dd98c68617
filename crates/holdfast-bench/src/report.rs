//! The bench report: serialisable for `--json`, a table for humans.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::held::HeldResult;
use crate::hot::HotResult;
use crate::machine::Machine;
use crate::{BenchOptions, Workload};

/// The figures of one cycle workload for one subject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadResult {
    /// The workload.
    pub workload: Workload,
    /// Who was measured: `holdfast`, `floor`, or a peer crate's name.
    pub subject: String,
    /// Concurrent tasks.
    pub tasks: usize,
    /// Think time after each release, µs.
    pub think_time_us: u64,
    /// Completed lock cycles (acquire + release).
    pub cycles: u64,
    /// Wall time from start until the last task finished, seconds.
    pub elapsed_secs: f64,
    /// Cycles per second.
    pub cycles_per_sec: f64,
    /// Acquire latency (call to return, waiting included), median, µs.
    pub acquire_p50_us: Option<u64>,
    /// Acquire latency, 99th percentile, µs.
    pub acquire_p99_us: Option<u64>,
    /// Owner switches: consecutive grants to different tasks (contended
    /// workloads only; each is one measured hand-off).
    pub handoffs: Option<u64>,
    /// Hand-off latency (a release returned -> the next acquire of another
    /// task returned; 0 if the acquire returned first), median, µs.
    pub handoff_p50_us: Option<u64>,
    /// Hand-off latency, 99th percentile, µs.
    pub handoff_p99_us: Option<u64>,
    /// Fewest acquisitions of any task (fairness).
    pub per_task_min: u64,
    /// Most acquisitions of any task (fairness).
    pub per_task_max: u64,
    /// Tasks that never acquired (must be 0: no starvation).
    pub tasks_never_acquired: usize,
    /// Times two tasks were seen holding at once (must be 0).
    pub overlaps: u64,
    /// Store commands during the workload by command, where the store counts
    /// them (Redis: `INFO commandstats`, which includes commands run inside
    /// Lua scripts).
    pub store_commands: Option<BTreeMap<String, u64>>,
    /// Store commands per acquisition, where the store counts them.
    pub store_commands_per_acquisition: Option<f64>,
    /// Client requests (round trips) per acquisition, where the store counts
    /// them: store commands less those run inside scripts (see
    /// [`CommandCounts::requests`](crate::CommandCounts::requests)).
    pub store_requests_per_acquisition: Option<f64>,
}

/// The figures of [`Workload::ManyLeases`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseResult {
    /// Who was measured (`holdfast`).
    pub subject: String,
    /// Leases held.
    pub leases: usize,
    /// Time to acquire them all (64 at a time), seconds.
    pub acquire_secs: f64,
    /// Leases acquired per second.
    pub acquired_per_sec: f64,
    /// Leases the client's renewer tracked once all were held.
    pub renewing: usize,
    /// Renewal period (TTL / 3), ms.
    pub renew_period_ms: u64,
    /// How long they were held, seconds.
    pub hold_secs: f64,
    /// `renew` calls holdfast made to the store while holding (each one batch).
    pub renew_calls: u64,
    /// Renewal round trips per renewal period.
    pub renew_calls_per_period: f64,
    /// Renewal round trips per renewal period per 1,000 leases.
    pub renew_calls_per_period_per_1000_leases: f64,
    /// Leases renewed per period (all of them, if renewal keeps up).
    pub leases_renewed_per_period: f64,
    /// Store commands per period while holding, where the store counts them.
    pub store_commands_per_period: Option<f64>,
    /// Client requests per period while holding, where the store counts them.
    pub store_requests_per_period: Option<f64>,
    /// Growth of the process's resident memory (`VmRSS`) while acquiring,
    /// bytes; with several rounds, the largest growth of any round.
    pub rss_delta_bytes: Option<i64>,
    /// Leases lost while held (must be 0).
    pub lost: usize,
    /// Releases that failed at the end (must be 0).
    pub release_errors: usize,
}

/// holdfast's figure over a baseline's, for one workload and metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    /// The workload.
    pub workload: Workload,
    /// The baseline subject (`floor`, or a peer crate).
    pub baseline: String,
    /// The metric (`cycles/s`).
    pub metric: String,
    /// holdfast's value.
    pub holdfast: f64,
    /// The baseline's value.
    pub baseline_value: f64,
    /// `holdfast / baseline_value`.
    pub ratio: f64,
}

/// Everything one bench run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// The store URL, password hidden.
    pub url: String,
    /// The store's name.
    pub store: String,
    /// What the raw floor sends, if it ran.
    pub floor: Option<String>,
    /// Whether holdfast's locks were fair.
    pub fair: bool,
    /// Seconds each workload ran per subject.
    pub duration_secs: f64,
    /// Rounds per (workload, subject); each figure is the median round.
    pub rounds: u32,
    /// CPUs available to this process.
    pub cpus: usize,
    /// The machine, and when the run started.
    #[serde(default)]
    pub machine: Machine,
    /// Cycle workloads, holdfast first, then its baselines.
    pub results: Vec<WorkloadResult>,
    /// The many-leases workload, if it ran.
    pub leases: Vec<LeaseResult>,
    /// holdfast / baseline ratios.
    pub ratios: Vec<Ratio>,
    /// The `--held N` workload, if it ran.
    #[serde(default)]
    pub held: Option<HeldResult>,
    /// The `--hot W` workload, if it ran.
    #[serde(default)]
    pub hot: Option<HotResult>,
    /// Workloads or subjects that did not run, and why.
    #[serde(default)]
    pub notes: Vec<String>,
}

impl BenchReport {
    /// A report of `results`, with ratios computed.
    pub fn new(
        opts: &BenchOptions,
        store: &str,
        floor: Option<String>,
        results: Vec<WorkloadResult>,
        leases: Vec<LeaseResult>,
    ) -> Self {
        let mut report = BenchReport {
            url: holdfast::stores::redact_url(&opts.url),
            store: store.to_owned(),
            floor,
            fair: opts.fair,
            duration_secs: opts.duration.as_secs_f64(),
            rounds: opts.rounds,
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            machine: Machine::here(),
            results,
            leases,
            ratios: Vec::new(),
            held: None,
            hot: None,
            notes: Vec::new(),
        };
        report.compute_ratios();
        report
    }

    /// Adds results of more subjects (peer crates) and recomputes the ratios.
    pub fn add_results(&mut self, results: impl IntoIterator<Item = WorkloadResult>) {
        self.results.extend(results);
        self.compute_ratios();
    }

    /// The result of `subject` on `workload`.
    pub fn result(&self, workload: Workload, subject: &str) -> Option<&WorkloadResult> {
        self.results.iter().find(|r| r.workload == workload && r.subject == subject)
    }

    fn compute_ratios(&mut self) {
        let mut ratios = Vec::new();
        for hf in self.results.iter().filter(|r| r.subject == "holdfast") {
            for base in self.results.iter().filter(|r| r.workload == hf.workload && r.subject != "holdfast") {
                ratios.push(Ratio {
                    workload: hf.workload,
                    baseline: base.subject.clone(),
                    metric: "cycles/s".to_owned(),
                    holdfast: hf.cycles_per_sec,
                    baseline_value: base.cycles_per_sec,
                    ratio: hf.cycles_per_sec / base.cycles_per_sec.max(1e-9),
                });
            }
        }
        self.ratios = ratios;
    }
}

fn us(v: Option<u64>) -> String {
    match v {
        None => "-".to_owned(),
        Some(us) if us >= 10_000 => format!("{:.1}ms", us as f64 / 1000.0),
        Some(us) => format!("{us}µs"),
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "holdfast bench: {} ({}), {}", self.url, self.store, self.machine.summary())?;
        if !self.results.is_empty() || !self.leases.is_empty() {
            writeln!(
                f,
                "{} CPUs, {:.1} s per workload, median of {} round(s){}",
                self.cpus,
                self.duration_secs,
                self.rounds,
                if self.fair { ", fair locks" } else { "" }
            )?;
        }
        if let Some(floor) = &self.floor {
            writeln!(f, "raw floor: {floor}; waiting = 1 ms sleep-poll")?;
        }
        if !self.results.is_empty() {
            writeln!(f)?;
            writeln!(
                f,
                "{:<16} {:<22} {:>5} {:>10} {:>9} {:>9} {:>9} {:>9} {:>12} {:>8} {:>9} {:>8} {:>5}",
                "workload",
                "subject",
                "tasks",
                "cycles/s",
                "acq p50",
                "acq p99",
                "hand p50",
                "hand p99",
                "per task",
                "switches",
                "cmds/acq",
                "req/acq",
                "overl"
            )?;
            for r in &self.results {
                writeln!(
                    f,
                    "{:<16} {:<22} {:>5} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>12} {:>8} {:>9} {:>8} {:>5}",
                    r.workload.name(),
                    r.subject,
                    r.tasks,
                    r.cycles_per_sec,
                    us(r.acquire_p50_us),
                    us(r.acquire_p99_us),
                    us(r.handoff_p50_us),
                    us(r.handoff_p99_us),
                    format!("{}..{}", r.per_task_min, r.per_task_max),
                    r.handoffs.map_or("-".to_owned(), |h| h.to_string()),
                    r.store_commands_per_acquisition.map_or("n/a".to_owned(), |c| format!("{c:.2}")),
                    r.store_requests_per_acquisition.map_or("n/a".to_owned(), |c| format!("{c:.2}")),
                    r.overlaps,
                )?;
            }
        }
        if !self.ratios.is_empty() {
            writeln!(f)?;
            for r in &self.ratios {
                writeln!(
                    f,
                    "{:<16} holdfast/{:<14} {:>6.2}x {} ({:.0} vs {:.0})",
                    r.workload.name(),
                    r.baseline,
                    r.ratio,
                    r.metric,
                    r.holdfast,
                    r.baseline_value
                )?;
            }
        }
        for l in &self.leases {
            writeln!(f)?;
            writeln!(
                f,
                "many-leases: {} leases acquired in {:.2} s ({:.0}/s), {} renewing; held {:.1} s, renewal every {} ms",
                l.leases, l.acquire_secs, l.acquired_per_sec, l.renewing, l.hold_secs, l.renew_period_ms
            )?;
            writeln!(
                f,
                "  renewal round trips per period: {:.2} ({:.3} per 1,000 leases), leases renewed per period: {:.0}, \
                 store commands (requests) per period: {} ({})",
                l.renew_calls_per_period,
                l.renew_calls_per_period_per_1000_leases,
                l.leases_renewed_per_period,
                l.store_commands_per_period.map_or("n/a".to_owned(), |c| format!("{c:.2}")),
                l.store_requests_per_period.map_or("n/a".to_owned(), |c| format!("{c:.2}")),
            )?;
            writeln!(
                f,
                "  client memory for them: {}; lost while held: {}; failed releases: {}",
                l.rss_delta_bytes.map_or("n/a".to_owned(), |b| format!("{:.1} MB", b as f64 / 1e6)),
                l.lost,
                l.release_errors
            )?;
        }
        if let Some(held) = &self.held {
            writeln!(f)?;
            crate::scale_report::write_held(f, held)?;
        }
        if let Some(hot) = &self.hot {
            writeln!(f)?;
            crate::scale_report::write_hot(f, hot)?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use holdfast::stores::redact_url as redact;

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(redact("sqlite:///tmp/a@b.db"), "sqlite:///tmp/a@b.db");
    }
}
