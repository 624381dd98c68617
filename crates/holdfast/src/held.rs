//! What a client shares with its locks and guards ([`ClientCore`]), and what
//! the reentrant guards of one grant share ([`Held`]). The two name each
//! other (a client keeps its live reentrant grants; a grant keeps its
//! client), so they live in one file, below the primitives and the
//! [`Client`](crate::Client) facade that build on them.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use crate::backend::{Backend, LockStatus};
use crate::lease::release::Release;
use crate::lease::{LeaseState, Renewer};
use crate::vocabulary::error::Result;
use crate::vocabulary::key::LockKey;
use crate::vocabulary::metrics::{ClientMetrics, Op};

/// What a [`Client`](crate::Client) shares with the locks and guards made
/// from it.
pub(crate) struct ClientCore {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) renewer: Renewer,
    pub(crate) label: String,
    pub(crate) store_retry: Duration,
    /// Metric handles (see [`crate::vocabulary::metrics`]).
    pub(crate) metrics: Arc<ClientMetrics>,
    pub(crate) store_id: String,
    reentrant: StdMutex<HashMap<(String, String), Weak<Held>>>,
}

impl fmt::Debug for ClientCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCore").field("backend", &self.backend).field("label", &self.label).finish_non_exhaustive()
    }
}

impl ClientCore {
    /// A client's core over `backend`, renewing its leases from now on.
    pub(crate) fn new(backend: Arc<dyn Backend>, label: String, store_retry: Duration, store_id: String) -> Self {
        let metrics = Arc::new(ClientMetrics::new(backend.name()));
        ClientCore {
            renewer: Renewer::new(backend.clone(), metrics.counters.clone()),
            metrics,
            backend,
            label,
            store_retry,
            store_id,
            reentrant: StdMutex::default(),
        }
    }

    /// Who holds `key`, as far as the store can tell; a failure is counted.
    pub(crate) async fn status(&self, key: &str) -> Result<LockStatus> {
        let key = LockKey::new(key)?;
        let call = tracing::debug_span!("store", store = self.backend.name(), op = "status");
        let status = tracing::Instrument::instrument(self.backend.status(&key), call).await;
        if let Err(e) = &status {
            self.metrics.counters.store_error(Op::Status, e);
        }
        status
    }

    /// Takes one more hold of a live reentrant grant of `owner` on `key`.
    pub(crate) fn reenter(&self, key: &LockKey, owner: &str) -> Option<Arc<Held>> {
        let map = self.reentrant.lock().unwrap_or_else(|p| p.into_inner());
        let held = map.get(&(key.as_str().to_owned(), owner.to_owned()))?.upgrade()?;
        if held.lease.is_lost() || held.holds.load(Ordering::Acquire) == 0 {
            return None;
        }
        held.holds.fetch_add(1, Ordering::AcqRel);
        Some(held)
    }

    pub(crate) fn register_reentrant(&self, owner: &str, held: &Arc<Held>) {
        let mut map = self.reentrant.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        map.insert((held.lease.key.as_str().to_owned(), owner.to_owned()), Arc::downgrade(held));
    }

    /// Drops one hold of a reentrant grant; true if it was the last.
    pub(crate) fn leave_reentrant(&self, owner: &str, held: &Held) -> bool {
        let mut map = self.reentrant.lock().unwrap_or_else(|p| p.into_inner());
        let last = held.holds.fetch_sub(1, Ordering::AcqRel) == 1;
        if last {
            let k = (held.lease.key.as_str().to_owned(), owner.to_owned());
            if map.get(&k).is_some_and(|w| std::ptr::eq(w.as_ptr(), held)) {
                map.remove(&k);
            }
        }
        last
    }
}

/// What reentrant guards of one grant share.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) core: Arc<ClientCore>,
    pub(crate) lease: Arc<LeaseState>,
    /// The lease's id in the client's renewer.
    pub(crate) renewal: u64,
    pub(crate) owner: Option<String>,
    /// Live guards of this grant; only a reentrant lock has more than one.
    pub(crate) holds: AtomicU32,
    /// The lease's weight (a permit count; 1 for the other kinds): lowered
    /// by [`Permit::release_some`](crate::Permit::release_some).
    pub(crate) weight: AtomicU32,
}

impl Held {
    /// Drops one hold; true if it was the last, and the grant must go.
    pub(crate) fn drop_hold(&self) -> bool {
        match &self.owner {
            Some(owner) => self.core.leave_reentrant(owner, self),
            None => self.holds.fetch_sub(1, Ordering::AcqRel) == 1,
        }
    }

    pub(crate) fn release(&self) -> Release {
        self.core.renewer.deregister(self.renewal);
        Release {
            backend: self.core.backend.clone(),
            key: self.lease.key.clone(),
            token: self.lease.token,
            horizon: self.lease.release_horizon(),
            observed: Some(self.lease.clone()),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.lease.metrics.leases_held.decrement(1);
    }
}
