//! The hot-key tasks of one process: prepared (connected, tasks spawned and
//! waiting), started together, stopped together, and summed up in a
//! [`HotPart`] that crosses process boundaries as JSON.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error, GuardKind, Lock, LockOptions, Result};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::counter::CountingBackend;
use crate::machine::cpu_time;
use crate::stats::{histogram, record};

/// Holds shorter than this are spun (tokio's timer sleeps at least 1 ms).
const SPIN_BELOW: Duration = Duration::from_millis(2);

/// What one process's tasks do: the part of a hot-key run it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartSpec {
    /// The store URL.
    pub url: String,
    /// The one key all tasks of all processes take.
    pub key: String,
    /// Tasks in this process.
    pub tasks: usize,
    /// Time inside the lock per acquisition, µs.
    pub hold_us: u64,
    /// Lock TTL, ms.
    pub ttl_ms: u64,
    /// Fair (FIFO) locks.
    pub fair: bool,
    /// A semaphore of this many permits, each task taking one; `None`: a mutex.
    #[serde(default)]
    pub permits: Option<u32>,
}

/// What one process's tasks did. Every count is this process's alone.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HotPart {
    /// Acquisitions of each task.
    pub per_task: Vec<u64>,
    /// Every finished wait (acquire call to grant), as (µs, count) pairs of a histogram.
    pub waits: Vec<(u64, u64)>,
    /// The longest wait, µs, including waits still running at the stop.
    pub longest_wait_us: u64,
    /// Grants whose previous grant in this process went to the same task
    /// (the task that had just released took the key again).
    pub reacquired: u64,
    /// Times more tasks of this process than the lock admits were inside it at once (must be 0).
    pub overlaps: u64,
    /// Releases that failed.
    pub release_errors: u64,
    /// holdfast's `acquire`/`try_acquire` calls to the store.
    pub acquire_calls: u64,
    /// holdfast's `release` calls to the store.
    pub release_calls: u64,
    /// holdfast's `renew` calls to the store.
    pub renew_calls: u64,
    /// CPU time this process used while the tasks ran, µs.
    pub cpu_us: u64,
    /// From start to the last task's end, µs.
    pub elapsed_us: u64,
}

impl HotPart {
    /// Acquisitions of all tasks.
    pub fn acquisitions(&self) -> u64 {
        self.per_task.iter().sum()
    }
}

struct Shared {
    /// Tasks inside the lock now.
    inside: AtomicU64,
    /// How many the lock admits at once: 1, or the semaphore's permits.
    admits: u64,
    /// The task id + 1 of the previous grant in this process.
    last: AtomicUsize,
    reacquired: AtomicU64,
    overlaps: AtomicU64,
    release_errors: AtomicU64,
    done: AtomicU64,
}

struct TaskOutcome {
    count: u64,
    waits: hdrhistogram::Histogram<u64>,
    longest: Duration,
}

/// One process's tasks, connected and waiting for [`Prepared::run`].
pub(crate) struct Prepared {
    counting: Arc<CountingBackend>,
    tasks: Vec<JoinHandle<Result<TaskOutcome>>>,
    go: CancellationToken,
    stop: CancellationToken,
    shared: Arc<Shared>,
    /// Keeps the client (and its renewer) alive while the tasks run.
    _client: Client,
}

impl Prepared {
    /// Connects to the store and spawns the tasks, waiting for the start.
    pub(crate) async fn new(spec: &PartSpec) -> Result<Self> {
        let counting = Arc::new(CountingBackend::new(holdfast::stores::connect(&spec.url).await?));
        let client = Client::with_backend(counting.clone(), ClientOptions::default().with_label("holdfast-bench-hot"));
        if spec.fair && !client.capabilities().fair {
            return Err(Error::Unsupported { store: client.store_name(), what: "fair locks" });
        }
        if spec.permits.is_some() && !client.capabilities().shared_leases {
            return Err(Error::Unsupported { store: client.store_name(), what: "semaphores (--hot-permits)" });
        }
        let mut options = LockOptions::with_ttl(Duration::from_millis(spec.ttl_ms));
        options.fair = spec.fair;
        let (go, stop) = (CancellationToken::new(), CancellationToken::new());
        let shared = Arc::new(Shared {
            inside: AtomicU64::new(0),
            admits: spec.permits.map_or(1, u64::from),
            last: AtomicUsize::new(0),
            reacquired: AtomicU64::new(0),
            overlaps: AtomicU64::new(0),
            release_errors: AtomicU64::new(0),
            done: AtomicU64::new(0),
        });
        let hold = Duration::from_micros(spec.hold_us);
        let tasks = (0..spec.tasks)
            .map(|id| {
                let (go, stop, shared) = (go.clone(), stop.clone(), shared.clone());
                match spec.permits {
                    None => spawn_task(
                        client.mutex_with_options(spec.key.clone(), options.clone()),
                        id,
                        hold,
                        go,
                        stop,
                        shared,
                    ),
                    Some(permits) => spawn_task(
                        client.semaphore(spec.key.clone(), permits).ttl(options.ttl),
                        id,
                        hold,
                        go,
                        stop,
                        shared,
                    ),
                }
            })
            .collect();
        Ok(Prepared { counting, tasks, go, stop, shared, _client: client })
    }

    /// Acquisitions so far, all tasks.
    pub(crate) fn done(&self) -> Arc<impl Fn() -> u64 + Send + Sync + 'static> {
        let shared = self.shared.clone();
        Arc::new(move || shared.done.load(Ordering::Relaxed))
    }

    /// Starts the tasks, stops them after `duration` (a task waiting for the
    /// key stops waiting; the holder releases first), and sums them up.
    pub(crate) async fn run(self, duration: Duration) -> Result<HotPart> {
        let (acq0, rel0, ren0) = (self.counting.acquires(), self.counting.releases(), self.counting.renews());
        let (cpu0, start) = (cpu_time(), Instant::now());
        self.go.cancel();
        tokio::time::sleep(duration).await;
        self.stop.cancel();
        let mut part = HotPart::default();
        let mut waits = histogram()?;
        let mut first_error = None;
        for task in self.tasks {
            match task.await {
                Ok(Ok(out)) => {
                    part.per_task.push(out.count);
                    waits.add(&out.waits).map_err(|e| Error::backend("holdfast-bench", false, e))?;
                    part.longest_wait_us = part.longest_wait_us.max(out.longest.as_micros() as u64);
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
        part.elapsed_us = start.elapsed().as_micros() as u64;
        part.cpu_us = cpu_time().saturating_sub(cpu0).as_micros() as u64;
        part.waits = waits.iter_recorded().map(|v| (v.value_iterated_to(), v.count_at_value())).collect();
        part.reacquired = self.shared.reacquired.load(Ordering::Relaxed);
        part.overlaps = self.shared.overlaps.load(Ordering::Relaxed);
        part.release_errors = self.shared.release_errors.load(Ordering::Relaxed);
        part.acquire_calls = self.counting.acquires() - acq0;
        part.release_calls = self.counting.releases() - rel0;
        part.renew_calls = self.counting.renews() - ren0;
        Ok(part)
    }
}

/// Spawns [`hot_task`] on `lock`, started by `go`.
fn spawn_task<K: GuardKind>(
    lock: Lock<K>,
    id: usize,
    hold: Duration,
    go: CancellationToken,
    stop: CancellationToken,
    shared: Arc<Shared>,
) -> JoinHandle<Result<TaskOutcome>> {
    tokio::spawn(async move {
        go.cancelled().await;
        hot_task(lock, id, hold, stop, shared).await
    })
}

/// Acquire (waiting), hold, release, until `stop`. A wait cut short by the
/// stop counts towards the longest wait: a task that never gets the key
/// reports the whole run as its wait.
async fn hot_task<K: GuardKind>(
    lock: Lock<K>,
    id: usize,
    hold: Duration,
    stop: CancellationToken,
    shared: Arc<Shared>,
) -> Result<TaskOutcome> {
    let mut out = TaskOutcome { count: 0, waits: histogram()?, longest: Duration::ZERO };
    let me = id + 1;
    while !stop.is_cancelled() {
        let asked = Instant::now();
        let guard = tokio::select! {
            biased;
            _ = stop.cancelled() => {
                out.longest = out.longest.max(asked.elapsed());
                break;
            }
            guard = lock.acquire() => guard?,
        };
        let waited = asked.elapsed();
        record(&mut out.waits, waited);
        out.longest = out.longest.max(waited);
        if shared.inside.fetch_add(1, Ordering::AcqRel) >= shared.admits {
            shared.overlaps.fetch_add(1, Ordering::Relaxed);
        }
        if shared.last.swap(me, Ordering::AcqRel) == me {
            shared.reacquired.fetch_add(1, Ordering::Relaxed);
        }
        hold_for(hold).await;
        shared.inside.fetch_sub(1, Ordering::AcqRel);
        if guard.release().await.is_err() {
            shared.release_errors.fetch_add(1, Ordering::Relaxed);
        }
        out.count += 1;
        shared.done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(out)
}

/// Stays inside the lock for `hold`: spinning below 2 ms, where tokio's
/// timer would round up to a millisecond or more.
async fn hold_for(hold: Duration) {
    if hold.is_zero() {
        return;
    }
    if hold >= SPIN_BELOW {
        tokio::time::sleep(hold).await;
        return;
    }
    let until = Instant::now() + hold;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}
