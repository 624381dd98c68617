//! The flags of `holdfast bench`, shared with the `peers` binary and the
//! `bench` example (feature `cli`).

use std::time::Duration;

use crate::{BenchOptions, Workload};

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
    /// How long each workload runs per subject.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Think time after each release in contended-think.
    #[arg(long, default_value = "1ms", value_parser = humantime::parse_duration)]
    pub think: Duration,
    /// Leases held in many-leases.
    #[arg(long, default_value_t = 10_000)]
    pub leases: usize,
    /// TTL of the held leases (renewal every third of it).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub lease_ttl: Duration,
    /// Fair (FIFO) locks.
    #[arg(long)]
    pub fair: bool,
    /// Workloads, comma-separated: uncontended, contended, contended-think, many-leases.
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<Workload>,
    /// Rounds per workload and subject, interleaved; the median round is kept.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Skip the raw floor.
    #[arg(long)]
    pub no_floor: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// The bench options these flags ask for.
    pub fn options(&self) -> BenchOptions {
        let mut opts = BenchOptions::new(self.url.clone());
        opts.tasks_uncontended = self.tasks;
        opts.tasks_contended = self.contended_tasks;
        opts.duration = self.duration;
        opts.think_time = self.think;
        opts.leases = self.leases;
        opts.lease_ttl = self.lease_ttl;
        opts.fair = self.fair;
        if !self.workloads.is_empty() {
            opts.workloads = self.workloads.clone();
        }
        opts.rounds = self.rounds;
        opts.floor = !self.no_floor;
        opts
    }
}
