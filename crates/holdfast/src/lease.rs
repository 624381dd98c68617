//! Leases held by a client: the one owner of lease time. Each lease's local
//! deadline, `lost()` and `expiring()`, and the one renewal task per client
//! that renews the due leases in batched calls of bounded size and, on a
//! session-bound store, releases a lease whose deadline passed unrenewed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::{Backend, Grant, RenewRequest};
use crate::key::{LockKey, OwnerToken};
use crate::release::{Horizon, Release};

/// The margin by which the client's view of a lease ends before the store's:
/// 1% of the TTL for clock-rate drift between client and store, plus 1 ms.
pub fn drift_margin(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(1)
}

/// One granted lease as the client sees it.
#[derive(Debug)]
pub(crate) struct LeaseState {
    pub(crate) key: LockKey,
    pub(crate) token: OwnerToken,
    pub(crate) fence: u64,
    pub(crate) ttl: Duration,
    /// How long the store keeps the grant after a request that vouched for
    /// it (the TTL, or less where a session bounds it).
    valid_for: Duration,
    valid_until: Mutex<Instant>,
    lost: CancellationToken,
    session_lost: Option<CancellationToken>,
}

impl LeaseState {
    pub(crate) fn new(key: LockKey, token: OwnerToken, ttl: Duration, grant: Grant) -> Self {
        let valid_for = grant.valid_for.min(ttl);
        LeaseState {
            key,
            token,
            fence: grant.fence,
            ttl,
            valid_for,
            valid_until: Mutex::new(Instant::from_std(grant.attempt_started) + valid_for - drift_margin(valid_for)),
            lost: CancellationToken::new(),
            session_lost: grant.session_lost,
        }
    }

    /// How long the store keeps this grant without renewal.
    pub(crate) fn valid_for(&self) -> Duration {
        self.valid_for
    }

    /// After when releasing this lease no longer matters.
    pub(crate) fn release_horizon(&self) -> Horizon {
        match &self.session_lost {
            Some(session) => Horizon::Session(session.clone()),
            // The store's deadline is at most one drift margin after ours;
            // allow one more for its clock running slow.
            None => Horizon::At(self.valid_until() + 2 * drift_margin(self.valid_for)),
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Extends the local deadline after a renewal whose request left at `sent`.
    fn extended(&self, sent: Instant) {
        let mut vu = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        *vu = (*vu).max(sent + self.valid_for - drift_margin(self.valid_for));
    }

    pub(crate) fn mark_lost(&self) {
        self.lost.cancel();
    }

    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.is_cancelled() {
            return true;
        }
        if self.session_lost.as_ref().is_some_and(|s| s.is_cancelled()) || Instant::now() >= self.valid_until() {
            self.lost.cancel();
            return true;
        }
        false
    }

    /// Resolves once the lease is lost: marked by the renewer, reported by
    /// the store's session, or past its local deadline (whichever is first;
    /// the deadline is checked here too, so a starved renewal task cannot
    /// delay the signal).
    pub(crate) async fn lost(self: Arc<Self>) {
        let never = CancellationToken::new();
        let session = self.session_lost.clone().unwrap_or(never);
        loop {
            let deadline = self.valid_until();
            tokio::select! {
                _ = self.lost.cancelled() => return,
                _ = session.cancelled() => { self.lost.cancel(); return }
                _ = tokio::time::sleep_until(deadline) => {
                    if Instant::now() >= self.valid_until() {
                        self.lost.cancel();
                        return;
                    }
                }
            }
        }
    }
}

impl LeaseState {
    /// Resolves once the lease can no longer be guaranteed for the next
    /// `within`: it is lost, or its local deadline (which only a successful
    /// renewal moves) is less than `within` away.
    pub(crate) async fn expiring(self: Arc<Self>, within: Duration) {
        let never = CancellationToken::new();
        let session = self.session_lost.clone().unwrap_or(never);
        loop {
            let at = self.valid_until().checked_sub(within).unwrap_or_else(Instant::now);
            tokio::select! {
                _ = self.lost.cancelled() => return,
                _ = session.cancelled() => { self.lost.cancel(); return }
                _ = tokio::time::sleep_until(at) => {
                    if Instant::now() + within >= self.valid_until() {
                        return;
                    }
                }
            }
        }
    }
}

struct Entry {
    lease: Arc<LeaseState>,
    /// The renewal period; `None` for a lease that is not renewed (renewal
    /// off, or the guard leaked): it lasts one TTL.
    interval: Option<Duration>,
    next_renew: Instant,
    renew_until: Option<Instant>,
}

impl Entry {
    /// The next renewal, if the lease is still renewed at all.
    fn next_renewal(&self) -> Option<(Instant, Duration)> {
        let interval = self.interval?;
        let capped = self.renew_until.is_some_and(|until| self.next_renew > until);
        (!capped).then_some((self.next_renew, interval))
    }
}

#[derive(Default)]
struct Entries {
    leases: HashMap<u64, Entry>,
    /// When the sleeping renewal task wakes next; `None` while it works (it
    /// rescans before sleeping again, so it sees new leases without a wake-up).
    sleeping_until: Option<Instant>,
}

struct Shared {
    backend: Arc<dyn Backend>,
    /// Release leases whose deadline passed unrenewed (session-bound stores).
    session_bound: bool,
    /// The most leases per renew call ([`Capabilities::renew_slice`](crate::Capabilities::renew_slice)).
    renew_slice: Option<usize>,
    entries: Mutex<Entries>,
    changed: Notify,
    next_id: AtomicU64,
}

/// The renewal task of one client. Every tick it renews all leases that are
/// due and every lease that would be due within half its interval, in
/// [`Backend::renew`] calls of at most the store's slice (256 leases; all in
/// one call on SQLite, etcd and ZooKeeper), a few at a time, so thousands of
/// leases cost a handful of round trips rather than one each, and no call is
/// long. It also watches the deadlines of leases
/// that are not renewed, and on a session-bound store releases each lease
/// whose deadline passed (the store would keep it while the session lives).
pub(crate) struct Renewer {
    shared: Arc<Shared>,
    /// The task; started on first use, and again if the runtime that ran it
    /// has shut down (a client may outlive the runtime it was made in).
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    stop: CancellationToken,
}

impl Renewer {
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Self {
        let caps = backend.capabilities();
        let (session_bound, renew_slice) = (caps.session_bound, caps.renew_slice);
        Renewer {
            shared: Arc::new(Shared {
                backend,
                session_bound,
                renew_slice,
                entries: Mutex::default(),
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
        let entry = Entry {
            next_renew: interval.map_or(now, |i| now + i),
            interval,
            renew_until: max_hold.map(|m| now + m),
            lease,
        };
        let first = entry.next_renewal().map_or(entry.lease.valid_until(), |(at, _)| at);
        let mut entries = self.shared.entries.lock().unwrap_or_else(|p| p.into_inner());
        // Wake the task only if it sleeps past this lease's first event:
        // acquiring stays O(1) however many leases the client holds.
        if entries.sleeping_until.is_some_and(|wake| first < wake) {
            entries.sleeping_until = Some(first);
            self.shared.changed.notify_one();
        }
        entries.leases.insert(id, entry);
        id
    }

    /// Stops renewing a lease but keeps tracking it until its deadline.
    pub(crate) fn stop_renewing(&self, id: u64) {
        let mut entries = self.shared.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.leases.get_mut(&id) {
            e.interval = None;
        }
    }

    pub(crate) fn deregister(&self, id: u64) {
        self.shared.entries.lock().unwrap_or_else(|p| p.into_inner()).leases.remove(&id);
    }

    /// How many leases this client renews (for tests and benchmarks).
    pub(crate) fn len(&self) -> usize {
        let entries = self.shared.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.leases.values().filter(|e| e.next_renewal().is_some()).count()
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// How many slices may be in flight at once.
const RENEW_IN_FLIGHT: usize = 4;

/// How long the renewal task sleeps when it holds no lease.
const IDLE_WAKE: Duration = Duration::from_secs(3600);

/// What one scan of the leases found.
struct Scan {
    due: Vec<(u64, Arc<LeaseState>)>,
    /// Leases that ran out unrenewed (or were lost), no longer tracked.
    expired: Vec<Arc<LeaseState>>,
    wake: Option<Instant>,
}

/// Picks the due leases and drops the lost ones.
fn scan(shared: &Shared, now: Instant) -> Scan {
    let mut guard = shared.entries.lock().unwrap_or_else(|p| p.into_inner());
    let Entries { leases: entries, sleeping_until } = &mut *guard;
    let mut wake: Option<Instant> = None;
    let mut any_due = false;
    let mut expired = Vec::new();
    entries.retain(|_, e| {
        if e.lease.is_lost() {
            expired.push(e.lease.clone());
            return false;
        }
        let at = match e.next_renewal() {
            Some((at, _)) => {
                any_due |= at <= now;
                at
            }
            None => e.lease.valid_until(),
        };
        wake = Some(wake.map_or(at, |w| w.min(at)));
        true
    });
    if !any_due {
        *sleeping_until = Some(wake.unwrap_or(now + IDLE_WAKE));
        return Scan { due: Vec::new(), expired, wake };
    }
    *sleeping_until = None;
    let due = entries
        .iter()
        .filter(|(_, e)| e.next_renewal().is_some_and(|(at, interval)| at <= now + interval / 2))
        .map(|(id, e)| (*id, e.lease.clone()))
        .collect();
    Scan { due, expired, wake }
}

async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let now = Instant::now();
        let Scan { due, expired, wake } = scan(&shared, now);
        if shared.session_bound {
            for lease in expired {
                tracing::debug!(key = %lease.key, fence = lease.fence, "lease ran out unrenewed; releasing it");
                let release = Release {
                    backend: shared.backend.clone(),
                    key: lease.key.clone(),
                    token: lease.token,
                    horizon: lease.release_horizon(),
                };
                let _ = release.spawn();
            }
        }
        if due.is_empty() {
            let sleep = tokio::time::sleep_until(wake.unwrap_or(now + IDLE_WAKE));
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = shared.changed.notified() => {}
                _ = sleep => {}
            }
            continue;
        }
        // Bounded slices (as the store asks), one store call each, at most a
        // few in flight, so that the client's other calls (and other clients
        // of the store) wait for a few short calls rather than for the whole
        // batch, while the overlapping round trips keep renewal fast enough
        // for 100,000 leases.
        let slice_len = shared.renew_slice.unwrap_or(due.len()).max(1);
        let chunks: Vec<Vec<(u64, Arc<LeaseState>)>> = due.chunks(slice_len).map(<[_]>::to_vec).collect();
        let mut slices = futures::stream::iter(chunks)
            .map(|slice| {
                let (shared, stop) = (shared.clone(), stop.clone());
                async move { renew_slice(&shared, &stop, &slice).await }
            })
            .buffer_unordered(RENEW_IN_FLIGHT);
        while let Some(renewing) = slices.next().await {
            if !renewing {
                return;
            }
        }
    }
}

/// Renews one slice of due leases in one [`Backend::renew`] call and applies
/// the outcome; false if the renewer was stopped meanwhile.
async fn renew_slice(shared: &Shared, stop: &CancellationToken, due: &[(u64, Arc<LeaseState>)]) -> bool {
    let requests: Vec<RenewRequest> =
        due.iter().map(|(_, l)| RenewRequest { key: l.key.clone(), token: l.token, ttl: l.ttl }).collect();
    // Never wait on a renewal past the earliest local deadline in the slice:
    // by then lost() has fired anyway, and the other leases need the task.
    let give_up = due.iter().map(|(_, l)| l.valid_until()).min().unwrap_or_else(Instant::now);
    let sent = Instant::now();
    let span = tracing::debug_span!("renew", leases = requests.len());
    let outcome = tokio::select! {
        _ = stop.cancelled() => return false,
        r = tokio::time::timeout_at(give_up, shared.backend.renew(&requests)).instrument(span) => r,
    };
    let mut guard = shared.entries.lock().unwrap_or_else(|p| p.into_inner());
    let entries = &mut guard.leases;
    match outcome {
        Ok(Ok(held)) if held.len() == due.len() => {
            for ((id, lease), still_held) in due.iter().zip(held) {
                // Released while the slice was in flight: not a loss.
                let Some(e) = entries.get_mut(id) else { continue };
                if still_held {
                    lease.extended(sent);
                    if let Some(interval) = e.interval {
                        e.next_renew = sent + interval;
                    }
                } else {
                    tracing::warn!(key = %lease.key, fence = lease.fence, "lease gone at renewal");
                    lease.mark_lost();
                    entries.remove(id);
                }
            }
        }
        other => {
            match other {
                Ok(Ok(_)) => tracing::error!("backend renew returned the wrong number of results"),
                Ok(Err(e)) => tracing::warn!(error = %e, leases = due.len(), "renewal failed, retrying"),
                Err(_) => tracing::warn!(leases = due.len(), "renewal timed out, retrying"),
            }
            // Retry soon; the leases stay valid until their local deadline.
            let retry = Instant::now();
            for (id, _) in due {
                if let Some(e) = entries.get_mut(id) {
                    if let Some(interval) = e.interval {
                        e.next_renew = retry + (interval / 8).max(Duration::from_millis(5));
                    }
                }
            }
        }
    }
    true
}
