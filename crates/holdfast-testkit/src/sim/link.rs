//! The network between one client and a simulated store: every request and
//! reply can be delayed, lost, or stopped by a partition, from the link's
//! own seeded generator, so a run replays from its seed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// How a link misbehaves. The default is a clean link: no loss, no delay.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkFaults {
    /// Chance that a request never arrives.
    pub lose_request: f64,
    /// Chance that a request is applied and its reply never arrives.
    pub lose_reply: f64,
    /// Shortest one-way delay.
    pub min_delay: Duration,
    /// Longest one-way delay (a delay is uniform in between).
    pub max_delay: Duration,
    /// Chance that a message is slow: delayed up to [`slow_delay`](Self::slow_delay).
    pub slow: f64,
    /// Longest delay of a slow message (past the client's timeout, a
    /// request still arrives: applied late).
    pub slow_delay: Duration,
    /// Requests may overtake each other (as over several connections);
    /// otherwise the link delivers in the order sent, as one TCP connection.
    pub reorder: bool,
}

impl Default for LinkFaults {
    fn default() -> Self {
        LinkFaults {
            lose_request: 0.0,
            lose_reply: 0.0,
            min_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
            slow: 0.0,
            slow_delay: Duration::ZERO,
            reorder: false,
        }
    }
}

/// Whether a link carries traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Requests and replies flow (subject to [`LinkFaults`]).
    Up,
    /// Nothing gets through either way: requests are lost, replies too.
    Partitioned,
}

/// What happens to one request: when it reaches the store (`None`: never)
/// and how long its reply takes (`None`: lost).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub(crate) arrives: Option<Instant>,
    pub(crate) reply_after: Option<Duration>,
    /// The request's place among the in-order requests of a FIFO link: it
    /// is applied only after every earlier one (timers due in the same
    /// millisecond fire in no set order).
    pub(crate) place: Option<u64>,
}

#[derive(Debug)]
struct Inner {
    rng: StdRng,
    faults: LinkFaults,
    state: LinkState,
    /// When the last in-order request arrives (FIFO links).
    last_arrival: Option<Instant>,
    /// Places given to in-order requests so far.
    places: u64,
}

/// One client's link to a store. Cheap to clone; clones share the link.
#[derive(Debug, Clone)]
pub struct Link {
    inner: Arc<Mutex<Inner>>,
    /// How many in-order requests have been applied.
    applied: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Link {
    /// A link whose faults are drawn from a generator seeded with `seed`.
    pub fn new(seed: u64, faults: LinkFaults) -> Self {
        Link {
            inner: Arc::new(Mutex::new(Inner {
                rng: StdRng::seed_from_u64(seed),
                faults,
                state: LinkState::Up,
                last_arrival: None,
                places: 0,
            })),
            applied: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes how the link misbehaves from now on.
    pub fn set_faults(&self, faults: LinkFaults) {
        self.lock().faults = faults;
    }

    /// Cuts the link or restores it.
    pub fn set_state(&self, state: LinkState) {
        self.lock().state = state;
    }

    /// Whether the link is up.
    pub fn state(&self) -> LinkState {
        self.lock().state
    }

    /// Decides the fate of a request sent now.
    pub(crate) fn plan(&self) -> Plan {
        let mut l = self.lock();
        let now = Instant::now();
        let Inner { rng, faults, state, last_arrival, places } = &mut *l;
        // Draw every value whatever the outcome, so one fault does not shift
        // the draws of the requests after it.
        let (lose_request, lose_reply) = (rng.random_bool(faults.lose_request), rng.random_bool(faults.lose_reply));
        let (there, back) = (delay(rng, faults), delay(rng, faults));
        if *state == LinkState::Partitioned || lose_request {
            return Plan { arrives: None, reply_after: None, place: None };
        }
        let mut arrives = now + there;
        let mut place = None;
        if !faults.reorder {
            arrives = arrives.max(last_arrival.unwrap_or(arrives));
            *last_arrival = Some(arrives);
            place = Some(*places);
            *places += 1;
        }
        Plan { arrives: Some(arrives), reply_after: (!lose_reply).then_some(back), place }
    }

    /// Waits until every in-order request before `place` was applied.
    pub(crate) async fn turn(&self, place: u64) {
        let mut applied = self.applied.subscribe();
        // The sender lives in `self`: the wait ends when the count gets there.
        let _ = applied.wait_for(|n| *n >= place).await;
    }

    /// Marks the in-order request at `place` applied.
    pub(crate) fn applied(&self, place: u64) {
        self.applied.send_modify(|n| *n = (*n).max(place + 1));
    }

    /// Whether a reply (or a notification) sent now gets through.
    pub(crate) fn carries_back(&self) -> bool {
        self.lock().state == LinkState::Up
    }

    /// The delay of a notification from the store, or `None` if it is lost.
    pub(crate) fn notification_delay(&self) -> Option<Duration> {
        let mut l = self.lock();
        let Inner { rng, faults, state, .. } = &mut *l;
        let lost = rng.random_bool(faults.lose_reply);
        let delay = delay(rng, faults);
        (*state == LinkState::Up && !lost).then_some(delay)
    }
}

/// One message's delay.
fn delay(rng: &mut StdRng, faults: &LinkFaults) -> Duration {
    let slow = rng.random_bool(faults.slow);
    let (min, max) = if slow { (faults.max_delay, faults.slow_delay) } else { (faults.min_delay, faults.max_delay) };
    if max > min { rng.random_range(min..=max) } else { min }
}
