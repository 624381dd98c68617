//! Waiting for a key: the client's one waiting policy, and the per-key
//! turns, wake-ups and jittered fallback poll shared by the stores that do
//! not queue waiters.
//!
//! # The waiting policy
//!
//! A waiting acquire ([`Mutex::acquire`](crate::Mutex::acquire),
//! [`acquire_timeout`](crate::Mutex::acquire_timeout)) is the same on every
//! store:
//!
//! - It waits until the key is granted, woken by the store's notification,
//!   or until its deadline, when it fails with
//!   [`Error::Timeout`]: the key stayed **busy**.
//! - A transient store failure while waiting (connection lost, failover, the
//!   waiter's own session expired or was revoked) does not end the wait: the
//!   attempt is made again with the same token (the store finds its earlier
//!   grant or queue entry, or queues it anew on a new session, possibly
//!   losing its place in the queue), after a jittered backoff from 50 ms to
//!   1 s.
//! - The store may fail like that for at most
//!   [`ClientOptions::store_retry`](crate::ClientOptions::store_retry)
//!   (default 10 s) in a row; then the acquire fails with the store's error
//!   ([`Error::Backend`]). When the deadline passes
//!   while the store is failing, or before the store has answered at all (a
//!   status read then tells a queued waiter from a silent store), the
//!   acquire also fails with the store's error, not `Timeout`: "busy" and
//!   "store down" stay apart.
//! - A permanent store error (bad credentials, a refused request) ends the
//!   wait at once.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rand::Rng;
use tokio::sync::Notify;
use tracing::Instrument;

use crate::backend::{AcquireRequest, Backend, Grant, LeaseMode};
use crate::vocabulary::error::{Error, Result};

/// The outcome of one acquire attempt made by a waiting loop.
#[derive(Debug)]
pub enum Attempt {
    /// The key was granted.
    Granted(Grant),
    /// The key is busy; `expires_in` is the holder's remaining lease if the
    /// store reported it, so that the next attempt need not come later.
    Busy {
        /// Time left on the holder's lease.
        expires_in: Option<Duration>,
    },
}

/// Bounds of the fallback poll that backs up store notifications.
///
/// A waiter retries after a random delay in `[min, max]`, or when the
/// holder's lease runs out if that comes first, so a missed notification costs
/// at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollBounds {
    /// Shortest delay between attempts.
    pub min: Duration,
    /// Longest delay between attempts.
    pub max: Duration,
}

impl PollBounds {
    /// The delay before the next attempt.
    pub fn next_delay(&self, expires_in: Option<Duration>) -> Duration {
        let jittered = if self.max > self.min {
            crate::vocabulary::entropy::with_rng(|rng| rng.random_range(self.min..=self.max))
        } else {
            self.min
        };
        match expires_in {
            Some(left) => jittered.min(left + Duration::from_millis(1)),
            None => jittered,
        }
    }
}

/// The waiters of one key inside this process: their FIFO turn, and the
/// wake-up of the one whose turn it is.
///
/// Only the waiter holding the turn (the local head) makes store attempts,
/// polls and listens; the others wait for the turn without touching the
/// store. So the store sees one poller per process and key however many
/// tasks wait, and a task of this process is never passed over by a later
/// one of this process: it is at most as many grants behind as there were
/// waiters ahead of it.
#[derive(Debug)]
pub struct KeyWaiters {
    wakeup: Notify,
    /// FIFO (tokio's mutex queues lockers in order); dropping a waiter that
    /// queues for it leaves the queue at once.
    turn: tokio::sync::Mutex<()>,
    /// The turn of a store whose shares may wait side by side
    /// ([`take_lane`]): FIFO as well; a waiter that asks alone takes every
    /// lane.
    lanes: tokio::sync::Semaphore,
    /// Whether the key's shares may take a lane each, as the store last
    /// said ([`LocalWakeups::note_queue`]).
    side_by_side: AtomicBool,
    /// Whether the store's queue of the key last held others beside the
    /// attempt that read it ([`LocalWakeups::note_queue`]).
    crowded: AtomicBool,
}

/// Most shares of one key and process that wait in the store side by side.
pub const MAX_LANES: u32 = 8;

impl Default for KeyWaiters {
    fn default() -> Self {
        KeyWaiters {
            wakeup: Notify::new(),
            turn: tokio::sync::Mutex::new(()),
            lanes: tokio::sync::Semaphore::new(MAX_LANES as usize),
            side_by_side: AtomicBool::new(false),
            crowded: AtomicBool::new(false),
        }
    }
}

impl KeyWaiters {
    /// Whether a waiter of this process holds the turn or queues for it.
    pub fn has_waiters(&self) -> bool {
        self.turn.try_lock().is_err() || self.lanes.available_permits() < MAX_LANES as usize
    }
}

/// Per-key wake-ups and turns for waiters inside this process.
///
/// A release calls [`wake_one`](Self::wake_one): the waiter whose turn it is
/// is woken, no one else. A notification sent while no waiter is parked is
/// kept for the next one, and one sent to a waiter whose future is dropped is
/// passed on (tokio's `Notify` semantics), so none is lost.
#[derive(Debug, Default)]
pub struct LocalWakeups {
    keys: Mutex<HashMap<String, Weak<KeyWaiters>>>,
}

impl LocalWakeups {
    /// The waiters of `key`; keep the handle while waiting.
    pub fn subscribe(&self, key: &str) -> Arc<KeyWaiters> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = keys.get(key).and_then(Weak::upgrade) {
            return n;
        }
        // Prune entries of keys nobody waits on any more, amortised.
        if keys.len() >= 64 && keys.len().is_power_of_two() {
            keys.retain(|_, w| w.strong_count() > 0);
        }
        let n = Arc::new(KeyWaiters::default());
        keys.insert(key.to_owned(), Arc::downgrade(&n));
        n
    }

    /// Wakes the waiter of `key` whose turn it is, if any waits in this process.
    pub fn wake_one(&self, key: &str) {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = keys.get(key).and_then(Weak::upgrade) {
            n.wakeup.notify_one();
        }
    }

    /// What a store's queue of `key` last showed, while a waiter of this
    /// process waits on it: whether the shares that start waiting from now
    /// on may take a lane each ([`take_lane`]) or wait alone, and whether
    /// the queue held others beside the attempt that read it.
    pub fn note_queue(&self, key: &str, side_by_side: bool, crowded: bool) {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = keys.get(key).and_then(Weak::upgrade) {
            n.side_by_side.store(side_by_side, Ordering::Relaxed);
            n.crowded.store(crowded, Ordering::Relaxed);
        }
    }

    /// Whether the store's queue of `key` last held others ([`note_queue`](Self::note_queue)).
    pub fn crowded(&self, key: &str) -> bool {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(key).and_then(Weak::upgrade).is_some_and(|n| n.crowded.load(Ordering::Relaxed))
    }

    /// Whether a waiter of this process waits on `key`.
    pub fn has_waiters(&self, key: &str) -> bool {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(key).and_then(Weak::upgrade).is_some_and(|n| n.has_waiters())
    }
}

/// Attempts until granted, one waiter of the key per process at a time:
/// waits for this task's turn among the key's local waiters, then after each
/// busy attempt waits for a wake-up or the fallback poll delay, whichever
/// comes first.
///
/// A request whose earlier attempt may have been granted already
/// ([`AcquireRequest::retry`]) makes one attempt before queueing, so that a
/// holder retrying after a lost reply is not queued behind the waiters that
/// wait for it. The wake-up is armed **before** each attempt, so a release
/// between a busy attempt and the wait is never missed.
///
/// # Cancel safety
///
/// Cancel-safe between attempts (a task dropped while queued leaves the
/// queue at once, and the turn passes on when the head is dropped); an
/// attempt dropped mid-flight may have been applied, so the caller releases
/// its token (the client does).
pub async fn until_granted<F, Fut>(
    waiters: &KeyWaiters,
    req: &AcquireRequest,
    poll: PollBounds,
    mut attempt: F,
) -> Result<Grant>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Attempt>>,
{
    // A reservation lasts one TTL past the attempt that made it: attempt
    // again well before, however long the store's fallback poll.
    let poll = if req.mode.reserves() {
        let most = req.ttl / 3;
        PollBounds { min: poll.min.min(most), max: poll.max.min(most) }
    } else {
        poll
    };
    if req.retry {
        crate::vocabulary::metrics::note_attempt();
        if let Attempt::Granted(grant) = attempt().await? {
            return Ok(grant);
        }
    }
    let _turn = waiters.turn.lock().await;
    loop {
        let notified = waiters.wakeup.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        crate::vocabulary::metrics::note_attempt();
        match attempt().await? {
            Attempt::Granted(grant) => return Ok(grant),
            Attempt::Busy { expires_in } => {
                crate::vocabulary::metrics::note_busy();
                let delay = poll.next_delay(expires_in);
                tokio::select! {
                    // In the order written, not at random: a seed replays exactly.
                    biased;
                    _ = &mut notified => crate::vocabulary::metrics::note_woken(),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Waits for this task's turn among the key's local waiters, for a store that
/// queues waiters itself (etcd, ZooKeeper): hold the turn for the whole
/// queued acquire.
///
/// The store's queue then holds one entry per process and key (the local
/// head's), not one per waiting task, so what a hand-off costs the store (the
/// sorted range over an etcd prefix, the list of a ZooKeeper node's children)
/// stays flat however many tasks of the process wait. The order stays first
/// come, first served inside the process, and across processes it is the
/// store's queue order of their heads.
///
/// A request whose earlier attempt may hold a place in the store's queue
/// already ([`AcquireRequest::retry`]) gets no turn (`None`) and goes ahead:
/// the local head would be queued behind it in the store while it waited for
/// the head.
///
/// # Cancel safety
///
/// Cancel-safe: a task dropped while queued for the turn leaves the queue at
/// once, and the turn passes on when its holder drops the guard.
pub async fn take_turn<'a>(waiters: &'a KeyWaiters, req: &AcquireRequest) -> Option<tokio::sync::MutexGuard<'a, ()>> {
    if req.retry {
        return None;
    }
    Some(waiters.turn.lock().await)
}

/// [`take_turn`] for a store whose waiting shares may ask side by side:
/// while the store allows it ([`LocalWakeups::note_queue`]), a
/// share takes one of the key's lanes, so that as many shares as the limit
/// admits (at most [`MAX_LANES`]) wait in the store together; otherwise,
/// and for an exclusive request, the waiter takes every lane and asks
/// alone, as [`take_turn`]'s. Lanes are handed out first come, first served,
/// so a waiter that asks alone holds back every later one.
///
/// # Cancel safety
///
/// Cancel-safe: a task dropped while queued for its lanes leaves the queue
/// at once, and the lanes pass on when their holder drops the permit.
pub async fn take_lane<'a>(waiters: &'a KeyWaiters, req: &AcquireRequest) -> Option<tokio::sync::SemaphorePermit<'a>> {
    if req.retry {
        return None;
    }
    let side_by_side = match req.mode {
        LeaseMode::Shared { weight, limit } if waiters.side_by_side.load(Ordering::Relaxed) => {
            (limit / weight.max(1)).clamp(1, MAX_LANES)
        }
        _ => 1,
    };
    // Each takes a whole share of the lanes (rounded up), so that at most
    // `side_by_side` ask together.
    waiters.lanes.acquire_many(MAX_LANES.div_ceil(side_by_side)).await.ok()
}

/// How long a waiting acquire rides out a failing store by default.
pub const DEFAULT_STORE_RETRY: Duration = Duration::from_secs(10);

/// Backoff between attempts while the store fails.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const LAST_BACKOFF: Duration = Duration::from_secs(1);

/// Why a waiting acquire ended without a grant.
#[derive(Debug)]
pub(crate) enum WaitFailure {
    /// The deadline passed while the store answered: the key is busy.
    Deadline,
    /// The store failed (permanently, for too long, or at the deadline).
    Store(Error),
}

/// Waits for `req.key` under the policy in the [module docs](self); also
/// returns how many store calls it made.
///
/// Cancel-safe in the same sense as [`Backend::acquire`]: dropping it leaves
/// the attempt's token to the caller's cleanup.
pub(crate) async fn wait_for_grant(
    backend: &dyn Backend,
    req: &AcquireRequest,
    deadline: Option<tokio::time::Instant>,
    store_retry: Duration,
) -> (std::result::Result<Grant, WaitFailure>, u64) {
    let mut calls = 0;
    let outcome = wait_counting(backend, req, deadline, store_retry, &mut calls).await;
    (outcome, calls)
}

async fn wait_counting(
    backend: &dyn Backend,
    req: &AcquireRequest,
    deadline: Option<tokio::time::Instant>,
    store_retry: Duration,
    calls: &mut u64,
) -> std::result::Result<Grant, WaitFailure> {
    let far = || tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
    let deadline_at = deadline.unwrap_or_else(far);
    // The start of the current run of failed attempts, and its last error.
    let mut failing: Option<(tokio::time::Instant, Error)> = None;
    let mut backoff = FIRST_BACKOFF;
    // Attempts after a failure may find their earlier attempt granted.
    let mut retry_req: Option<AcquireRequest> = None;
    loop {
        let attempt_started = tokio::time::Instant::now();
        let this = retry_req.as_ref().unwrap_or(req);
        *calls += 1;
        let call = tracing::debug_span!("store", store = backend.name(), op = "acquire");
        let outcome = match tokio::time::timeout_at(deadline_at, backend.acquire(this).instrument(call)).await {
            Ok(outcome) => outcome,
            Err(_) => {
                return Err(match failing {
                    Some((_, e)) => WaitFailure::Store(e),
                    None => busy_or_silent(backend, req).await,
                });
            }
        };
        let e = match outcome {
            Ok(grant) => return Ok(grant),
            Err(e) if !e.is_transient() => return Err(WaitFailure::Store(e)),
            Err(e) => e,
        };
        let now = tokio::time::Instant::now();
        // An attempt that waited on a live store longer than the retry budget
        // before failing starts a new run: only failures in a row count.
        let since = match failing.take() {
            Some((since, _)) if now.duration_since(attempt_started) < store_retry => since,
            _ => {
                backoff = FIRST_BACKOFF;
                attempt_started
            }
        };
        if now.duration_since(since) >= store_retry {
            return Err(WaitFailure::Store(e));
        }
        tracing::warn!(key = %req.key, error = %e, "store failed while waiting; trying again");
        crate::vocabulary::metrics::note_transient_error();
        let pause = backoff.mul_f64(crate::vocabulary::entropy::with_rng(|rng| rng.random_range(0.5..1.0)));
        backoff = (backoff * 2).min(LAST_BACKOFF);
        if now + pause >= deadline_at {
            return Err(WaitFailure::Store(e));
        }
        failing = Some((since, e));
        retry_req.get_or_insert_with(|| AcquireRequest { retry: true, ..req.clone() });
        tokio::time::sleep(pause).await;
    }
}

/// How long the store may take, once the deadline has passed, to show it is
/// answering (see [`busy_or_silent`]).
const DEADLINE_PROBE: Duration = Duration::from_secs(2);

/// The deadline passed while an attempt was still waiting for the store. On
/// a store that queues waiters that is the normal way to be busy; on a store
/// that stopped answering before its first reply (a hung server, an
/// unreachable endpoint dialled lazily) it is not, and "busy" would send the
/// caller to try later instead of to the store. One status read tells them
/// apart: answered, the key is busy; failed or silent, the store's error.
async fn busy_or_silent(backend: &dyn Backend, req: &AcquireRequest) -> WaitFailure {
    let call = tracing::debug_span!("store", store = backend.name(), op = "status");
    match tokio::time::timeout(DEADLINE_PROBE, backend.status(&req.key).instrument(call)).await {
        Ok(Ok(_)) => WaitFailure::Deadline,
        Ok(Err(e)) => WaitFailure::Store(e),
        Err(_) => WaitFailure::Store(Error::backend(
            backend.name(),
            true,
            format!(
                "the store did not answer: no reply to the acquire before the deadline, nor to a status read \
                 within {DEADLINE_PROBE:?} after it"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::key::{LockKey, OwnerToken};

    /// A retry is not queued behind the local head: on etcd and ZooKeeper
    /// its earlier entry may be ahead of the head's in the store's queue, so
    /// waiting for the head's turn would deadlock the two. A first attempt
    /// does wait for its turn.
    #[tokio::test]
    async fn a_retry_does_not_wait_for_the_turn() {
        let waiters = LocalWakeups::default().subscribe("k");
        let first = AcquireRequest::new(LockKey::new("k").expect("key"), OwnerToken::random(), Duration::from_secs(1));
        let head = take_turn(&waiters, &first).await.expect("the free turn");
        let later = take_turn(&waiters, &first);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), later).await.is_err(),
            "a first attempt passed the head"
        );
        let retry = AcquireRequest { retry: true, ..first.clone() };
        let skipped = tokio::time::timeout(Duration::from_millis(50), take_turn(&waiters, &retry)).await;
        assert!(matches!(skipped, Ok(None)), "a retry waited for the head's turn");
        drop(head);
    }
}
