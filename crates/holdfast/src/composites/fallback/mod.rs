//! The fallback chain: one lock over an ordered list of stores (Redis, then
//! ZooKeeper, then the database), granted by one store at a time, that
//! moves to the next store when the active one fails, and never grants
//! twice when clients disagree about which store is down.
//!
//! # Why the naive chain grants twice
//!
//! "Try Redis; if it times out, try the next store" gives two holders as
//! soon as a partition cuts one client from Redis but not another: the cut
//! client takes the lock on the next store while the other takes it on
//! Redis. `tests/fallback.rs` runs that chain and shows the double grant.
//!
//! # The construction
//!
//! The last store of the chain is also its **arbiter**: it keeps a mode
//! record, one key saying which store is active in which epoch (see
//! [`mode`](self) for how the record is kept with the lease model and a
//! record written only under the key's exclusive lease).
//!
//! - A client grants from a store only under a **mode lease** naming that
//!   store: a shared lease on the record key, taken fresh (never renewed)
//!   every half mode TTL while the client grants. A grant counts only if a
//!   mode lease naming its store still has the grant's validity left when
//!   the store's reply has arrived, and the client's belief in the lease
//!   never outlives the mode lease: renewals vouch for it only as far as a
//!   mode lease reaches.
//! - A client whose active store keeps failing (for `switch_after`, with no
//!   success between) and then does not answer a read either (within a
//!   second: two stalls with no call between are no outage) asks for a
//!   **switch**: it takes the record key as a writer, which the
//!   arbiter grants only once every mode lease of the old epoch has expired
//!   by its clock, and no new mode lease is granted while the writer waits.
//!   Every holder under the old epoch has therefore stopped believing (the
//!   drift margin included) before anyone can take a mode lease of the new
//!   one. The switch moves the record to the next store, in a new epoch.
//! - A grant's fence is `epoch << 52 | store fence`: a later epoch's fences
//!   are above every earlier grant's, whatever the stores' own counters
//!   say, and within an epoch the active store's fences increase.
//!
//! This is the design the model checker chose (`crates/holdfast-models`,
//! model 2: the naive chain and a chain whose new epoch is usable at once
//! both grant twice; this one has no counterexample over a complete
//! exploration).
//!
//! # Stores down at start
//!
//! [`open_url`](Fallback::open_url) (and `fallback://` in
//! [`Client::connect`](crate::Client::connect)) builds the chain while any
//! of its stores is down: a store that cannot be reached is a
//! deferred ([`connect_or_defer`](crate::stores::connect_or_defer)) store, connected in the background
//! with backoff, that fails every call retryably until it answers. An
//! active store down at start is a failing store: the chain switches to
//! the next after `switch_after` (plus a mode TTL), as for one that failed
//! later, so a process restarted during the outage still gets its lock.
//! With the arbiter down the chain builds too, and every call fails with a
//! retryable store error naming the arbiter until it answers (nothing can be
//! granted without a mode lease). A malformed URL fails at once.
//!
//! # What it costs, and where the guarantees end
//!
//! - **No more available than its arbiter.** Granting needs a mode lease,
//!   so the arbiter must answer every half mode TTL (one shared-lease
//!   acquisition per client per half TTL while it grants, not one per lock).
//!   A client cut from the arbiter stops granting (its holders' `lost()`
//!   fires) when its mode lease ends, even if the active store is fine;
//!   with the arbiter down nothing is granted anywhere. What the chain buys
//!   is moving lock traffic off the consistent store, keeping its safety.
//! - **A switch costs one mode TTL** (default 10 s) with no grants, plus
//!   `switch_after` of failures and the probe read (up to a second) before
//!   it starts. Holders under the old
//!   epoch see `lost()` when their mode lease ends.
//! - A lease's belief is at most half the mode TTL ahead (a lock TTL above
//!   that is renewed more often than asked).
//! - Exclusion within one epoch is the active store's own (so a Redis
//!   without persistence that restarts while active can grant twice, as it
//!   would alone). Fences need each store's fences below 2^52 (all of
//!   holdfast's do) and at most 4,095 switches per record name.
//! - The arbiter must keep shared leases and records kept with a key
//!   ([`Backend::write_record`]): SQLite, PostgreSQL, MySQL or Redis (with
//!   persistence, or the record's epoch can go back). etcd and ZooKeeper
//!   can be any other link.
//! - **Chains are independent**: chains with different record names
//!   (`name`) may share one arbiter, and the arbiter may serve plain locks,
//!   RedLock members and fence floors raised on other keys. A chain's mode
//!   lives in its record key's record, which only that chain's switches
//!   write, so no other tenant moves it (the SQL stores' fence counter is
//!   shared by every key of a file or namespace; the mode is not kept
//!   there). Two chain layouts must not share one name: a record naming a
//!   store the chain lacks is an error.
//! - Failing back to the first store happens after `fail_back_after`
//!   (default 60 s) on another store, when the first store answers a probe;
//!   each fail-back is a switch, with its cost.

mod config;
mod holdings;
mod mode;
mod steps;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use tokio::time::Instant;

pub use mode::{MAX_EPOCH, MAX_STORES, Mode};

use crate::backend::{AcquireRequest, Backend, Grant, LeaseMode, LockStatus, RenewRequest};
use crate::lease::Horizon;
use crate::lease::drift_margin;
use crate::lease::release::Release;
use crate::vocabulary::capability::{Capabilities, FenceDurability};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken, check_ttl};
use holdings::Holdings;
use mode::{EPOCH_SHIFT, ModeRecord};
use steps::Waited;

/// The mode lease TTL by default: a switch costs about this long.
pub const DEFAULT_MODE_TTL: Duration = Duration::from_secs(10);
/// How long the active store must keep failing before a client switches.
pub const DEFAULT_SWITCH_AFTER: Duration = Duration::from_secs(2);
/// How long the chain stays away from its first store before it tries to
/// go back.
pub const DEFAULT_FAIL_BACK_AFTER: Duration = Duration::from_secs(60);
/// The record name unless one is given.
pub const DEFAULT_RECORD_NAME: &str = "default";
/// The bits of a chain fence that hold the store's own fence.
const STORE_FENCE_MASK: u64 = (1 << EPOCH_SHIFT) - 1;
/// The longest a fail-back probe of the first store may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A lock over an ordered chain of stores. See the [module docs](self).
#[derive(Debug)]
pub struct Fallback {
    stores: Vec<Arc<dyn Backend>>,
    record: Arc<ModeRecord>,
    holdings: Holdings,
    switch_after: Duration,
    fail_back_after: Option<Duration>,
    /// The mode whose active store has been failing, and since when.
    failing: Mutex<Option<(Mode, Instant)>>,
    /// The mode this client last saw, since when, and its last fail-back probe.
    seen: Mutex<Option<(Mode, Instant, Option<Instant>)>>,
}

impl Fallback {
    /// A chain over `stores`, in order; the last one is the arbiter. Every
    /// client of the chain must list the same stores in the same order.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for fewer than two or more than
    /// [`MAX_STORES`] stores; [`Error::Unsupported`] for an arbiter without
    /// shared leases and [records](Backend::write_record) (etcd, ZooKeeper).
    pub fn new(stores: Vec<Arc<dyn Backend>>) -> Result<Self> {
        if !(2..=MAX_STORES).contains(&stores.len()) {
            return Err(Error::invalid(
                "fallback chain",
                format!("a chain needs 2 to {MAX_STORES} stores, got {}", stores.len()),
            ));
        }
        let arbiter = Arc::clone(stores.last().expect("checked: at least two"));
        let caps = arbiter.capabilities();
        if !caps.records || !caps.shared_leases || caps.session_bound {
            return Err(Error::Unsupported {
                store: arbiter.name(),
                what: "being a fallback chain's arbiter (the last store; it needs shared leases and records: \
                       SQLite, PostgreSQL, MySQL or Redis)",
            });
        }
        let n = stores.len();
        let record = ModeRecord::new(arbiter, n, record_key(DEFAULT_RECORD_NAME)?, DEFAULT_MODE_TTL, label());
        Ok(Fallback {
            stores,
            record: Arc::new(record),
            holdings: Holdings::default(),
            switch_after: DEFAULT_SWITCH_AFTER,
            fail_back_after: Some(DEFAULT_FAIL_BACK_AFTER),
            failing: Mutex::new(None),
            seen: Mutex::new(None),
        })
    }

    /// Names the mode record (default [`DEFAULT_RECORD_NAME`]): chains with
    /// different names switch independently. Every client of one chain
    /// must use the same name.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a name that makes no valid key.
    pub fn with_name(self, name: &str) -> Result<Self> {
        let record =
            ModeRecord::new(self.arbiter(), self.record.stores(), record_key(name)?, self.record.ttl(), label());
        Ok(Fallback { record: Arc::new(record), ..self })
    }

    /// Sets the mode lease TTL (default [`DEFAULT_MODE_TTL`], at least
    /// 200 ms): what a switch costs, and how often (half of it) each
    /// granting client reads the record on the arbiter. Every client of one
    /// chain should use the same TTL.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a TTL outside 200 ms..=the crate's
    /// [`MAX_TTL`](crate::LockOptions::MAX_TTL).
    pub fn with_mode_ttl(self, ttl: Duration) -> Result<Self> {
        check_ttl(ttl)?;
        if ttl < Duration::from_millis(200) {
            return Err(Error::invalid("fallback chain", format!("mode TTL {ttl:?} is below 200 ms")));
        }
        let record = ModeRecord::new(self.arbiter(), self.record.stores(), self.record.key().clone(), ttl, label());
        Ok(Fallback { record: Arc::new(record), ..self })
    }

    /// How long the active store must keep failing before this client asks
    /// for a switch (default [`DEFAULT_SWITCH_AFTER`]).
    pub fn with_switch_after(mut self, after: Duration) -> Self {
        self.switch_after = after;
        self
    }

    /// How long the chain runs on another store before this client probes
    /// the first store and, if it answers, switches back (default
    /// [`DEFAULT_FAIL_BACK_AFTER`]); `None` never fails back on its own
    /// ([`switch_to`](Self::switch_to) still does).
    pub fn with_fail_back_after(mut self, after: Option<Duration>) -> Self {
        self.fail_back_after = after;
        self
    }

    /// [`open_url`](Self::open_url), its members opened with `connect`.
    pub(crate) async fn open_url_with(url: &str, connect: crate::backend::ConnectFn) -> Result<Self> {
        config::open_url(url, connect).await
    }

    /// The mode this client last held a mode lease under, if that lease is
    /// still current.
    pub fn mode(&self) -> Option<Mode> {
        self.record.current().map(|l| l.mode)
    }

    /// Switches the chain to store `store` (an index into the chain), for
    /// operators and tests; returns the record's mode afterwards, which names
    /// another store if another client switched first. Waits about one mode
    /// TTL, during which nothing is granted.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an index outside the chain; the
    /// arbiter's errors.
    ///
    /// # Cancel safety
    ///
    /// The switch runs on a task of its own and completes if this future
    /// is dropped.
    pub async fn switch_to(&self, store: usize) -> Result<Mode> {
        if store >= self.stores.len() {
            return Err(Error::invalid(
                "fallback chain",
                format!("no store {store} in a chain of {}", self.stores.len()),
            ));
        }
        let from = self.record.lease_for(Duration::ZERO, true).await?.mode;
        if from.active == store {
            return Ok(from);
        }
        self.record.switch(from, store).await
    }
}

#[async_trait]
impl Backend for Fallback {
    fn name(&self) -> &'static str {
        "fallback"
    }

    fn capabilities(&self) -> Capabilities {
        let all: Vec<Capabilities> = self.stores.iter().map(|s| s.capabilities()).collect();
        let mut caps = Capabilities::minimal();
        caps.fair = all.iter().all(|c| c.fair);
        caps.always_fair = all.iter().all(|c| c.always_fair);
        caps.store_notification = all.iter().all(|c| c.store_notification);
        caps.counts_waiters = all.iter().all(|c| c.counts_waiters);
        caps.session_bound = all.iter().any(|c| c.session_bound);
        caps.shared_leases = all.iter().all(|c| c.shared_leases);
        caps.shrink = all.iter().all(|c| c.shrink);
        caps.fence_durability = FenceDurability::weakest(all.iter().map(|c| c.fence_durability));
        caps.renew_slice = all.iter().filter_map(|c| c.renew_slice).min().or(Some(256));
        caps
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        let lease = self.record.lease_for(self.need(req.ttl), false).await?;
        let store = lease.mode.active;
        let (store_req, token) = self.store_request(req, store);
        match self.stores[store].try_acquire(&store_req).await {
            Ok(Some(grant)) => {
                self.store_answered(lease.mode);
                self.count(req, store, token, grant).await
            }
            Ok(None) => {
                self.store_answered(lease.mode);
                // Nothing is held: forget the attempt (try_acquire never
                // queues), and let go of any earlier one of this request.
                for (s, t) in self.holdings.take(&req.key, req.token).0 {
                    if (s, t) != (store, token) {
                        self.let_go(&req.key, s, t);
                    }
                }
                Ok(None)
            }
            Err(e) => {
                if e.is_retryable() && self.store_failed(lease.mode) && !self.still_answers(lease.mode, store).await {
                    let (record, next) = (Arc::clone(&self.record), (store + 1) % self.stores.len());
                    tokio::spawn(async move {
                        let _ = record.switch(lease.mode, next).await;
                    });
                }
                Err(e)
            }
        }
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        let need = self.need(req.ttl);
        loop {
            let lease = self.record.lease_for(need, true).await?;
            self.maybe_fail_back(lease.mode);
            let store = lease.mode.active;
            let (store_req, token) = self.store_request(req, store);
            match self.wait_on(store, &store_req, lease, need).await {
                Waited::Granted(grant) => {
                    self.store_answered(lease.mode);
                    if let Some(grant) = self.count(req, store, token, grant).await? {
                        return Ok(grant);
                    }
                }
                Waited::Moved => self.let_go(&req.key, store, token),
                Waited::Failed(e) if e.is_retryable() && self.store_failed(lease.mode) => {
                    if self.still_answers(lease.mode, store).await {
                        return Err(e);
                    }
                    // The store has failed long enough: move the chain on,
                    // then wait under the new epoch.
                    self.record.switch(lease.mode, (store + 1) % self.stores.len()).await?;
                }
                Waited::Failed(e) => return Err(e),
            }
        }
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        let (attempts, ttl) = self.holdings.take(key, token);
        let Some(&last) = attempts.last() else { return Ok(false) };
        // The holdings entry is gone: a release sent again would find nothing
        // to release. So if this future is dropped before every store
        // answered, each store's release goes on on a task of its own.
        let mut in_flight = InFlight { chain: self, key, attempts: &attempts, ttl, answered: false };
        let results = join_all(attempts.iter().map(|&(s, t)| self.stores[s].release(key, t))).await;
        in_flight.answered = true;
        let mut released = false;
        let mut error = None;
        for (&(store, store_token), result) in attempts.iter().zip(results) {
            match result {
                Ok(r) => released |= r,
                Err(e) => {
                    self.release_later(store, key, store_token, ttl);
                    // The last attempt is the one that may hold: its outcome
                    // is the release's.
                    if (store, store_token) == last {
                        error = Some(e);
                    }
                }
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(released),
        }
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        let lease = self.record.lease_for(Duration::ZERO, false).await?;
        self.stores[lease.mode.active].resize(key, limit).await
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        match self.holdings.holding(key, token) {
            Some((store, store_token)) => self.stores[store].relabel(key, store_token, label).await,
            None => Ok(false),
        }
    }

    // In place on the one store that holds the grant, as relabel: its
    // fence, and so the chain's `epoch << 52 | fence`, stays.
    async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        let Some((store, store_token)) = self.holdings.holding(key, token) else { return Ok(false) };
        self.stores[store].shrink(key, store_token, to).await
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        let held: Vec<Option<(usize, OwnerToken)>> =
            leases.iter().map(|l| self.holdings.holding(&l.key, l.token)).collect();
        let mut out = vec![false; leases.len()];
        if held.iter().all(Option::is_none) {
            return Ok(out);
        }
        let need = leases.iter().map(|l| self.need(l.ttl)).max().unwrap_or_default();
        let lease = self.record.lease_for(need, false).await?;
        let store = lease.mode.active;
        // Only leases on the active store can still be vouched for.
        let (index, asked): (Vec<usize>, Vec<RenewRequest>) = leases
            .iter()
            .zip(&held)
            .enumerate()
            .filter_map(|(i, (l, h))| match h {
                Some((s, token)) if *s == store => {
                    Some((i, RenewRequest { key: l.key.clone(), token: *token, ttl: l.ttl }))
                }
                _ => None,
            })
            .unzip();
        if asked.is_empty() {
            return Ok(out);
        }
        let renewed = self.stores[store].renew(&asked).await?;
        self.store_answered(lease.mode);
        let now = Instant::now();
        for ((i, ok), req) in index.into_iter().zip(renewed).zip(&asked) {
            out[i] = ok && lease.until >= now + self.need(req.ttl);
        }
        Ok(out)
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        let mode = match self.record.current() {
            Some(l) => l.mode,
            None => self.record.lease_for(Duration::ZERO, false).await?.mode,
        };
        let mut status = self.stores[mode.active].status(key).await?;
        if let Some(h) = status.holder.as_mut() {
            h.fence = self.fence(mode, mode.active, h.fence).unwrap_or(h.fence);
        }
        for h in &mut status.shared {
            h.fence = self.fence(mode, mode.active, h.fence).unwrap_or(h.fence);
        }
        Ok(status)
    }
}

/// The record key of the chain named `name`.
fn record_key(name: &str) -> Result<LockKey> {
    LockKey::new(format!("holdfast-fallback/{name}"))
}

fn label() -> String {
    crate::lease::lock_options::default_label()
}

impl Fallback {
    /// Releases one store's grant on a task of its own, retried until the
    /// store has let it go by itself: the client's own retries stop at the
    /// end of its belief, which the mode lease may cut short of the store's
    /// TTL.
    fn release_later(&self, store: usize, key: &LockKey, store_token: OwnerToken, ttl: Duration) {
        let backend = Arc::clone(&self.stores[store]);
        let horizon = if backend.capabilities().session_bound {
            Horizon::Unknown
        } else {
            Horizon::At(Instant::now() + ttl + 2 * drift_margin(ttl))
        };
        let _ = Release { backend, key: key.clone(), token: store_token, horizon, observed: None }.spawn();
    }
}

/// The stores' releases of one [`Backend::release`] of the chain, in flight:
/// dropped before they all answered, it hands each to a task of its own.
struct InFlight<'a> {
    chain: &'a Fallback,
    key: &'a LockKey,
    attempts: &'a [holdings::Attempt],
    ttl: Duration,
    answered: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.answered {
            for &(store, store_token) in self.attempts {
                self.chain.release_later(store, self.key, store_token, self.ttl);
            }
        }
    }
}
