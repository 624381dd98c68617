//! A simulated lock store: the [`Backend`](holdfast::backend::Backend)
//! contract implemented in memory, for runs on tokio's paused clock that
//! explore what real servers rarely show.
//!
//! - Leases live on the store's **own clock**, which runs at a rate the run
//!   chooses (within the client's drift margin of 1%, or outside it to show
//!   what breaks).
//! - The lease model is the one every store implements (exclusive, writer
//!   and shared leases, reservations, the fair queue), decided by
//!   [`holdfast::backend::admission`], the rule the SQL stores use.
//! - Each client reaches the store over a [`Link`] that can lose a request,
//!   apply a request and lose its reply, delay either way, reorder, or be
//!   partitioned; a request already sent arrives even if the caller dropped
//!   its future, as on a real network.
//! - The store can [restart](SimStore::restart) with or without its data.
//! - Waiters are woken by the store's notification, which travels over the
//!   link like a reply (and can be lost: the fallback poll backs it up).
//! - Every grant, extension, release and restart is recorded in a
//!   [`Recorder`] when one is attached, for the [history checker](crate::history).
//!
//! All randomness comes from seeds (links here, the client core through
//! `holdfast::entropy`), so a run on a single-threaded paused runtime
//! replays bit for bit. The simulated store passes the conformance suite
//! like every real store (`tests/conformance/sim.rs`); it adds to the
//! real-server tests and never replaces one.

mod backend;
mod link;
pub mod run;
mod state;

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use holdfast::backend::Backend;
use holdfast::backend::wait::LocalWakeups;
use tokio::time::Instant;

pub use backend::SimBackend;
pub use link::{Link, LinkFaults, LinkState};
pub use state::CounterScope;
use state::StoreState;

use crate::history::{Event, GrantId, Recorder};

/// How a simulated store and its clients behave.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The store's index in histories.
    pub store: u32,
    /// How fast the store's clock runs against real time (1.0: exactly;
    /// the client's margin covers 0.99..=1.01).
    pub clock_rate: f64,
    /// The longest a client waits for one reply before it fails with a
    /// retryable error.
    pub op_timeout: Duration,
    /// The bounds of a waiter's fallback poll.
    pub poll: holdfast::backend::wait::PollBounds,
    /// The most leases per renew call.
    pub renew_slice: usize,
    /// How far one fence counter reaches: per key (Redis), the whole store
    /// (a SQLite file), or per key over one for the store (a PostgreSQL or
    /// MySQL namespace).
    pub counter_scope: CounterScope,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            store: 0,
            clock_rate: 1.0,
            op_timeout: Duration::from_millis(500),
            poll: holdfast::backend::wait::PollBounds {
                min: Duration::from_millis(50),
                max: Duration::from_millis(250),
            },
            renew_slice: 64,
            counter_scope: CounterScope::PerKey,
        }
    }
}

struct Subscriber {
    waiters: Weak<LocalWakeups>,
    link: Link,
}

struct Data {
    state: StoreState,
    up: bool,
    subscribers: Vec<Subscriber>,
}

pub(crate) struct StoreInner {
    config: SimConfig,
    origin: Instant,
    data: Mutex<Data>,
    recorder: Option<Recorder>,
}

impl std::fmt::Debug for StoreInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimStore").field("store", &self.config.store).finish_non_exhaustive()
    }
}

impl StoreInner {
    fn data(&self) -> std::sync::MutexGuard<'_, Data> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store's clock now.
    fn clock(&self) -> Duration {
        self.origin.elapsed().mul_f64(self.config.clock_rate)
    }

    /// The history's time of a store-clock time.
    fn history_time(&self, recorder: &Recorder, store_time: Duration) -> Duration {
        recorder.at(self.origin + store_time.div_f64(self.config.clock_rate))
    }

    fn record(&self, event: impl FnOnce(&Recorder) -> Event) {
        if let Some(r) = &self.recorder {
            r.record(event(r));
        }
    }

    fn grant_id(&self, token: holdfast::OwnerToken) -> GrantId {
        GrantId { store: self.config.store, token: token.as_u128() }
    }

    /// Tells every client's waiters of `key`, over its link, that it may be free.
    fn notify(&self, subscribers: &mut Vec<Subscriber>, key: &str) {
        subscribers.retain(|s| s.waiters.strong_count() > 0);
        for s in subscribers.iter() {
            let (Some(delay), Some(waiters)) = (s.link.notification_delay(), s.waiters.upgrade()) else { continue };
            let key = key.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                waiters.wake_one(&key);
            });
        }
    }
}

/// One simulated store. Cheap to clone; clones are the same store.
#[derive(Debug, Clone)]
pub struct SimStore {
    inner: Arc<StoreInner>,
}

impl SimStore {
    /// A store whose clock starts now, recording into `recorder` if given.
    pub fn new(config: SimConfig, recorder: Option<Recorder>) -> Self {
        let data = Data { state: StoreState::new(config.counter_scope), up: true, subscribers: Vec::new() };
        SimStore { inner: Arc::new(StoreInner { config, origin: Instant::now(), data: Mutex::new(data), recorder }) }
    }

    /// A client's backend over a new link with these faults, seeded with `seed`.
    pub fn connect(&self, seed: u64, faults: LinkFaults) -> (Arc<dyn Backend>, Link) {
        let link = Link::new(seed, faults);
        let backend = SimBackend::new(self.inner.clone(), link.clone());
        self.inner.data().subscribers.push(Subscriber { waiters: backend.waiters(), link: link.clone() });
        (Arc::new(backend), link)
    }

    /// Stops the store for `down_for`, then starts it again, with its data
    /// or without (every lease, reservation, record and fence counter gone).
    /// Requests that arrive while it is down are refused.
    pub fn restart(&self, keep_state: bool, down_for: Duration) {
        {
            let mut d = self.inner.data();
            d.up = false;
            if !keep_state {
                d.state = StoreState::new(self.inner.config.counter_scope);
            }
        }
        let store = self.inner.config.store;
        self.inner.record(|r| Event::StoreRestarted { store, at: r.now(), kept_state: keep_state });
        let inner = self.inner.clone();
        tokio::spawn(async move {
            tokio::time::sleep(down_for).await;
            inner.data().up = true;
        });
    }

    /// Every live lease and reservation now, as `(key, token, held)`.
    pub fn live_rows(&self) -> Vec<(String, u128, bool)> {
        let now = self.inner.clock();
        let rows = self.inner.data().state.live_rows(now);
        rows.into_iter().map(|(k, t, h)| (k, u128::from_be_bytes(t), h)).collect()
    }
}
