//! The flags of `holdfast bench`, shared with the `peers` binary and the
//! `bench` example (feature `cli`).

use std::time::Duration;

use crate::{BenchOptions, HeldOptions, HotOptions, Workload};

/// Bench options from the command line.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The store URL, e.g. redis://127.0.0.1:6379 or sqlite:///tmp/bench.db.
    #[arg(long = "backend", alias = "url", env = "HOLDFAST_BACKEND", value_name = "URL", hide_env_values = true)]
    pub url: String,
    /// Tasks in the uncontended workload.
    #[arg(long, default_value_t = 64)]
    pub tasks: usize,
    /// Tasks in the contended workloads.
    #[arg(long, default_value_t = 16)]
    pub contended_tasks: usize,
    /// Tasks in the semaphore workload.
    #[arg(long, default_value_t = 64)]
    pub semaphore_tasks: usize,
    /// Permits of the semaphore in the semaphore workload.
    #[arg(long, default_value_t = 8)]
    pub permits: u32,
    /// Tasks in the rwlock workload.
    #[arg(long, default_value_t = 32)]
    pub rwlock_tasks: usize,
    /// How long each workload runs per subject [default: 5s; --held: five
    /// renewal periods; --hot: 20s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Think time after each release in contended-think.
    #[arg(long, default_value = "1ms", value_parser = humantime::parse_duration)]
    pub think: Duration,
    /// Leases held in many-leases.
    #[arg(long, default_value_t = 10_000)]
    pub leases: usize,
    /// TTL of the held leases, renewed every third of it [default: 3s; --held: 6s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub lease_ttl: Option<Duration>,
    /// Hold N leases on one client, with a probe of its other lock calls
    /// every 20 ms, instead of the default workloads.
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub held: Option<usize>,
    /// With --held: 16 more tasks of the same client acquire and release other keys at full speed.
    #[arg(long, requires = "held")]
    pub churn: bool,
    /// W tasks loop acquire, hold, release on one key, instead of the default workloads.
    #[arg(long, value_name = "W", value_parser = at_least_one)]
    pub hot: Option<usize>,
    /// With --hot: split the tasks over P processes.
    #[arg(long, value_name = "P", default_value_t = 1, value_parser = at_least_one, requires = "hot")]
    pub procs: usize,
    /// With --hot: milliseconds inside the lock per acquisition (fractions allowed).
    #[arg(long, value_name = "MS", default_value_t = 0.2, value_parser = hold_ms, requires = "hot")]
    pub hold_ms: f64,
    /// With --hot: the key is a semaphore of N permits, each task taking one (default: a mutex).
    #[arg(long, value_name = "N", value_parser = at_least_one, requires = "hot", conflicts_with = "fair")]
    pub hot_permits: Option<usize>,
    /// Fair (FIFO) locks.
    #[arg(long)]
    pub fair: bool,
    /// Workloads, comma-separated: uncontended, contended, contended-think, semaphore,
    /// rwlock, readers, many-leases [default: all of them, or none with --held or --hot].
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<Workload>,
    /// Rounds per workload and subject, interleaved; the median round is kept.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Skip the raw floor.
    #[arg(long)]
    pub no_floor: bool,
    /// First run uncontended, contended, semaphore and rwlock for this long
    /// each, unmeasured, so the measured workloads find a store that has
    /// served other lock work (scale figures on a fresh store can flatter it).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub warm_up: Option<Duration>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// The bench options these flags ask for. With `--hot` and `--procs`
    /// above 1, set [`HotOptions::worker`] on `opts.hot` before running.
    pub fn options(&self) -> BenchOptions {
        let mut opts = BenchOptions::new(self.url.clone());
        opts.tasks_uncontended = self.tasks;
        opts.tasks_contended = self.contended_tasks;
        opts.tasks_semaphore = self.semaphore_tasks;
        opts.permits = self.permits;
        opts.tasks_rwlock = self.rwlock_tasks;
        if let Some(d) = self.duration {
            opts.duration = d;
        }
        opts.think_time = self.think;
        opts.leases = self.leases;
        if let Some(ttl) = self.lease_ttl {
            opts.lease_ttl = ttl;
        }
        opts.fair = self.fair;
        if !self.workloads.is_empty() {
            opts.workloads = self.workloads.clone();
        } else if self.held.is_some() || self.hot.is_some() {
            opts.workloads.clear();
        }
        opts.rounds = self.rounds;
        opts.floor = !self.no_floor;
        opts.warm_up = self.warm_up;
        opts.held = self.held.map(|n| {
            let mut held = HeldOptions::new(n);
            held.lease_ttl = self.lease_ttl.unwrap_or(HeldOptions::DEFAULT_TTL);
            held.duration = self.duration.unwrap_or_else(|| HeldOptions::default_duration(held.lease_ttl));
            held.churn = self.churn;
            held
        });
        opts.hot = self.hot.map(|w| {
            let mut hot = HotOptions::new(w);
            hot.procs = self.procs;
            hot.hold = Duration::from_secs_f64(self.hold_ms / 1e3);
            if let Some(d) = self.duration {
                hot.duration = d;
            }
            hot.fair = self.fair;
            hot.permits = self.hot_permits.map(|n| u32::try_from(n).unwrap_or(u32::MAX));
            hot
        });
        opts
    }
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a whole number: {e}")),
    }
}

fn hold_ms(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(ms) if ms.is_finite() && (0.0..=60_000.0).contains(&ms) => Ok(ms),
        Ok(_) => Err("must be between 0 and 60000 ms".to_owned()),
        Err(e) => Err(format!("not a number: {e}")),
    }
}
