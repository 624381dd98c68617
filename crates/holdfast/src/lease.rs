//! Leases held by a client: their local deadline, `lost()`, and the one
//! renewal task per client that renews every due lease in one batched call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::{Backend, RenewRequest};
use crate::key::{LockKey, OwnerToken};

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
    valid_until: Mutex<Instant>,
    lost: CancellationToken,
    session_lost: Option<CancellationToken>,
}

impl LeaseState {
    pub(crate) fn new(
        key: LockKey,
        token: OwnerToken,
        fence: u64,
        ttl: Duration,
        attempt_started: std::time::Instant,
        session_lost: Option<CancellationToken>,
    ) -> Self {
        LeaseState {
            key,
            token,
            fence,
            ttl,
            valid_until: Mutex::new(Instant::from_std(attempt_started) + ttl - drift_margin(ttl)),
            lost: CancellationToken::new(),
            session_lost,
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Extends the local deadline after a renewal whose request left at `sent`.
    fn extended(&self, sent: Instant) {
        let mut vu = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        *vu = (*vu).max(sent + self.ttl - drift_margin(self.ttl));
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
    interval: Duration,
    next_renew: Instant,
    renew_until: Option<Instant>,
}

#[derive(Default)]
struct Entries {
    leases: HashMap<u64, Entry>,
    /// When the sleeping renewal task wakes next; `None` while it works (it
    /// rescans before sleeping again, so it sees new leases without a wake-up).
    sleeping_until: Option<Instant>,
}

#[derive(Default)]
struct Shared {
    entries: Mutex<Entries>,
    changed: Notify,
    next_id: AtomicU64,
}

/// The renewal task of one client. Every tick it renews, in one
/// [`Backend::renew`] call, all leases that are due and every lease that would
/// be due within half its interval, so thousands of leases cost a handful of
/// round trips rather than one each.
pub(crate) struct Renewer {
    backend: Arc<dyn Backend>,
    shared: Arc<Shared>,
    started: OnceLock<()>,
    stop: CancellationToken,
}

impl Renewer {
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Self {
        Renewer { backend, shared: Arc::default(), started: OnceLock::new(), stop: CancellationToken::new() }
    }

    /// Starts renewing `lease` every `interval` until `max_hold` has passed.
    /// Must be called inside a tokio runtime (it is, from `acquire`).
    pub(crate) fn register(&self, lease: Arc<LeaseState>, interval: Duration, max_hold: Option<Duration>) -> u64 {
        self.started.get_or_init(|| {
            tokio::spawn(run(self.backend.clone(), self.shared.clone(), self.stop.clone()));
        });
        let now = Instant::now();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Entry { lease, interval, next_renew: now + interval, renew_until: max_hold.map(|m| now + m) };
        let mut entries = self.shared.entries.lock().unwrap_or_else(|p| p.into_inner());
        // Wake the task only if it sleeps past this lease's first renewal:
        // acquiring stays O(1) however many leases the client holds.
        if entries.sleeping_until.is_some_and(|wake| entry.next_renew < wake) {
            entries.sleeping_until = Some(entry.next_renew);
            self.shared.changed.notify_one();
        }
        entries.leases.insert(id, entry);
        id
    }

    pub(crate) fn deregister(&self, id: u64) {
        self.shared.entries.lock().unwrap_or_else(|p| p.into_inner()).leases.remove(&id);
    }

    /// How many leases this client renews (for tests and benchmarks).
    pub(crate) fn len(&self) -> usize {
        self.shared.entries.lock().unwrap_or_else(|p| p.into_inner()).leases.len()
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// How long the renewal task sleeps when it holds no lease.
const IDLE_WAKE: Duration = Duration::from_secs(3600);

/// Picks the due leases; returns them with the instant the task must wake next.
fn collect_due(shared: &Shared, now: Instant) -> (Vec<(u64, Arc<LeaseState>)>, Option<Instant>) {
    let mut guard = shared.entries.lock().unwrap_or_else(|p| p.into_inner());
    let Entries { leases: entries, sleeping_until } = &mut *guard;
    let mut wake: Option<Instant> = None;
    let mut any_due = false;
    entries.retain(|_, e| {
        if e.lease.is_lost() {
            return false;
        }
        let capped = e.renew_until.is_some_and(|until| e.next_renew > until);
        let at = if capped { e.lease.valid_until() } else { e.next_renew };
        any_due |= !capped && at <= now;
        wake = Some(wake.map_or(at, |w| w.min(at)));
        true
    });
    if !any_due {
        *sleeping_until = Some(wake.unwrap_or(now + IDLE_WAKE));
        return (Vec::new(), wake);
    }
    *sleeping_until = None;
    let due = entries
        .iter()
        .filter(|(_, e)| {
            let capped = e.renew_until.is_some_and(|until| e.next_renew > until);
            !capped && e.next_renew <= now + e.interval / 2
        })
        .map(|(id, e)| (*id, e.lease.clone()))
        .collect();
    (due, wake)
}

async fn run(backend: Arc<dyn Backend>, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let now = Instant::now();
        let (due, wake) = collect_due(&shared, now);
        if due.is_empty() {
            let sleep = tokio::time::sleep_until(wake.unwrap_or(now + IDLE_WAKE));
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = shared.changed.notified() => {}
                _ = sleep => {}
            }
            continue;
        }
        let requests: Vec<RenewRequest> =
            due.iter().map(|(_, l)| RenewRequest { key: l.key.clone(), token: l.token, ttl: l.ttl }).collect();
        // Never wait on a renewal past the earliest local deadline in the batch:
        // by then lost() has fired anyway, and the other leases need the task.
        let give_up = due.iter().map(|(_, l)| l.valid_until()).min().unwrap_or(now);
        let sent = Instant::now();
        let span = tracing::debug_span!("renew", leases = requests.len());
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout_at(give_up, backend.renew(&requests)).instrument(span) => r,
        };
        let mut guard = shared.entries.lock().unwrap_or_else(|p| p.into_inner());
        let entries = &mut guard.leases;
        match outcome {
            Ok(Ok(held)) if held.len() == due.len() => {
                for ((id, lease), still_held) in due.iter().zip(held) {
                    if still_held {
                        lease.extended(sent);
                        if let Some(e) = entries.get_mut(id) {
                            e.next_renew = sent + e.interval;
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
                for (id, _) in &due {
                    if let Some(e) = entries.get_mut(id) {
                        e.next_renew = retry + (e.interval / 8).max(Duration::from_millis(5));
                    }
                }
            }
        }
    }
}
