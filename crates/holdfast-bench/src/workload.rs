//! The workload runners: lock cycles over any [`Locker`], and many held leases
//! on a holdfast client.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use holdfast::{Client, Error, Result};
use tokio::sync::Barrier;

use crate::counter::{CommandCounter, CountingBackend};
use crate::locker::{ACQUIRE_LIMIT, Locker, Role};
use crate::report::{LeaseResult, WorkloadResult};
use crate::stats::{histogram, quantile_us, record, rss_bytes};
use crate::{BenchOptions, ProgressEvent, Workload};

const TICK: Duration = Duration::from_millis(250);

/// One run of a cycle workload ([`Workload::Uncontended`], [`Workload::Contended`],
/// [`Workload::ContendedThink`]) for one subject.
#[derive(Debug, Clone)]
pub struct CycleSpec {
    /// Which workload: uncontended and readers give each task its own key, the others share one.
    pub workload: Workload,
    /// Who is measured, for the report (`holdfast`, `floor`, `rslock`, ...).
    pub subject: String,
    /// Concurrent tasks.
    pub tasks: usize,
    /// How long tasks keep starting new cycles.
    pub duration: Duration,
    /// Stop after this many cycles in all, if sooner.
    pub max_cycles: Option<u64>,
    /// Sleep after each release (zero: none).
    pub think_time: Duration,
    /// Keys are `{key_prefix}/{task}` (own keys) or `{key_prefix}/shared`.
    pub key_prefix: String,
    /// What each cycle asks for.
    pub mix: Mix,
}

impl CycleSpec {
    /// Round `round` of `workload` for `subject`, as `opts` asks (duration,
    /// cycle cap, think time for `contended-think`), with its keys under
    /// `holdfast-bench/{run_id}/r{round}/{subject}/{workload}`, apart from
    /// every other round's and subject's.
    pub fn round_of(
        opts: &BenchOptions,
        (workload, tasks, mix): (Workload, usize, Mix),
        run_id: &str,
        round: u32,
        subject: &str,
    ) -> Self {
        CycleSpec {
            workload,
            subject: subject.to_owned(),
            tasks,
            duration: opts.duration,
            max_cycles: opts.max_cycles,
            think_time: if workload == Workload::ContendedThink { opts.think_time } else { Duration::ZERO },
            key_prefix: format!("holdfast-bench/{run_id}/r{round}/{subject}/{workload}"),
            mix,
        }
    }
}

/// What the cycles of a workload ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// The key alone, every cycle.
    Exclusive,
    /// One permit of a semaphore of `permits`, every cycle.
    Semaphore {
        /// The permit count.
        permits: u32,
    },
    /// A read share, every cycle.
    Read,
    /// A read share, and the write side once in `write_every` cycles.
    ReadWrite {
        /// One write in this many cycles (10: 10% writes).
        write_every: u32,
    },
}

impl Mix {
    /// The role of cycle `n` of task `task`.
    fn role(self, task: usize, n: u64) -> Role {
        match self {
            Mix::Exclusive => Role::Exclusive,
            Mix::Semaphore { permits } => Role::Permit { permits },
            Mix::Read => Role::Read,
            Mix::ReadWrite { write_every } => {
                let every = u64::from(write_every.max(1));
                if (task as u64 + n) % every == 0 { Role::Write } else { Role::Read }
            }
        }
    }
}

struct Shared {
    stop: AtomicBool,
    claimed: AtomicU64,
    done: AtomicU64,
    /// 0: nobody in the critical section alone; else the task id + 1.
    holder: AtomicUsize,
    /// Holders of shares (permits, readers) inside now.
    sharing: AtomicU64,
    overlaps: AtomicU64,
}

impl Shared {
    /// The critical section of a shared key for `role`: enter, check that
    /// nobody is inside who must not be, leave.
    fn critical_section(&self, id: usize, role: Role) {
        let overlap = || {
            self.overlaps.fetch_add(1, Ordering::Relaxed);
        };
        match role {
            Role::Exclusive | Role::Write => {
                if self.holder.swap(id + 1, Ordering::SeqCst) != 0 || self.sharing.load(Ordering::SeqCst) != 0 {
                    overlap();
                }
                if self.holder.compare_exchange(id + 1, 0, Ordering::AcqRel, Ordering::Acquire).is_err() {
                    overlap();
                }
            }
            Role::Permit { permits } => {
                if self.sharing.fetch_add(1, Ordering::SeqCst) >= u64::from(permits) {
                    overlap();
                }
                self.sharing.fetch_sub(1, Ordering::SeqCst);
            }
            Role::Read => {
                self.sharing.fetch_add(1, Ordering::SeqCst);
                if self.holder.load(Ordering::SeqCst) != 0 {
                    overlap();
                }
                self.sharing.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// One finished lock cycle of one task.
struct Cycle {
    task: usize,
    /// The acquire call returned.
    acquired: Instant,
    /// The release call was about to be sent.
    releasing: Instant,
    /// The release call returned.
    released: Instant,
}

struct TaskOutcome {
    acquire: hdrhistogram::Histogram<u64>,
    cycles: Vec<Cycle>,
    count: u64,
}

async fn cycle_task<L: Locker>(
    locker: Arc<L>,
    id: usize,
    key: String,
    shared: Arc<Shared>,
    spec: Arc<CycleSpec>,
    barrier: Arc<Barrier>,
) -> Result<TaskOutcome> {
    let contended = !spec.workload.own_keys();
    let mut out = TaskOutcome { acquire: histogram()?, cycles: Vec::new(), count: 0 };
    barrier.wait().await;
    let fail = |e: Error| {
        shared.stop.store(true, Ordering::Relaxed);
        e
    };
    while !shared.stop.load(Ordering::Relaxed) {
        if let Some(max) = spec.max_cycles {
            if shared.claimed.fetch_add(1, Ordering::Relaxed) >= max {
                break;
            }
        }
        let role = spec.mix.role(id, out.count);
        let t0 = Instant::now();
        let guard = locker.acquire_as(&key, role).await.map_err(fail)?;
        let acquired = Instant::now();
        // (Uncontended tasks each have their own key.)
        if contended {
            shared.critical_section(id, role);
        }
        let releasing = Instant::now();
        locker.release(guard).await.map_err(fail)?;
        let released = Instant::now();
        record(&mut out.acquire, acquired - t0);
        // Hand-offs only mean something when one task holds at a time.
        if contended && spec.mix == Mix::Exclusive {
            out.cycles.push(Cycle { task: id, acquired, releasing, released });
        }
        out.count += 1;
        shared.done.fetch_add(1, Ordering::Relaxed);
        if !spec.think_time.is_zero() {
            tokio::time::sleep(spec.think_time).await;
        }
    }
    Ok(out)
}

/// Runs one cycle workload on `locker` and measures it. Fails with the first
/// error any task met (the other tasks stop at their next cycle).
pub async fn run_cycles<L: Locker>(
    locker: Arc<L>,
    spec: &CycleSpec,
    counter: Option<&dyn CommandCounter>,
    progress: &impl Fn(ProgressEvent),
) -> Result<WorkloadResult> {
    let spec = Arc::new(spec.clone());
    let contended = !spec.workload.own_keys();
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        claimed: AtomicU64::new(0),
        done: AtomicU64::new(0),
        holder: AtomicUsize::new(0),
        sharing: AtomicU64::new(0),
        overlaps: AtomicU64::new(0),
    });
    let barrier = Arc::new(Barrier::new(spec.tasks + 1));
    let mut handles = Vec::with_capacity(spec.tasks);
    for id in 0..spec.tasks {
        let key = if contended { format!("{}/shared", spec.key_prefix) } else { format!("{}/{id}", spec.key_prefix) };
        let task = cycle_task(locker.clone(), id, key, shared.clone(), spec.clone(), barrier.clone());
        handles.push(tokio::spawn(task));
    }
    let commands_before = match counter {
        Some(c) => Some(c.snapshot().await?),
        None => None,
    };
    progress(ProgressEvent::Started {
        workload: spec.workload,
        subject: spec.subject.clone(),
        duration: spec.duration,
    });
    barrier.wait().await;
    let start = Instant::now();
    let deadline = tokio::time::Instant::from_std(start + spec.duration);
    let mut all = futures::future::join_all(handles);
    let mut ticker = tokio::time::interval(TICK);
    let joined = loop {
        tokio::select! {
            joined = &mut all => break joined,
            _ = tokio::time::sleep_until(deadline), if !shared.stop.load(Ordering::Relaxed) => {
                shared.stop.store(true, Ordering::Relaxed);
            }
            _ = ticker.tick() => progress(ProgressEvent::Tick {
                workload: spec.workload,
                subject: spec.subject.clone(),
                done: shared.done.load(Ordering::Relaxed),
                elapsed: start.elapsed(),
            }),
        }
    };
    let elapsed = start.elapsed();
    let commands_after = match counter {
        Some(c) => Some(c.snapshot().await?),
        None => None,
    };

    let mut acquire = histogram()?;
    let mut cycles = Vec::new();
    let mut per_task = Vec::with_capacity(spec.tasks);
    let mut first_error = None;
    for j in joined {
        match j {
            Ok(Ok(out)) => {
                acquire.add(&out.acquire).map_err(|e| Error::backend("holdfast-bench", false, e))?;
                per_task.push(out.count);
                cycles.extend(out.cycles);
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(join) => {
                first_error.get_or_insert(Error::backend("holdfast-bench", false, join));
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }

    let total: u64 = per_task.iter().sum();
    let mut overlaps = shared.overlaps.load(Ordering::Relaxed);
    let (mut handoff, mut switches) = (histogram()?, 0u64);
    let exclusive = contended && spec.mix == Mix::Exclusive;
    if exclusive {
        cycles.sort_by_key(|c| c.acquired);
        for pair in cycles.windows(2) {
            let (prev, next) = (&pair[0], &pair[1]);
            if next.acquired < prev.releasing {
                overlaps += 1;
            }
            if next.task != prev.task {
                switches += 1;
                record(&mut handoff, next.acquired.saturating_duration_since(prev.released));
            }
        }
    }
    let commands = commands_before.zip(commands_after).map(|(b, a)| a.since(&b));
    let per_acq = |n: u64| n as f64 / total.max(1) as f64;
    let result = WorkloadResult {
        workload: spec.workload,
        subject: spec.subject.clone(),
        tasks: spec.tasks,
        think_time_us: spec.think_time.as_micros() as u64,
        cycles: total,
        elapsed_secs: elapsed.as_secs_f64(),
        cycles_per_sec: total as f64 / elapsed.as_secs_f64().max(1e-9),
        acquire_p50_us: quantile_us(&acquire, 0.5),
        acquire_p99_us: quantile_us(&acquire, 0.99),
        handoffs: exclusive.then_some(switches),
        handoff_p50_us: quantile_us(&handoff, 0.5),
        handoff_p99_us: quantile_us(&handoff, 0.99),
        per_task_min: per_task.iter().copied().min().unwrap_or(0),
        per_task_max: per_task.iter().copied().max().unwrap_or(0),
        tasks_never_acquired: per_task.iter().filter(|&&n| n == 0).count(),
        overlaps,
        store_commands_per_acquisition: commands.as_ref().map(|c| per_acq(c.total())),
        store_requests_per_acquisition: commands.as_ref().map(|c| per_acq(c.requests())),
        store_commands: commands.map(|c| c.0),
    };
    progress(ProgressEvent::Finished {
        workload: spec.workload,
        subject: spec.subject.clone(),
        per_sec: result.cycles_per_sec,
    });
    Ok(result)
}

/// Runs [`Workload::ManyLeases`]: `opts.leases` leases with TTL
/// `opts.lease_ttl` acquired on `client` (64 at a time), held with renewal
/// for `opts.duration` (at least three renewal periods), then released.
/// `counting` must be the backend under `client`.
pub async fn run_many_leases(
    client: &Client,
    counting: &CountingBackend,
    counter: Option<&dyn CommandCounter>,
    opts: &BenchOptions,
    prefix: &str,
    progress: &impl Fn(ProgressEvent),
) -> Result<LeaseResult> {
    const CONCURRENCY: usize = 64;
    let workload = Workload::ManyLeases;
    let subject = "holdfast".to_owned();
    let period = opts.lease_ttl / 3;
    let hold = opts.duration.max(period * 3);
    progress(ProgressEvent::Started { workload, subject: subject.clone(), duration: hold });
    let renewing_before = client.renewing_leases();
    let rss_before = rss_bytes();
    let start = Instant::now();
    let mut acquiring = futures::stream::iter(0..opts.leases)
        .map(|i| {
            let mutex = client.mutex(format!("{prefix}/lease/{i}")).ttl(opts.lease_ttl);
            async move { mutex.acquire_timeout(ACQUIRE_LIMIT).await }
        })
        .buffer_unordered(CONCURRENCY);
    let mut guards = Vec::with_capacity(opts.leases);
    let mut last_tick = Instant::now();
    while let Some(guard) = acquiring.next().await {
        guards.push(guard?);
        if last_tick.elapsed() >= TICK {
            last_tick = Instant::now();
            let (done, elapsed) = (guards.len() as u64, start.elapsed());
            progress(ProgressEvent::Tick { workload, subject: subject.clone(), done, elapsed });
        }
    }
    drop(acquiring);
    let acquire_secs = start.elapsed().as_secs_f64();
    let rss_after = rss_bytes();
    let renewing = client.renewing_leases().saturating_sub(renewing_before);

    let commands_before = match counter {
        Some(c) => Some(c.snapshot().await?),
        None => None,
    };
    let (renews_before, renewed_before) = (counting.renews(), counting.renewed_leases());
    let hold_start = Instant::now();
    while hold_start.elapsed() < hold {
        tokio::time::sleep(TICK.min(hold.saturating_sub(hold_start.elapsed()))).await;
        let (done, elapsed) = (guards.len() as u64, start.elapsed());
        progress(ProgressEvent::Tick { workload, subject: subject.clone(), done, elapsed });
    }
    let held_for = hold_start.elapsed();
    let (renews, renewed) = (counting.renews() - renews_before, counting.renewed_leases() - renewed_before);
    let commands_after = match counter {
        Some(c) => Some(c.snapshot().await?),
        None => None,
    };
    let lost = guards.iter().filter(|g| g.is_lost()).count();

    let mut releasing = futures::stream::iter(guards).map(|g| g.release()).buffer_unordered(CONCURRENCY);
    let mut release_errors = 0usize;
    while let Some(r) = releasing.next().await {
        if r.is_err() {
            release_errors += 1;
        }
    }

    let periods = held_for.as_secs_f64() / period.as_secs_f64();
    let per_period = renews as f64 / periods;
    let store_commands = commands_before.zip(commands_after).map(|(b, a)| a.since(&b));
    let result = LeaseResult {
        subject,
        leases: opts.leases,
        acquire_secs,
        acquired_per_sec: opts.leases as f64 / acquire_secs.max(1e-9),
        renewing,
        renew_period_ms: period.as_millis() as u64,
        hold_secs: held_for.as_secs_f64(),
        renew_calls: renews,
        renew_calls_per_period: per_period,
        renew_calls_per_period_per_1000_leases: per_period * 1000.0 / opts.leases as f64,
        leases_renewed_per_period: renewed as f64 / periods,
        store_commands_per_period: store_commands.as_ref().map(|c| c.total() as f64 / periods),
        store_requests_per_period: store_commands.as_ref().map(|c| c.requests() as f64 / periods),
        rss_delta_bytes: rss_before.zip(rss_after).map(|(b, a)| a as i64 - b as i64),
        lost,
        release_errors,
    };
    progress(ProgressEvent::Finished { workload, subject: result.subject.clone(), per_sec: result.acquired_per_sec });
    Ok(result)
}
