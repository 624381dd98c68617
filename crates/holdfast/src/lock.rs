//! The handle every primitive acquires through ([`Lock`], with a kind
//! marker): how a lease is asked for, and the cleanup that keeps every way of
//! abandoning an attempt from leaving a grant or a reservation behind.

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::wait::{WaitFailure, wait_for_grant};
use crate::backend::{AcquireRequest, Backend, LeaseMode};
use crate::guard::{Guard, GuardKind};
use crate::held::{ClientCore, Held};
use crate::lease::Horizon;
use crate::lease::lock_options::LockOptions;
use crate::lease::release::Release;
use crate::lease::{LeaseState, drift_margin};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken, check_label, check_ttl};
use crate::vocabulary::metrics::{AcquireOutcome, KeyMetrics, Op, Probe};

/// A named lease handle of kind `K`: a [`Mutex`](crate::Mutex), a
/// [`Semaphore`](crate::Semaphore), or one side of a
/// [`RwLock`](crate::RwLock) ([`ReadLock`](crate::ReadLock),
/// [`WriteLock`](crate::WriteLock)). Cheap to clone; holds nothing by itself.
/// The builder methods and acquire methods here are the same for every
/// kind; the guard is a [`Guard`] of the same kind.
pub struct Lock<K: GuardKind> {
    core: Arc<ClientCore>,
    key: String,
    pub(crate) opts: LockOptions,
    /// The weight each acquisition asks for (permits; 1 for the other kinds).
    pub(crate) weight: u32,
    /// The limit of shared leases (a semaphore's permits).
    pub(crate) limit: u32,
    /// The label stored with the grant instead of the client's (an
    /// election's published value).
    pub(crate) label: Option<String>,
    kind: PhantomData<fn() -> K>,
}

impl<K: GuardKind> Clone for Lock<K> {
    fn clone(&self) -> Self {
        Lock {
            core: self.core.clone(),
            key: self.key.clone(),
            opts: self.opts.clone(),
            label: self.label.clone(),
            ..*self
        }
    }
}

impl<K: GuardKind> std::fmt::Debug for Lock<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.key)
            .field("mode", &K::mode(self.weight, self.limit))
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// How an acquire waits.
#[derive(Clone, Copy)]
pub(crate) enum Waiting {
    /// One attempt.
    No,
    /// Until granted, or until the deadline if there is one.
    Until(Option<Instant>),
}

impl<K: GuardKind> Lock<K> {
    pub(crate) fn new(core: Arc<ClientCore>, key: String, opts: LockOptions) -> Self {
        Lock { core, key, opts, weight: 1, limit: 1, label: None, kind: PhantomData }
    }

    crate::lease::lock_options::lock_option_setters!("the lock");

    /// Sets how long [`acquire`](Self::acquire) waits before it fails with
    /// [`Error::Timeout`] (default: no limit; a timeout too long for the
    /// clock to count, such as `Duration::MAX`, is no limit either).
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.opts.wait_timeout = Some(timeout);
        self
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The options this handle acquires with.
    pub fn options(&self) -> &LockOptions {
        &self.opts
    }

    /// One attempt: the guard if the lease was granted, `None` if the key is
    /// busy (for shared leases: not enough room, or a writer holds or waits).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future at any await point leaves no grant
    /// behind. If the store granted the key while the future was dropped, or
    /// the attempt failed after its request may have been applied (a lost
    /// reply), the grant is released by its token on a task of its own,
    /// retried while the store is unreachable.
    pub async fn try_acquire(&self) -> Result<Option<Guard<K>>> {
        self.acquire_inner(Waiting::No).await
    }

    /// Waits for the lease: without limit, or at most
    /// [`LockOptions::wait_timeout`] if set. See the
    /// [waiting policy](crate::backend::wait#the-waiting-policy) for what happens when
    /// the store fails while waiting.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping this future at any await point leaves no grant
    /// and no queue entry behind. If the store granted the key while the
    /// future was being dropped, the grant is released by its token on a task
    /// of its own, which the drop cannot cancel.
    pub async fn acquire(&self) -> Result<Guard<K>> {
        // A deadline past what the clock can count is no deadline.
        let deadline = self.opts.wait_timeout.and_then(|t| Instant::now().checked_add(t));
        self.acquire_inner(Waiting::Until(deadline)).await?.ok_or_else(|| unreachable_busy(&self.key))
    }

    /// Waits for the lease at most `timeout`, then fails with [`Error::Timeout`]
    /// (the key stayed busy) or, if the store was failing at the deadline,
    /// with the store's error.
    ///
    /// An attempt that was in flight at the deadline (its reply may have been
    /// lost) is released by its token before the error is returned.
    ///
    /// # Cancel safety
    ///
    /// As for [`acquire`](Self::acquire). In particular, dropping this future
    /// while it releases its in-flight attempt after the deadline (an outer
    /// timeout that fires on the same tick) does not cancel that release.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Guard<K>> {
        // A deadline past what the clock can count is no deadline.
        let deadline = Instant::now().checked_add(timeout);
        self.acquire_inner(Waiting::Until(deadline)).await?.ok_or_else(|| unreachable_busy(&self.key))
    }

    pub(crate) fn core(&self) -> &Arc<ClientCore> {
        &self.core
    }

    pub(crate) async fn acquire_inner(&self, waiting: Waiting) -> Result<Option<Guard<K>>> {
        let started = Instant::now();
        let inner = &self.core;
        let metrics = inner.metrics.key(&self.key);
        let span = tracing::debug_span!(
            "acquire",
            key = %self.key,
            store = inner.backend.name(),
            wait = matches!(waiting, Waiting::Until(_)),
            fence = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let outcome = self.acquire_observed(waiting, started, &metrics).instrument(span.clone()).await;
        let kind = match &outcome {
            Ok(Some(_)) => AcquireOutcome::Granted,
            Ok(None) => AcquireOutcome::Busy,
            Err(Error::Timeout { .. }) => AcquireOutcome::Timeout,
            Err(_) => AcquireOutcome::Error,
        };
        metrics.acquired(kind, started.elapsed());
        span.record("outcome", kind.name());
        if let Ok(Some(guard)) = &outcome {
            span.record("fence", guard.fence());
        }
        outcome
    }

    async fn acquire_observed(
        &self,
        waiting: Waiting,
        started: Instant,
        metrics: &Arc<KeyMetrics>,
    ) -> Result<Option<Guard<K>>> {
        let key = LockKey::new(self.key.clone())?;
        let ttl = check_ttl(self.opts.ttl)?;
        let interval = self.opts.renew_interval()?;
        let inner = &self.core;
        let caps = inner.backend.capabilities();
        let mode = K::mode(self.weight, self.limit);
        check_mode(mode)?;
        if self.opts.fair && !caps.fair {
            return Err(Error::Unsupported { store: inner.backend.name(), what: "fair locks" });
        }
        if mode != LeaseMode::Exclusive && !caps.shared_leases {
            return Err(Error::Unsupported {
                store: inner.backend.name(),
                what: "shared leases (semaphores and read-write locks) yet",
            });
        }
        if let Some(owner) = &self.opts.owner {
            if let Some(held) = self.core.reenter(&key, owner) {
                return Ok(Some(Guard::new(held)));
            }
        }
        let label = self.label.clone().unwrap_or_else(|| inner.label.clone());
        check_label(&label, "label")?;
        let req = AcquireRequest::new(key.clone(), OwnerToken::random(), ttl)
            .with_label(label)
            .with_fair(self.opts.fair || caps.always_fair)
            .with_mode(mode);
        let mut cleanup = Cleanup::armed(&inner.backend, &req, caps.session_bound);
        let store = inner.backend.name();
        let outcome = match waiting {
            Waiting::No => {
                metrics.attempts.increment(1);
                let call = tracing::debug_span!("store", store, op = "try_acquire");
                inner.backend.try_acquire(&req).instrument(call).await.map_err(WaitFailure::Store)
            }
            Waiting::Until(deadline) => {
                let span = tracing::debug_span!("wait", key = %key, store);
                let waited = wait_for_grant(inner.backend.as_ref(), &req, deadline, inner.store_retry).instrument(span);
                let ((outcome, calls), probe) = Probe::run(waited).await;
                probe.record(metrics, calls, outcome.is_ok(), Instant::now());
                outcome.map(Some)
            }
        };
        let grant = match outcome {
            Ok(Some(grant)) => grant,
            Ok(None) => {
                cleanup.disarm();
                return Ok(None);
            }
            Err(failure) => {
                if let WaitFailure::Store(e) = &failure {
                    metrics.store.store_error(Op::Acquire, e);
                }
                // The request may have been applied before the failure (a lost
                // reply, a grant racing the deadline): release it by token.
                let release_failed = cleanup.release_now().await;
                return Err(match failure {
                    // A waiter parked on a store notification sends nothing, so a
                    // store that went silent is first noticed by this release:
                    // if it fails, the deadline found the store failing, not busy.
                    WaitFailure::Deadline => match release_failed {
                        Some(e) if e.is_transient() => e,
                        _ => Error::Timeout { key: self.key.clone(), waited: started.elapsed() },
                    },
                    WaitFailure::Store(e) => e,
                });
            }
        };
        cleanup.disarm();
        tracing::debug!(key = %key, fence = grant.fence, "granted");
        let started = grant.attempt_started;
        let mut lease = LeaseState::new(key, req.token, ttl, grant, metrics.clone());
        // Renew at least three times per validity period, which a session
        // may make shorter than the TTL.
        let interval = interval.min(lease.valid_for() / 3);
        // A lease without renewal lasts one TTL. Where a session vouches for
        // less at a time (etcd, ZooKeeper), the client renews it up to that
        // end and no further (the store would keep it while the session
        // lives, so the client releases it at that end).
        let (renew, max_hold) = match self.opts.auto_renew {
            true => (Some(interval), self.opts.max_hold),
            false if caps.session_bound && lease.valid_for() < ttl => {
                lease.end_after_one_ttl(started);
                (Some(interval), Some(ttl))
            }
            false => (None, self.opts.max_hold),
        };
        let lease = Arc::new(lease);
        let renewal = inner.renewer.register(lease.clone(), renew, max_hold);
        metrics.leases_held.increment(1);
        let held = Arc::new(Held {
            core: self.core.clone(),
            lease,
            renewal,
            owner: self.opts.owner.clone(),
            holds: AtomicU32::new(1),
            weight: AtomicU32::new(self.weight),
        });
        if let Some(owner) = &self.opts.owner {
            self.core.register_reentrant(owner, &held);
        }
        Ok(Some(Guard::new(held)))
    }
}

/// Refuses impossible shared requests before any I/O.
fn check_mode(mode: LeaseMode) -> Result<()> {
    if let LeaseMode::Shared { weight, limit } = mode {
        if limit == 0 {
            return Err(Error::invalid("permits", "a semaphore needs at least 1 permit"));
        }
        if weight == 0 || weight > limit {
            return Err(Error::invalid(
                "permits",
                format!("cannot ask for {weight} permits of a semaphore of {limit}: between 1 and {limit}"),
            ));
        }
    }
    Ok(())
}

fn unreachable_busy(key: &str) -> Error {
    // A waiting acquire only returns with a grant or an error; a backend that
    // breaks that contract gets a typed error rather than a panic.
    Error::backend("holdfast", false, format!("backend returned busy to a waiting acquire of {key:?}"))
}

/// Releases an in-flight attempt's token unless disarmed: the core of cancel
/// safety. Whatever path abandons the attempt (an error, the deadline, the
/// future dropped at any await point, even while this cleanup runs), the
/// release cannot be cancelled half-way (one dropped in flight goes on, sent
/// again, on a task of its own).
struct Cleanup {
    armed: Option<(Arc<dyn Backend>, LockKey, OwnerToken)>,
    ttl: Duration,
    session_bound: bool,
}

impl Cleanup {
    fn armed(backend: &Arc<dyn Backend>, req: &AcquireRequest, session_bound: bool) -> Self {
        Cleanup { armed: Some((backend.clone(), req.key.clone(), req.token)), ttl: req.ttl, session_bound }
    }

    fn disarm(&mut self) {
        self.armed = None;
    }

    fn take(&mut self) -> Option<Release> {
        let (backend, key, token) = self.armed.take()?;
        // Until when the store could hold what the attempt left: one TTL from
        // now on a TTL store (a grant cannot be younger than this moment); on
        // a session-bound store, until its release says the session is gone.
        let horizon = if self.session_bound {
            Horizon::Unknown
        } else {
            Horizon::At(Instant::now() + self.ttl + 2 * drift_margin(self.ttl))
        };
        Some(Release { backend, key, token, horizon, observed: None })
    }

    /// Releases now and waits for the first attempt's outcome (its error, if
    /// it failed); dropping this future does not stop the release.
    async fn release_now(&mut self) -> Option<Error> {
        let release = self.take()?;
        let key = release.key.clone();
        let e = release.first_outcome().await.err()?;
        tracing::warn!(key = %key, error = %e, "could not release an abandoned attempt yet; retrying in the background");
        Some(e)
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(release) = self.take() {
            if release.spawn().is_none() {
                tracing::debug!("no runtime to release an abandoned attempt in; its lease will expire");
            }
        }
    }
}
