//! The `--held N` workload: one client holds N leases with renewal on, while a
//! probe on the same client times other lock calls (and, with `churn`, other
//! tasks of the same client acquire and release at full speed).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use holdfast::{Client, ClientOptions, Error, MutexGuard, Result};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::counter::{CommandCounter, CountingBackend, snapshot};
use crate::locker::ACQUIRE_LIMIT;
use crate::machine::cpu_time;
use crate::stats::{ProbeStats, RateWindow, histogram, quantile_us, record, rss_bytes};
use crate::{ProgressEvent, Workload};

/// Acquisitions and releases in flight at once while filling and emptying the client.
const CONCURRENCY: usize = 64;
/// Tasks that acquire and release other keys during the hold with `churn`.
const CHURN_TASKS: usize = 16;
/// Keys each churn task cycles through (a bounded set, so that the store's
/// tables do not grow with the run's length).
const CHURN_KEYS: u64 = 1_000;
/// The first and last this many acquisitions are timed apart, to show whether
/// an acquisition costs more with many leases held.
const WINDOW: usize = 1_000;
const TICK: Duration = Duration::from_millis(250);

/// What [`run_held`] does. [`HeldOptions::new`] gives the defaults of `holdfast bench --held N`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldOptions {
    /// Leases held on the one client.
    pub leases: usize,
    /// TTL of every lease (default 6 s; renewal every third of it).
    pub lease_ttl: Duration,
    /// How long the leases are held (default five renewal periods).
    pub duration: Duration,
    /// Acquire and release other keys at full speed on the same client while holding.
    pub churn: bool,
    /// The probe's interval: one try_acquire + release of another key (default 20 ms).
    pub probe_every: Duration,
}

impl HeldOptions {
    /// TTL of the held leases unless told otherwise.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(6);

    /// `leases` leases with the defaults.
    pub fn new(leases: usize) -> Self {
        HeldOptions {
            leases,
            lease_ttl: Self::DEFAULT_TTL,
            duration: Self::default_duration(Self::DEFAULT_TTL),
            churn: false,
            probe_every: Duration::from_millis(20),
        }
    }

    /// The default hold for leases of `ttl`: five renewal periods.
    pub fn default_duration(ttl: Duration) -> Duration {
        ttl / 3 * 5
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.leases == 0 {
            return Err(Error::invalid("held", "hold at least 1 lease"));
        }
        if self.duration.is_zero() {
            return Err(Error::invalid("duration", "must be above zero"));
        }
        if self.probe_every.is_zero() {
            return Err(Error::invalid("probe_every", "must be above zero"));
        }
        holdfast::LockOptions::check_ttl(self.lease_ttl).map(|_| ())
    }

    fn idle_probe(&self) -> Duration {
        self.duration.min(Duration::from_secs(5))
    }
}

/// The figures of the `--held N` workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldResult {
    /// Leases held.
    pub leases: usize,
    /// Their TTL, ms.
    pub lease_ttl_ms: u64,
    /// The renewal period (TTL / 3), ms.
    pub renew_period_ms: u64,
    /// Whether other tasks of the client acquired and released at full speed while holding.
    pub churn: bool,
    /// The probe (try_acquire + release of another key every 20 ms) on the
    /// same client before any lease was held.
    pub idle_probe: ProbeStats,
    /// All acquisitions (64 in flight at once).
    pub acquire: RateWindow,
    /// The first 1,000 acquisitions (half of them below 2,000 leases).
    pub acquire_first: RateWindow,
    /// The last 1,000 acquisitions, with nearly all leases held.
    pub acquire_last: RateWindow,
    /// Leases the client's renewer tracked once all were held.
    pub renewing: usize,
    /// Growth of the process's resident memory while acquiring, bytes.
    pub rss_delta_bytes: Option<i64>,
    /// That growth per held lease, bytes.
    pub rss_per_lease_bytes: Option<f64>,
    /// How long all were held, seconds.
    pub hold_secs: f64,
    /// The probe during the hold, with renewal running.
    pub probe: ProbeStats,
    /// The probe's p99 during the hold over its p99 on the idle client.
    pub probe_p99_over_idle: Option<f64>,
    /// Churn acquire + release cycles completed during the hold.
    pub churn_cycles: Option<u64>,
    /// Those per second.
    pub churn_per_sec: Option<f64>,
    /// Churn cycles that failed.
    pub churn_errors: u64,
    /// Held leases whose guard said `is_lost()` at the end of the hold (must be 0).
    pub lost: usize,
    /// Held leases whose `lost()` resolves at the end of the hold (it fired at
    /// some point: a lost lease stays lost; must be 0).
    pub lost_fired: u64,
    /// `renew` calls during the hold.
    pub renew_calls: u64,
    /// Those per renewal period.
    pub renew_calls_per_period: f64,
    /// Leases named in `renew` calls per renewal period (all held leases if renewal keeps up).
    pub leases_renewed_per_period: f64,
    /// Most leases in one `renew` call during the hold.
    pub largest_renew_batch: u64,
    /// The longest `renew` call during the hold, ms.
    pub longest_renew_ms: f64,
    /// Time in `renew` calls per renewal period, ms (calls that overlap count twice).
    pub renew_busy_ms_per_period: f64,
    /// Client CPU per renewal period during the hold (probe and churn included), ms.
    pub client_cpu_ms_per_period: f64,
    /// Store commands per renewal period during the hold, where the store counts them.
    pub store_commands_per_period: Option<f64>,
    /// Client requests per renewal period during the hold, where the store counts them.
    pub store_requests_per_period: Option<f64>,
    /// Releasing them all (64 in flight at once).
    pub release: RateWindow,
    /// Resident memory given back to the OS after releasing, bytes (the
    /// allocator may keep some).
    pub rss_released_bytes: Option<i64>,
    /// Releases that failed (must be 0).
    pub release_errors: usize,
    /// Of those, releases that found their lease lost.
    pub releases_lost: usize,
    /// The first failed release's error, to say what the others were.
    pub first_release_error: Option<String>,
}

/// A point on the way: when, and how much CPU the process had used.
#[derive(Clone, Copy)]
struct Mark {
    at: Instant,
    cpu: Duration,
}

impl Mark {
    fn now() -> Self {
        Mark { at: Instant::now(), cpu: cpu_time() }
    }

    fn window_to(self, end: Mark, ops: usize) -> RateWindow {
        let secs = end.at.saturating_duration_since(self.at).as_secs_f64();
        let cpu = end.cpu.saturating_sub(self.cpu).as_secs_f64();
        RateWindow {
            ops: ops as u64,
            secs,
            per_sec: ops as f64 / secs.max(1e-9),
            cpu_us_per_op: cpu * 1e6 / (ops.max(1) as f64),
        }
    }
}

/// Runs the `--held N` workload on a fresh client of `url` (its own
/// connection, so that its renewer serves these leases alone):
///
/// 1. the probe runs alone on the idle client for up to 5 s;
/// 2. `opts.leases` leases are acquired, 64 at a time, each under
///    `{prefix}/held/{i}`;
/// 3. they are held for `opts.duration` while the probe (and, with
///    `opts.churn`, 16 tasks acquiring and releasing other keys) runs;
/// 4. they are released, 64 at a time.
///
/// Fails with the first acquire that fails; losses and failed releases are counted.
pub async fn run_held(
    url: &str,
    opts: &HeldOptions,
    counter: Option<&dyn CommandCounter>,
    prefix: &str,
    progress: &impl Fn(ProgressEvent),
) -> Result<HeldResult> {
    opts.check()?;
    let workload = Workload::Held;
    let subject = "holdfast".to_owned();
    let counting = Arc::new(CountingBackend::new(holdfast::stores::connect(url).await?));
    let client = Client::with_backend(counting.clone(), ClientOptions::default().with_label("holdfast-bench-held"));
    let period = opts.lease_ttl / 3;
    let tick = |done: u64, elapsed: Duration| {
        progress(ProgressEvent::Tick { workload, subject: subject.clone(), done, elapsed });
    };
    progress(ProgressEvent::Started { workload, subject: subject.clone(), duration: opts.duration });
    let start = Instant::now();

    let idle_probe = probe_for(&client, format!("{prefix}/probe-idle"), opts, opts.idle_probe()).await?;

    // Fill the client.
    let rss_before = rss_bytes();
    let window = WINDOW.min(opts.leases / 2).max(1);
    let first_mark = Mark::now();
    let (mut after_first, mut before_last) = (first_mark, first_mark);
    let mut acquiring = futures::stream::iter(0..opts.leases)
        .map(|i| {
            let mutex = client.mutex(format!("{prefix}/held/{i}")).ttl(opts.lease_ttl);
            async move { mutex.acquire_timeout(ACQUIRE_LIMIT).await }
        })
        .buffer_unordered(CONCURRENCY);
    let mut guards: Vec<MutexGuard> = Vec::with_capacity(opts.leases);
    let mut last_tick = Instant::now();
    while let Some(guard) = acquiring.next().await {
        guards.push(guard?);
        if guards.len() == window {
            after_first = Mark::now();
        }
        if guards.len() == opts.leases - window {
            before_last = Mark::now();
        }
        if last_tick.elapsed() >= TICK {
            last_tick = Instant::now();
            tick(guards.len() as u64, start.elapsed());
        }
    }
    drop(acquiring);
    let filled = Mark::now();
    let rss_after = rss_bytes();
    let renewing = client.renewing_leases();

    // Hold, with the probe and the churn on the same client.
    let commands_before = snapshot(counter).await?;
    let (renews_before, renewed_before, busy_before) =
        (counting.renews(), counting.renewed_leases(), counting.renew_busy());
    counting.take_renew_peaks();
    let hold_start = Mark::now();
    let stop = CancellationToken::new();
    let probe = tokio::spawn(probe_until(client.clone(), format!("{prefix}/probe"), opts.clone(), stop.clone()));
    let churn_cycles = Arc::new(AtomicU64::new(0));
    let churn_errors = Arc::new(AtomicU64::new(0));
    let churners: Vec<_> = (0..if opts.churn { CHURN_TASKS } else { 0 })
        .map(|t| {
            let (client, stop) = (client.clone(), stop.clone());
            let (cycles, errors) = (churn_cycles.clone(), churn_errors.clone());
            let (prefix, ttl) = (format!("{prefix}/churn/{t}"), opts.lease_ttl);
            tokio::spawn(async move { churn(client, prefix, ttl, stop, cycles, errors).await })
        })
        .collect();
    while hold_start.at.elapsed() < opts.duration {
        tokio::time::sleep(TICK.min(opts.duration.saturating_sub(hold_start.at.elapsed()))).await;
        tick(guards.len() as u64, start.elapsed());
    }
    stop.cancel();
    let probe = probe.await.map_err(|e| Error::backend("holdfast-bench", false, e))??;
    for c in churners {
        c.await.map_err(|e| Error::backend("holdfast-bench", false, e))?;
    }
    let hold_end = Mark::now();
    let held_for = hold_end.at - hold_start.at;
    let peaks = counting.take_renew_peaks();
    let renews = counting.renews() - renews_before;
    let renewed = counting.renewed_leases() - renewed_before;
    let renew_busy = counting.renew_busy().saturating_sub(busy_before);
    let commands_after = snapshot(counter).await?;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    // A lease that was lost at any point stays lost, so one poll of each
    // lost() now tells whether it fired; 100,000 lost() futures watched all
    // along would cost the client more than the renewal it measures.
    let lost_fired = guards.iter().filter(|g| g.lost().now_or_never().is_some()).count() as u64;

    // Empty the client.
    let release_start = Mark::now();
    let rss_held = rss_bytes();
    let mut releasing = futures::stream::iter(guards).map(|g| g.release()).buffer_unordered(CONCURRENCY);
    let (mut release_errors, mut releases_lost, mut first_release_error) = (0usize, 0usize, None);
    while let Some(r) = releasing.next().await {
        if let Err(e) = r {
            release_errors += 1;
            releases_lost += usize::from(matches!(e, Error::Lost { .. }));
            first_release_error.get_or_insert_with(|| e.to_string());
        }
    }
    drop(releasing);
    let release = release_start.window_to(Mark::now(), opts.leases);
    let rss_released = rss_held.zip(rss_bytes()).map(|(held, after)| held as i64 - after as i64);

    let periods = held_for.as_secs_f64() / period.as_secs_f64();
    let per_period = |n: f64| n / periods.max(1e-9);
    let commands = commands_before.zip(commands_after).map(|(b, a)| a.since(&b));
    let rss_delta = rss_before.zip(rss_after).map(|(b, a)| a as i64 - b as i64);
    let churn_cycles = churn_cycles.load(Ordering::Relaxed);
    let result = HeldResult {
        leases: opts.leases,
        lease_ttl_ms: opts.lease_ttl.as_millis() as u64,
        renew_period_ms: period.as_millis() as u64,
        churn: opts.churn,
        probe_p99_over_idle: probe.p99_us.zip(idle_probe.p99_us).map(|(h, i)| h as f64 / i.max(1) as f64),
        idle_probe,
        acquire: first_mark.window_to(filled, opts.leases),
        acquire_first: first_mark.window_to(after_first, window),
        acquire_last: before_last.window_to(filled, window),
        renewing,
        rss_delta_bytes: rss_delta,
        rss_per_lease_bytes: rss_delta.map(|d| d as f64 / opts.leases as f64),
        hold_secs: held_for.as_secs_f64(),
        probe,
        churn_cycles: opts.churn.then_some(churn_cycles),
        churn_per_sec: opts.churn.then(|| churn_cycles as f64 / held_for.as_secs_f64().max(1e-9)),
        churn_errors: churn_errors.load(Ordering::Relaxed),
        lost,
        lost_fired,
        renew_calls: renews,
        renew_calls_per_period: per_period(renews as f64),
        leases_renewed_per_period: per_period(renewed as f64),
        largest_renew_batch: peaks.largest_batch,
        longest_renew_ms: peaks.longest_call.as_secs_f64() * 1e3,
        renew_busy_ms_per_period: per_period(renew_busy.as_secs_f64() * 1e3),
        client_cpu_ms_per_period: per_period(hold_end.cpu.saturating_sub(hold_start.cpu).as_secs_f64() * 1e3),
        store_commands_per_period: commands.as_ref().map(|c| per_period(c.total() as f64)),
        store_requests_per_period: commands.as_ref().map(|c| per_period(c.requests() as f64)),
        release,
        rss_released_bytes: rss_released,
        release_errors,
        releases_lost,
        first_release_error,
    };
    progress(ProgressEvent::Finished { workload, subject, per_sec: result.acquire.per_sec });
    Ok(result)
}

/// The probe for `length`, then its figures.
async fn probe_for(client: &Client, key: String, opts: &HeldOptions, length: Duration) -> Result<ProbeStats> {
    let stop = CancellationToken::new();
    let probe = tokio::spawn(probe_until(client.clone(), key, opts.clone(), stop.clone()));
    tokio::time::sleep(length).await;
    stop.cancel();
    probe.await.map_err(|e| Error::backend("holdfast-bench", false, e))?
}

/// Every `opts.probe_every` (never two at once: a late call delays the next),
/// try_acquire + release of `key`, timed together, until `stop`. A busy key
/// or a failed call is an error of the probe, counted and timed all the same.
async fn probe_until(client: Client, key: String, opts: HeldOptions, stop: CancellationToken) -> Result<ProbeStats> {
    let mutex = client.mutex(key).ttl(opts.lease_ttl);
    let mut hist = histogram()?;
    let mut errors = 0u64;
    let mut ticker = tokio::time::interval(opts.probe_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let t = Instant::now();
        match mutex.try_acquire().await {
            Ok(Some(guard)) => errors += u64::from(guard.release().await.is_err()),
            Ok(None) | Err(_) => errors += 1,
        }
        record(&mut hist, t.elapsed());
    }
    Ok(ProbeStats {
        samples: hist.len(),
        p50_us: quantile_us(&hist, 0.5),
        p99_us: quantile_us(&hist, 0.99),
        max_us: (!hist.is_empty()).then(|| hist.max()),
        errors,
    })
}

/// Acquire + release of `{prefix}/{n % CHURN_KEYS}` in a loop until `stop`.
async fn churn(
    client: Client,
    prefix: String,
    ttl: Duration,
    stop: CancellationToken,
    cycles: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
) {
    let mut n = 0u64;
    while !stop.is_cancelled() {
        let mutex = client.mutex(format!("{prefix}/{}", n % CHURN_KEYS)).ttl(ttl);
        n += 1;
        let cycle = async {
            let guard = mutex.acquire_timeout(ACQUIRE_LIMIT).await?;
            guard.release().await
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            r = cycle => match r {
                Ok(()) => cycles.fetch_add(1, Ordering::Relaxed),
                Err(_) => errors.fetch_add(1, Ordering::Relaxed),
            },
        };
    }
}
