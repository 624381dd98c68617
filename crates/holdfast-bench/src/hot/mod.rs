//! The `--hot W [--procs P] [--hot-permits N]` workload: W tasks, split over
//! P processes, loop acquire (waiting), hold, release on one key: a mutex, or
//! a semaphore of N permits with each task taking one.

mod part;
mod worker;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use holdfast::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::counter::CommandCounter;
use crate::stats::{histogram, quantile_us};
use crate::{ProgressEvent, Workload};

pub use part::{HotPart, PartSpec};
pub use worker::{WorkerCommand, serve_hot_worker};

use part::Prepared;
use worker::Worker;

const TICK: Duration = Duration::from_millis(250);

/// What [`run_hot`] does. [`HotOptions::new`] gives the defaults of `holdfast bench --hot W`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HotOptions {
    /// Tasks on the one key, all processes together.
    pub tasks: usize,
    /// Processes the tasks are split over (default 1: this process). More
    /// than 1 needs [`worker`](Self::worker).
    pub procs: usize,
    /// Time inside the lock per acquisition (default 0.2 ms; spun below 2 ms).
    pub hold: Duration,
    /// How long the tasks run (default 20 s).
    pub duration: Duration,
    /// Lock TTL (default 30 s).
    pub ttl: Duration,
    /// Fair (FIFO) locks.
    pub fair: bool,
    /// The key is a semaphore of this many permits, each task taking one
    /// (default `None`: a mutex).
    pub permits: Option<u32>,
    /// How to start a worker process, for `procs` above 1.
    pub worker: Option<WorkerCommand>,
}

impl HotOptions {
    /// `tasks` tasks in this process, with the defaults.
    pub fn new(tasks: usize) -> Self {
        HotOptions {
            tasks,
            procs: 1,
            hold: Duration::from_micros(200),
            duration: Duration::from_secs(20),
            ttl: Duration::from_secs(30),
            fair: false,
            permits: None,
            worker: None,
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.tasks == 0 {
            return Err(Error::invalid("hot", "run at least 1 task"));
        }
        if self.procs == 0 {
            return Err(Error::invalid("procs", "use at least 1 process"));
        }
        if self.procs > self.tasks {
            return Err(Error::invalid("procs", format!("{} processes for {} tasks", self.procs, self.tasks)));
        }
        if self.procs > 1 && self.worker.is_none() {
            return Err(Error::invalid("procs", "this program cannot start bench worker processes"));
        }
        if self.permits == Some(0) {
            return Err(Error::invalid("hot-permits", "a semaphore needs at least 1 permit"));
        }
        if self.fair && self.permits.is_some() {
            return Err(Error::invalid("hot-permits", "semaphores have no fair mode; drop --fair"));
        }
        if self.duration.is_zero() {
            return Err(Error::invalid("duration", "must be above zero"));
        }
        holdfast::LockOptions::check_ttl(self.ttl).map(|_| ())
    }

    /// The part of process `i`: the tasks split as evenly as they go.
    fn part(&self, url: &str, key: &str, i: usize) -> PartSpec {
        let tasks = self.tasks / self.procs + usize::from(i < self.tasks % self.procs);
        PartSpec {
            url: url.to_owned(),
            key: key.to_owned(),
            tasks,
            hold_us: self.hold.as_micros() as u64,
            ttl_ms: self.ttl.as_millis() as u64,
            fair: self.fair,
            permits: self.permits,
        }
    }
}

/// The figures of the `--hot W` workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HotResult {
    /// Tasks, all processes together.
    pub tasks: usize,
    /// Processes.
    pub procs: usize,
    /// Time inside the lock per acquisition, µs.
    pub hold_us: u64,
    /// Whether the locks were fair.
    pub fair: bool,
    /// The semaphore's permits, or `None` for a mutex.
    #[serde(default)]
    pub permits: Option<u32>,
    /// From the start until every task had stopped, seconds.
    pub elapsed_secs: f64,
    /// Acquisitions, all tasks.
    pub acquisitions: u64,
    /// Acquisitions per second.
    pub per_sec: f64,
    /// Tasks that never acquired (must be 0).
    pub never_acquired: usize,
    /// The longest wait of any task (acquire call to grant, or to the stop
    /// for a wait still running), ms.
    pub longest_wait_ms: f64,
    /// Wait (acquire call to grant), median, µs.
    pub wait_p50_us: Option<u64>,
    /// Wait, 99th percentile, µs.
    pub wait_p99_us: Option<u64>,
    /// Acquisitions of the busiest task.
    pub per_task_max: u64,
    /// Acquisitions of the least busy task.
    pub per_task_min: u64,
    /// Busiest over least busy (none if a task never acquired).
    pub busiest_over_least: Option<f64>,
    /// Share of grants that went to the task that had just released, among
    /// consecutive grants of one process.
    pub reacquired_share: f64,
    /// Times more tasks of one process than the lock admits (one, or the
    /// permits) were inside it at once (must be 0).
    pub overlaps: u64,
    /// Releases that failed (must be 0).
    pub release_errors: u64,
    /// holdfast's calls to the store (`acquire`, `try_acquire`, `release`,
    /// `renew` of its `Backend`) per acquisition; a store may send several
    /// requests for one call.
    pub library_calls_per_acquisition: f64,
    /// Of those, `acquire`/`try_acquire` calls per acquisition.
    pub acquire_calls_per_acquisition: f64,
    /// Client requests (round trips) per acquisition, where the store counts them.
    pub store_requests_per_acquisition: Option<f64>,
    /// Server commands per acquisition (Redis: including those run inside scripts), where the store counts them.
    pub store_commands_per_acquisition: Option<f64>,
    /// Server commands during the run by command, where the store counts them.
    pub store_commands: Option<BTreeMap<String, u64>>,
    /// Client CPU per acquisition, all processes (the store's too for SQLite), µs.
    pub client_cpu_us_per_acquisition: f64,
}

/// Runs the hot-key workload on `key`: in this process for `procs` 1, else
/// in `procs` worker processes started with `opts.worker`, started together.
/// Fails with the first task error, or a worker that fails or dies.
pub async fn run_hot(
    url: &str,
    opts: &HotOptions,
    counter: Option<&dyn CommandCounter>,
    key: &str,
    progress: &impl Fn(ProgressEvent),
) -> Result<HotResult> {
    opts.check()?;
    let (workload, subject) = (Workload::Hot, "holdfast".to_owned());
    let tick = |done: u64, elapsed: Duration| {
        progress(ProgressEvent::Tick { workload, subject: subject.clone(), done, elapsed });
    };
    let snapshot = || crate::counter::snapshot(counter);
    let (parts, before, after, elapsed) = if opts.procs == 1 {
        let prepared = Prepared::new(&opts.part(url, key, 0)).await?;
        let done = prepared.done();
        let before = snapshot().await?;
        progress(ProgressEvent::Started { workload, subject: subject.clone(), duration: opts.duration });
        let start = Instant::now();
        let running = prepared.run(opts.duration);
        tokio::pin!(running);
        let mut ticker = tokio::time::interval(TICK);
        let part = loop {
            tokio::select! {
                part = &mut running => break part?,
                _ = ticker.tick() => tick(done(), start.elapsed()),
            }
        };
        let elapsed = start.elapsed();
        (vec![part], before, snapshot().await?, elapsed)
    } else {
        let command = opts.worker.as_ref().ok_or_else(|| Error::invalid("procs", "no worker command"))?;
        let mut workers = Vec::with_capacity(opts.procs);
        for i in 0..opts.procs {
            workers.push(Worker::spawn(command, i, &opts.part(url, key, i)).await?);
        }
        for w in &mut workers {
            w.ready().await?;
        }
        let before = snapshot().await?;
        progress(ProgressEvent::Started { workload, subject: subject.clone(), duration: opts.duration });
        let start = Instant::now();
        for w in &mut workers {
            w.go(opts.duration).await?;
        }
        let all = futures::future::try_join_all(workers.into_iter().map(Worker::done));
        tokio::pin!(all);
        let mut ticker = tokio::time::interval(TICK);
        // A worker that hangs past its duration plus a minute is a failure, not a hung bench.
        let limit = tokio::time::sleep(opts.duration + Duration::from_secs(60));
        tokio::pin!(limit);
        let parts = loop {
            tokio::select! {
                parts = &mut all => break parts?,
                _ = ticker.tick() => tick(0, start.elapsed()),
                _ = &mut limit => return Err(Error::backend("holdfast-bench", false, "bench workers did not finish")),
            }
        };
        let elapsed = start.elapsed();
        (parts, before, snapshot().await?, elapsed)
    };
    let result = summarise(opts, &parts, before.zip(after).map(|(b, a)| a.since(&b)), elapsed)?;
    progress(ProgressEvent::Finished { workload, subject, per_sec: result.per_sec });
    Ok(result)
}

fn summarise(
    opts: &HotOptions,
    parts: &[HotPart],
    commands: Option<crate::CommandCounts>,
    elapsed: Duration,
) -> Result<HotResult> {
    let per_task: Vec<u64> = parts.iter().flat_map(|p| p.per_task.iter().copied()).collect();
    let total: u64 = per_task.iter().sum();
    let mut waits = histogram()?;
    for (us, count) in parts.iter().flat_map(|p| p.waits.iter().copied()) {
        waits.saturating_record_n(us.max(1), count);
    }
    let sum = |f: fn(&HotPart) -> u64| parts.iter().map(f).sum::<u64>();
    // Grants that had a previous grant in their process to compare with.
    let followers = parts.iter().map(|p| p.acquisitions().saturating_sub(1)).sum::<u64>();
    let per_acq = |n: u64| n as f64 / total.max(1) as f64;
    let (min, max) = (per_task.iter().copied().min().unwrap_or(0), per_task.iter().copied().max().unwrap_or(0));
    Ok(HotResult {
        tasks: opts.tasks,
        procs: opts.procs,
        hold_us: opts.hold.as_micros() as u64,
        fair: opts.fair,
        permits: opts.permits,
        elapsed_secs: elapsed.as_secs_f64(),
        acquisitions: total,
        per_sec: total as f64 / elapsed.as_secs_f64().max(1e-9),
        never_acquired: per_task.iter().filter(|&&n| n == 0).count(),
        longest_wait_ms: parts.iter().map(|p| p.longest_wait_us).max().unwrap_or(0) as f64 / 1e3,
        wait_p50_us: quantile_us(&waits, 0.5),
        wait_p99_us: quantile_us(&waits, 0.99),
        per_task_max: max,
        per_task_min: min,
        busiest_over_least: (min > 0).then(|| max as f64 / min as f64),
        reacquired_share: sum(|p| p.reacquired) as f64 / followers.max(1) as f64,
        overlaps: sum(|p| p.overlaps),
        release_errors: sum(|p| p.release_errors),
        library_calls_per_acquisition: per_acq(sum(|p| p.acquire_calls + p.release_calls + p.renew_calls)),
        acquire_calls_per_acquisition: per_acq(sum(|p| p.acquire_calls)),
        store_requests_per_acquisition: commands.as_ref().map(|c| per_acq(c.requests())),
        store_commands_per_acquisition: commands.as_ref().map(|c| per_acq(c.total())),
        store_commands: commands.map(|c| c.0),
        client_cpu_us_per_acquisition: per_acq(sum(|p| p.cpu_us)),
    })
}
