//! The renewal task of one client: it keeps every lease the client holds in
//! a schedule ordered by the lease's next event (its next renewal, or its
//! deadline if it is not renewed), so that finding what is due and when to
//! wake next costs O(log N) per lease handled, never a scan of every lease.
//! Due leases go to the store in [`Backend::renew`] calls of at most the
//! store's slice, a few in flight at once.

use std::collections::{BTreeSet, HashMap};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::state::LeaseState;
use super::ticks::{Epoch, Tick};
use crate::backend::{Backend, RenewRequest};
use crate::lease::release::Release;
use crate::vocabulary::metrics::{LostCause, Op, StoreCounters};

/// One lease in the renewal table: 40 bytes (instants as [`Tick`]s, the
/// period in nanoseconds), since a client may hold 100,000.
struct Entry {
    lease: Arc<LeaseState>,
    /// The renewal period in nanoseconds; `None` for a lease that is not
    /// renewed (renewal off, or the guard leaked): it lasts one TTL.
    interval: Option<NonZeroU64>,
    next_renew: Tick,
    renew_until: Option<Tick>,
    /// The entry's place in the schedule; `None` while a renewal of it is in
    /// flight (the reply puts it back).
    scheduled: Option<Tick>,
}

impl Entry {
    /// The period of a lease renewed every `interval` (none if `None`; a
    /// zero period is one nanosecond, a period past 584 years none).
    fn period(interval: Option<Duration>) -> Option<NonZeroU64> {
        let nanos = u64::try_from(interval?.as_nanos()).ok()?;
        Some(NonZeroU64::new(nanos).unwrap_or(NonZeroU64::MIN))
    }

    /// The next renewal, if the lease is still renewed at all.
    fn next_renewal(&self) -> Option<(Tick, Duration)> {
        let interval = Duration::from_nanos(self.interval?.get());
        let capped = self.renew_until.is_some_and(|until| self.next_renew > until);
        (!capped).then_some((self.next_renew, interval))
    }

    /// When the task must next look at this lease.
    fn next_event(&self, epoch: Epoch) -> Tick {
        self.next_renewal().map_or_else(|| epoch.tick(self.lease.valid_until()), |(at, _)| at)
    }
}

struct Entries {
    /// What the table's instants count from.
    epoch: Epoch,
    leases: HashMap<u64, Entry>,
    /// Every lease not in flight, by its next event.
    schedule: BTreeSet<(Tick, u64)>,
    /// When the waiting renewal task wakes next; `None` while it works (it
    /// looks at the schedule again before it waits, so it sees new leases
    /// without a wake-up).
    sleeping_until: Option<Instant>,
}

impl Entries {
    fn new() -> Self {
        Entries { epoch: Epoch::now(), leases: HashMap::new(), schedule: BTreeSet::new(), sleeping_until: None }
    }

    /// Puts lease `id` in the schedule at its next event (moving it if it is
    /// there already).
    fn reschedule(&mut self, id: u64) {
        let Some(e) = self.leases.get_mut(&id) else { return };
        if let Some(at) = e.scheduled.take() {
            self.schedule.remove(&(at, id));
        }
        let at = e.next_event(self.epoch);
        e.scheduled = Some(at);
        self.schedule.insert((at, id));
    }

    fn remove(&mut self, id: u64) {
        if let Some(at) = self.leases.remove(&id).and_then(|e| e.scheduled) {
            self.schedule.remove(&(at, id));
        }
    }

    /// Whether the next renewal is overdue by a quarter of its interval (the
    /// lease still has most of its TTL: renewal is due at a third of it).
    fn behind(&self, now: Instant) -> bool {
        let Some(&(at, id)) = self.schedule.first() else { return false };
        let interval = self.leases.get(&id).and_then(|e| e.next_renewal()).map(|(_, i)| i);
        interval.is_some_and(|i| at.plus(i / 4) <= self.epoch.tick(now))
    }

    /// Takes the next slice to renew: up to `max` leases, started only when
    /// one is due by `now` and topped up with leases due within half their
    /// interval, so that a call carries as many as it may. Leases found lost
    /// or past their deadline on the way leave the client and go to
    /// `expired`.
    fn take_due(
        &mut self,
        now: Instant,
        max: usize,
        expired: &mut Vec<Arc<LeaseState>>,
    ) -> Vec<(u64, Arc<LeaseState>)> {
        let mut slice = Vec::new();
        while slice.len() < max {
            let Some(&(at, id)) = self.schedule.first() else { break };
            let Some(e) = self.leases.get_mut(&id) else {
                self.schedule.pop_first();
                continue;
            };
            let renewal = e.next_renewal();
            let window = match renewal {
                Some((_, interval)) if !slice.is_empty() => interval / 2,
                _ => Duration::ZERO,
            };
            if at > self.epoch.tick(now).plus(window) {
                break;
            }
            self.schedule.pop_first();
            e.scheduled = None;
            if e.lease.is_lost() {
                expired.push(e.lease.clone());
                self.leases.remove(&id);
            } else if renewal.is_some() {
                e.lease.metrics.renew_lag.record(now.saturating_duration_since(self.epoch.instant(e.next_renew)));
                slice.push((id, e.lease.clone()));
            } else {
                // Not renewed and not yet past its deadline (which moved):
                // look again then.
                self.reschedule(id);
                break;
            }
        }
        let epoch = self.epoch;
        self.sleeping_until =
            slice.is_empty().then(|| self.schedule.first().map_or(now + IDLE_WAKE, |(at, _)| epoch.instant(*at)));
        slice
    }
}

struct Shared {
    backend: Arc<dyn Backend>,
    /// Release every lost lease, not only those that ran out unrenewed
    /// (session-bound stores keep a grant while the session lives).
    session_bound: bool,
    /// The most leases per renew call ([`Capabilities::renew_slice`](crate::Capabilities::renew_slice)).
    renew_slice: Option<usize>,
    /// Store-wide metric handles (round trips, errors).
    metrics: Arc<StoreCounters>,
    entries: Mutex<Entries>,
    changed: Notify,
    next_id: AtomicU64,
}

impl Shared {
    fn entries(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The renewal task of one client. Each lease is renewed when it is due,
/// together with the leases due within half their interval, in
/// [`Backend::renew`] calls of at most the store's slice (256 leases; all in
/// one call on SQLite, etcd and ZooKeeper), a few at a time, so thousands of
/// leases cost a handful of round trips rather than one each, and no call is
/// long. It also watches the deadlines of leases that are not renewed, and
/// on a session-bound store releases each lease whose deadline passed (the
/// store would keep it while the session lives).
pub(crate) struct Renewer {
    shared: Arc<Shared>,
    /// The task; started on first use, and again if the runtime that ran it
    /// has shut down (a client may outlive the runtime it was made in).
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    stop: CancellationToken,
}

impl Renewer {
    pub(crate) fn new(backend: Arc<dyn Backend>, metrics: Arc<StoreCounters>) -> Self {
        let caps = backend.capabilities();
        let (session_bound, renew_slice) = (caps.session_bound, caps.renew_slice);
        Renewer {
            shared: Arc::new(Shared {
                backend,
                session_bound,
                renew_slice,
                metrics,
                entries: Mutex::new(Entries::new()),
                changed: Notify::new(),
                next_id: AtomicU64::new(0),
            }),
            task: Mutex::new(None),
            stop: CancellationToken::new(),
        }
    }

    /// Tracks `lease`: renews it every `interval` (never if `None`) until
    /// `max_hold` has passed. Must be called inside a tokio runtime (it is,
    /// from `acquire`).
    pub(crate) fn register(
        &self,
        lease: Arc<LeaseState>,
        interval: Option<Duration>,
        max_hold: Option<Duration>,
    ) -> u64 {
        {
            let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
            if task.as_ref().is_none_or(|t| t.is_finished()) {
                *task = Some(tokio::spawn(run(self.shared.clone(), self.stop.clone())));
            }
        }
        let now = Instant::now();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        // A grant valid for less than usual (a fair hand-off taken from its
        // message, whose lease ends where the waiter's queue entry did) is
        // renewed first halfway through what is left of it, not a whole
        // period on, which could come after it ended.
        let first_in = |i: Duration| i.min(lease.valid_until().saturating_duration_since(now) / 2);
        let mut entries = self.shared.entries();
        let epoch = entries.epoch;
        let entry = Entry {
            next_renew: epoch.tick(interval.map_or(now, |i| now + first_in(i))),
            interval: Entry::period(interval),
            // A cap past what the clock can count is no cap.
            renew_until: max_hold.and_then(|m| now.checked_add(m)).map(|until| epoch.tick(until)),
            lease,
            scheduled: None,
        };
        let first = epoch.instant(entry.next_event(epoch));
        entries.leases.insert(id, entry);
        entries.reschedule(id);
        // Wake the task only if it sleeps past this lease's first event.
        if entries.sleeping_until.is_some_and(|wake| first < wake) {
            entries.sleeping_until = Some(first);
            self.shared.changed.notify_one();
        }
        id
    }

    /// Stops renewing a lease but keeps tracking it until its deadline.
    pub(crate) fn stop_renewing(&self, id: u64) {
        let mut entries = self.shared.entries();
        let Some(e) = entries.leases.get_mut(&id) else { return };
        e.interval = None;
        // In flight: the reply reschedules it.
        if e.scheduled.is_some() {
            entries.reschedule(id);
        }
    }

    pub(crate) fn deregister(&self, id: u64) {
        self.shared.entries().remove(id);
    }

    /// How many leases this client renews (for tests and benchmarks).
    pub(crate) fn len(&self) -> usize {
        self.shared.entries().leases.values().filter(|e| e.next_renewal().is_some()).count()
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// How many slices may be in flight at once when renewal has fallen behind
/// (one otherwise).
const RENEW_IN_FLIGHT: usize = 4;

/// How long the renewal task sleeps when it holds no lease.
const IDLE_WAKE: Duration = Duration::from_secs(3600);

async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let slice_len = shared.renew_slice.unwrap_or(usize::MAX).max(1);
    let mut in_flight = FuturesUnordered::new();
    loop {
        // Start slices while there is room and something is due; bounded
        // slices a few at a time, so that the client's other calls (and other
        // clients of the store) wait for a few short calls rather than for
        // every due lease, while the overlapping round trips keep renewal fast
        // enough for 100,000 leases.
        let mut wake = None;
        while in_flight.len() < RENEW_IN_FLIGHT {
            let mut expired = Vec::new();
            let (slice, sleeping_until) = {
                let mut entries = shared.entries();
                let now = Instant::now();
                // One call at a time unless renewal has fallen behind: the
                // store serves a renewal call's leases back to back, and
                // every call in flight is one more that the client's other
                // calls may find ahead of them.
                if !in_flight.is_empty() && !entries.behind(now) {
                    break;
                }
                let slice = entries.take_due(now, slice_len, &mut expired);
                (slice, entries.sleeping_until)
            };
            release_expired(&shared, expired);
            if slice.is_empty() {
                wake = sleeping_until;
                break;
            }
            in_flight.push(renew_slice(shared.clone(), stop.clone(), slice));
        }
        let sleep = tokio::time::sleep_until(wake.unwrap_or_else(|| Instant::now() + IDLE_WAKE));
        tokio::select! {
            // In the order written, not at random: a seed replays exactly.
            biased;
            _ = stop.cancelled() => return,
            Some(renewing) = in_flight.next(), if !in_flight.is_empty() => {
                if !renewing {
                    return;
                }
            }
            _ = shared.changed.notified(), if wake.is_some() => {}
            _ = sleep, if wake.is_some() => {}
        }
    }
}

/// Releases leases that ran out unrenewed, on every store: a session-bound
/// store keeps them while its session lives, and the SQLite store while the
/// client's session row for their TTL lives (renewed by the client's other
/// leases); elsewhere the store lets them go by itself about now, and the
/// release frees the key up to a drift margin sooner. On a session-bound
/// store, every lost lease is released (one the store reported gone too:
/// its grant may stand in a session the store has since replaced).
fn release_expired(shared: &Shared, expired: Vec<Arc<LeaseState>>) {
    let expired = expired
        .into_iter()
        .filter(|lease| shared.session_bound || matches!(lease.lost_cause(), Some(LostCause::Deadline)));
    for lease in expired {
        tracing::debug!(key = %lease.key, fence = lease.fence, "lease ran out unrenewed; releasing it");
        let release = Release {
            backend: shared.backend.clone(),
            key: lease.key.clone(),
            token: lease.token,
            horizon: lease.release_horizon(),
            observed: None,
        };
        let _ = release.spawn();
    }
}

/// Renews one slice of due leases in one [`Backend::renew`] call and applies
/// the outcome; false if the renewer was stopped meanwhile.
async fn renew_slice(shared: Arc<Shared>, stop: CancellationToken, due: Vec<(u64, Arc<LeaseState>)>) -> bool {
    let requests: Vec<RenewRequest> =
        due.iter().map(|(_, l)| RenewRequest { key: l.key.clone(), token: l.token, ttl: l.ttl }).collect();
    // Never wait on a renewal past the earliest local deadline in the slice:
    // by then lost() has fired anyway, and the other leases need the task.
    let give_up = due.iter().map(|(_, l)| l.valid_until()).min().unwrap_or_else(Instant::now);
    let sent = Instant::now();
    let store = shared.backend.name();
    let span = tracing::debug_span!(
        "renew",
        store,
        leases = requests.len(),
        key = tracing::field::Empty,
        fence = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    if let [(_, lease)] = due.as_slice() {
        span.record("key", tracing::field::display(&lease.key));
        span.record("fence", lease.fence);
    }
    let call = tracing::debug_span!(parent: &span, "store", store, op = "renew");
    let renewing = tokio::time::timeout_at(give_up, shared.backend.renew(&requests).instrument(call));
    let outcome = tokio::select! {
        // In the order written, not at random: a seed replays exactly.
        biased;
        _ = stop.cancelled() => return false,
        r = renewing.instrument(span.clone()) => r,
    };
    let _entered = span.enter();
    if outcome.is_ok() {
        shared.metrics.renew_seconds.record(sent.elapsed());
    }
    let mut entries = shared.entries();
    let sent_tick = entries.epoch.tick(sent);
    match outcome {
        Ok(Ok(held)) if held.len() == due.len() => {
            let mut gone = 0usize;
            for ((id, lease), still_held) in due.iter().zip(held) {
                // Released while the slice was in flight: not a loss.
                let Some(e) = entries.leases.get_mut(id) else { continue };
                lease.metrics.renewed(Some(still_held));
                if still_held {
                    lease.extended(sent);
                    if let Some(interval) = e.interval {
                        e.next_renew = sent_tick.plus(Duration::from_nanos(interval.get()));
                    }
                    entries.reschedule(*id);
                } else {
                    gone += 1;
                    tracing::warn!(key = %lease.key, fence = lease.fence, "lease gone at renewal");
                    lease.mark_lost(LostCause::Renewal);
                    entries.remove(*id);
                }
            }
            span.record("outcome", if gone == 0 { "renewed" } else { "gone" });
        }
        other => {
            match other {
                Ok(Ok(_)) => tracing::error!("backend renew returned the wrong number of results"),
                Ok(Err(e)) => {
                    shared.metrics.store_error(Op::Renew, &e);
                    tracing::warn!(error = %e, leases = due.len(), "renewal failed, retrying")
                }
                Err(_) => {
                    shared.metrics.store_timeout(Op::Renew);
                    tracing::warn!(leases = due.len(), "renewal timed out, retrying")
                }
            }
            span.record("outcome", "error");
            // Retry soon; the leases stay valid until their local deadline.
            let retry = entries.epoch.tick(Instant::now());
            for (id, lease) in &due {
                let Some(e) = entries.leases.get_mut(id) else { continue };
                lease.metrics.renewed(None);
                if let Some(interval) = e.interval {
                    e.next_renew = retry.plus((Duration::from_nanos(interval.get()) / 8).max(Duration::from_millis(5)));
                }
                entries.reschedule(*id);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    /// A client keeps one entry a lease (100,000 of them in the benchmark
    /// of held leases): 40 bytes, not the 80 of tokio instants.
    #[test]
    fn a_renewal_entry_takes_40_bytes() {
        assert_eq!(std::mem::size_of::<super::Entry>(), 40);
    }
}
