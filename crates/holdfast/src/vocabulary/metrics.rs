//! Metrics, through the [`metrics`] facade crate: holdfast only emits; the
//! application installs a recorder (a Prometheus exporter, StatsD, ...) and
//! holdfast's numbers go wherever its other metrics go. Without a recorder
//! every emission is a no-op on a handle registered once (no allocation, no
//! lookup per call).
//!
//! Handles are registered with the recorder in force when a client first
//! uses a key prefix (and, for store-wide metrics, when the client is made):
//! install the recorder before connecting.
//!
//! # Labels
//!
//! - `store`: the store's name ([`Client::store_name`](crate::Client::store_name):
//!   `sqlite`, `redis`, `etcd`, ...).
//! - `prefix`: a bounded label for the key, never the key itself
//!   ([`prefix_label`]): the key up to its first `:` or `/` if that part is 1
//!   to 32 characters of `A-Z a-z 0-9 _ - .`; `(none)` for a key without a
//!   separator; `(other)` for any other key, and for every new prefix once a
//!   client has seen [`MAX_PREFIXES`]. So `order:42` and `order/43` are both
//!   `order`, and one client adds at most 65 values.
//! - `outcome`, `cause`, `op`, `kind`: small fixed sets, listed below.
//!
//! # The metrics
//!
//! | name | type | labels | what |
//! | --- | --- | --- | --- |
//! | `holdfast_acquire_total` | counter | store, prefix, outcome | acquire calls by outcome: `granted`, `busy` (a `try_acquire` that found the key busy), `timeout` (the wait deadline passed), `error` (anything else: store failure, bad input, conflict) |
//! | `holdfast_acquire_attempts_total` | counter | store, prefix | store attempts made by acquires: one per `try_acquire`; for a waiting acquire, one per attempt of the client's shared waiting loop (SQLite, Redis, PostgreSQL, MySQL), at least one per store call (etcd and ZooKeeper queue in the store: one per call) |
//! | `holdfast_acquire_seconds` | histogram | store, prefix, outcome | acquire latency, from the call to its outcome, by the outcome above |
//! | `holdfast_wait_seconds` | histogram | store, prefix | time a granted or timed-out waiting acquire spent on a busy key: from its first busy reply to the grant or the deadline. Recorded only where the key was found busy, on stores whose waiting loop is the client's (not etcd, ZooKeeper) |
//! | `holdfast_handoff_seconds` | histogram | store, prefix | hand-off latency: from the moment a waiter was woken by the store's notification (a release elsewhere) to its grant. Same stores as `holdfast_wait_seconds`; grants found by the fallback poll are not counted |
//! | `holdfast_release_total` | counter | store, prefix, outcome | releases of guards (`release()` and drop) by the first attempt's outcome: `released`, `not_held` (the lease was lost, or the store held no grant of it), `error` |
//! | `holdfast_renew_total` | counter | store, prefix, outcome | lease renewals, one per lease per renewal call: `renewed`, `gone` (the store no longer held it), `error` (the call failed or timed out; retried) |
//! | `holdfast_renew_seconds` | histogram | store | round trip of one renewal call (it carries up to the store's slice of leases) |
//! | `holdfast_renew_lag_seconds` | histogram | store, prefix | how late each lease's renewal was sent after its schedule (0 when on time or early) |
//! | `holdfast_leases_held` | gauge | store, prefix | leases granted to this process whose guard is alive (a leaked guard stops counting) |
//! | `holdfast_lost_total` | counter | store, prefix, cause | leases lost while their guard lived, once each: `renewal` (a renewal found the grant gone), `release` (the release found it gone), `deadline` (the local deadline passed unrenewed: renewals failed or came late, renewal off or capped), `session` (the store's session ended) |
//! | `holdfast_store_errors_total` | counter | store, op, kind | failed store calls made by the client core: `op` is `acquire`, `release`, `renew` or `status`; `kind` is `transient` (retryable), `permanent`, or `timeout` (a renewal call that outlived the lease) |
//! | `holdfast_store_connect_errors_total` | counter | store | failed connection attempts of a composite's member that was unreachable when the composite was built ([`connect_or_defer`](crate::stores::connect_or_defer)): the first, then one per background retry until it connects |
//! | `holdfast_stores_unconnected` | gauge | store | such members not connected yet (each counts as a failing store meanwhile) |

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, SharedString};
use tokio::time::Instant;

use crate::vocabulary::error::Error;

/// Acquire calls by outcome (counter).
pub const ACQUIRE_TOTAL: &str = "holdfast_acquire_total";
/// Store attempts made by acquires (counter).
pub const ACQUIRE_ATTEMPTS_TOTAL: &str = "holdfast_acquire_attempts_total";
/// Acquire latency by outcome (histogram, seconds).
pub const ACQUIRE_SECONDS: &str = "holdfast_acquire_seconds";
/// Time waiting acquires spent on a busy key (histogram, seconds).
pub const WAIT_SECONDS: &str = "holdfast_wait_seconds";
/// From a waiter's wake-up to its grant (histogram, seconds).
pub const HANDOFF_SECONDS: &str = "holdfast_handoff_seconds";
/// Releases of guards by outcome (counter).
pub const RELEASE_TOTAL: &str = "holdfast_release_total";
/// Lease renewals by outcome (counter).
pub const RENEW_TOTAL: &str = "holdfast_renew_total";
/// Round trip of one renewal call (histogram, seconds).
pub const RENEW_SECONDS: &str = "holdfast_renew_seconds";
/// How late renewals ran against their schedule (histogram, seconds).
pub const RENEW_LAG_SECONDS: &str = "holdfast_renew_lag_seconds";
/// Leases held by live guards (gauge).
pub const LEASES_HELD: &str = "holdfast_leases_held";
/// Leases lost while their guard lived, by cause (counter).
pub const LOST_TOTAL: &str = "holdfast_lost_total";
/// Failed store calls by operation and kind (counter).
pub const STORE_ERRORS_TOTAL: &str = "holdfast_store_errors_total";

/// Failed connection attempts of deferred members (counter).
pub const STORE_CONNECT_ERRORS_TOTAL: &str = "holdfast_store_connect_errors_total";
/// Deferred members not connected yet (gauge).
pub const STORES_UNCONNECTED: &str = "holdfast_stores_unconnected";

/// The most distinct `prefix` label values one client emits; later new
/// prefixes are `(other)`.
pub const MAX_PREFIXES: usize = 64;
/// The `prefix` of a key without `:` or `/`.
pub const NO_PREFIX: &str = "(none)";
/// The `prefix` of a key whose prefix is not a short plain word, and of new
/// prefixes past [`MAX_PREFIXES`].
pub const OTHER_PREFIX: &str = "(other)";
const MAX_PREFIX_LEN: usize = 32;

/// The `prefix` label of `key` (see the [module docs](self#labels)), before
/// the per-client bound of [`MAX_PREFIXES`].
///
/// ```
/// use holdfast::metrics::prefix_label;
/// assert_eq!(prefix_label("order:42"), "order");
/// assert_eq!(prefix_label("jobs/nightly/report"), "jobs");
/// assert_eq!(prefix_label("nightly-report"), "(none)");
/// assert_eq!(prefix_label("user id 7:x"), "(other)");
/// ```
pub fn prefix_label(key: &str) -> &str {
    let Some(end) = key.find([':', '/']) else { return NO_PREFIX };
    let p = &key[..end];
    let plain = p.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if p.is_empty() || p.len() > MAX_PREFIX_LEN || !plain { OTHER_PREFIX } else { p }
}

/// Why a lease was lost (the `cause` label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum LostCause {
    Renewal,
    Release,
    Deadline,
    Session,
}

/// Which store call failed (the `op` label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Acquire = 0,
    Release = 1,
    Renew = 2,
    Status = 3,
}

/// Store-wide handles, shared by a client's key handles.
#[derive(Debug)]
pub(crate) struct StoreCounters {
    /// By op, then transient / permanent / timeout.
    errors: [[Counter; 3]; 4],
    pub(crate) renew_seconds: Histogram,
}

impl StoreCounters {
    fn new(store: &'static str) -> Self {
        let errors = ["acquire", "release", "renew", "status"].map(|op| {
            ["transient", "permanent", "timeout"]
                .map(|kind| metrics::counter!(STORE_ERRORS_TOTAL, "store" => store, "op" => op, "kind" => kind))
        });
        StoreCounters { errors, renew_seconds: metrics::histogram!(RENEW_SECONDS, "store" => store) }
    }

    /// Counts a failed store call (only store failures: not bad input).
    pub(crate) fn store_error(&self, op: Op, e: &Error) {
        if let Error::Backend { retryable, .. } = e {
            self.errors[op as usize][usize::from(!*retryable)].increment(1);
        }
    }

    /// Counts a store call that outlived its deadline.
    pub(crate) fn store_timeout(&self, op: Op) {
        self.errors[op as usize][2].increment(1);
    }
}

/// The handles of one client for one key prefix.
#[derive(Debug)]
pub(crate) struct KeyMetrics {
    pub(crate) store: Arc<StoreCounters>,
    /// granted, busy, timeout, error; counters then latency histograms.
    acquire: [Counter; 4],
    acquire_seconds: [Histogram; 4],
    pub(crate) attempts: Counter,
    pub(crate) wait_seconds: Histogram,
    pub(crate) handoff_seconds: Histogram,
    /// released, not_held, error.
    release: [Counter; 3],
    /// renewed, gone, error.
    renew: [Counter; 3],
    pub(crate) renew_lag: Histogram,
    pub(crate) leases_held: Gauge,
    /// renewal, release, deadline, session.
    lost: [Counter; 4],
}

/// How an acquire ended (the `outcome` label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum AcquireOutcome {
    Granted = 0,
    Busy = 1,
    Timeout = 2,
    Error = 3,
}

impl AcquireOutcome {
    pub(crate) fn name(self) -> &'static str {
        ["granted", "busy", "timeout", "error"][self as usize]
    }
}

impl KeyMetrics {
    fn new(store: &'static str, prefix: &str, counters: Arc<StoreCounters>) -> Self {
        let prefix = SharedString::from(prefix.to_owned());
        let p = || prefix.clone();
        let outcomes = ["granted", "busy", "timeout", "error"];
        KeyMetrics {
            store: counters,
            acquire: outcomes
                .map(|o| metrics::counter!(ACQUIRE_TOTAL, "store" => store, "prefix" => p(), "outcome" => o)),
            acquire_seconds: outcomes
                .map(|o| metrics::histogram!(ACQUIRE_SECONDS, "store" => store, "prefix" => p(), "outcome" => o)),
            attempts: metrics::counter!(ACQUIRE_ATTEMPTS_TOTAL, "store" => store, "prefix" => p()),
            wait_seconds: metrics::histogram!(WAIT_SECONDS, "store" => store, "prefix" => p()),
            handoff_seconds: metrics::histogram!(HANDOFF_SECONDS, "store" => store, "prefix" => p()),
            release: ["released", "not_held", "error"]
                .map(|o| metrics::counter!(RELEASE_TOTAL, "store" => store, "prefix" => p(), "outcome" => o)),
            renew: ["renewed", "gone", "error"]
                .map(|o| metrics::counter!(RENEW_TOTAL, "store" => store, "prefix" => p(), "outcome" => o)),
            renew_lag: metrics::histogram!(RENEW_LAG_SECONDS, "store" => store, "prefix" => p()),
            leases_held: metrics::gauge!(LEASES_HELD, "store" => store, "prefix" => p()),
            lost: ["renewal", "release", "deadline", "session"]
                .map(|c| metrics::counter!(LOST_TOTAL, "store" => store, "prefix" => p(), "cause" => c)),
        }
    }

    /// Handles that record nothing (leases made outside a client, in tests).
    #[cfg(test)]
    pub(crate) fn noop() -> Arc<Self> {
        Arc::new(metrics::with_local_recorder(&metrics::NoopRecorder, || {
            Self::new("none", "", Arc::new(StoreCounters::new("none")))
        }))
    }

    pub(crate) fn acquired(&self, outcome: AcquireOutcome, took: Duration) {
        self.acquire[outcome as usize].increment(1);
        self.acquire_seconds[outcome as usize].record(took);
    }

    /// Counts a guard's release by its outcome: `released`, `not_held`, `error`.
    pub(crate) fn released(&self, outcome: &str) {
        let i = match outcome {
            "released" => 0,
            "not_held" => 1,
            _ => 2,
        };
        self.release[i].increment(1);
    }

    /// Counts `n` lease renewals: `Some(true)` renewed, `Some(false)` gone,
    /// `None` failed.
    pub(crate) fn renewed(&self, held: Option<bool>) {
        let i = match held {
            Some(true) => 0,
            Some(false) => 1,
            None => 2,
        };
        self.renew[i].increment(1);
    }

    pub(crate) fn lost(&self, cause: LostCause) {
        self.lost[cause as usize].increment(1);
    }
}

/// A client's metric handles: store-wide ones, and one set per key prefix
/// registered on first use.
#[derive(Debug)]
pub(crate) struct ClientMetrics {
    store: &'static str,
    pub(crate) counters: Arc<StoreCounters>,
    prefixes: Mutex<HashMap<Box<str>, Arc<KeyMetrics>>>,
}

impl ClientMetrics {
    pub(crate) fn new(store: &'static str) -> Self {
        describe();
        ClientMetrics { store, counters: Arc::new(StoreCounters::new(store)), prefixes: Mutex::default() }
    }

    /// The handles for `key`'s prefix: a lookup in a small map, no
    /// allocation once the prefix was seen.
    pub(crate) fn key(&self, key: &str) -> Arc<KeyMetrics> {
        let mut prefixes = self.prefixes.lock().unwrap_or_else(|p| p.into_inner());
        let mut label = prefix_label(key);
        if let Some(m) = prefixes.get(label) {
            return m.clone();
        }
        if prefixes.len() >= MAX_PREFIXES {
            label = OTHER_PREFIX;
            if let Some(m) = prefixes.get(label) {
                return m.clone();
            }
        }
        let m = Arc::new(KeyMetrics::new(self.store, label, self.counters.clone()));
        prefixes.insert(label.into(), m.clone());
        m
    }
}

/// Describes every metric to the recorder in force (units and help text).
fn describe() {
    use metrics::Unit;
    metrics::describe_counter!(ACQUIRE_TOTAL, "Acquire calls by outcome");
    metrics::describe_counter!(ACQUIRE_ATTEMPTS_TOTAL, "Store attempts made by acquires");
    metrics::describe_histogram!(ACQUIRE_SECONDS, Unit::Seconds, "Acquire latency by outcome");
    metrics::describe_histogram!(WAIT_SECONDS, Unit::Seconds, "Time waiting acquires spent on a busy key");
    metrics::describe_histogram!(HANDOFF_SECONDS, Unit::Seconds, "From a waiter's wake-up to its grant");
    metrics::describe_counter!(RELEASE_TOTAL, "Releases of guards by outcome");
    metrics::describe_counter!(RENEW_TOTAL, "Lease renewals by outcome");
    metrics::describe_histogram!(RENEW_SECONDS, Unit::Seconds, "Round trip of one renewal call");
    metrics::describe_histogram!(RENEW_LAG_SECONDS, Unit::Seconds, "How late renewals ran against their schedule");
    metrics::describe_gauge!(LEASES_HELD, "Leases held by live guards");
    metrics::describe_counter!(LOST_TOTAL, "Leases lost while their guard lived, by cause");
    metrics::describe_counter!(STORE_ERRORS_TOTAL, "Failed store calls by operation and kind");
}

tokio::task_local! {
    /// What the store's waiting loop saw during one waiting acquire.
    static PROBE: Probe;
}

/// What the waiting loop reports to the acquire that runs it.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    attempts: std::cell::Cell<u64>,
    first_busy: std::cell::Cell<Option<Instant>>,
    woken: std::cell::Cell<Option<Instant>>,
    transient_errors: std::cell::Cell<u64>,
}

impl Probe {
    /// Runs a waiting acquire's store calls with a probe the waiting loop
    /// reports to, and returns the probe with the outcome.
    pub(crate) async fn run<T>(fut: impl std::future::Future<Output = T>) -> (T, Probe) {
        let scoped = PROBE.scope(Probe::default(), fut);
        tokio::pin!(scoped);
        let out = scoped.as_mut().await;
        (out, scoped.take_value().unwrap_or_default())
    }

    /// Records what the probe saw for an acquire that ended at `end`.
    pub(crate) fn record(&self, m: &KeyMetrics, calls: u64, granted: bool, end: Instant) {
        m.attempts.increment(self.attempts.get().max(calls));
        m.store.errors[Op::Acquire as usize][0].increment(self.transient_errors.get());
        if let Some(busy) = self.first_busy.get() {
            m.wait_seconds.record(end.saturating_duration_since(busy));
        }
        if let (true, Some(woken)) = (granted, self.woken.get()) {
            m.handoff_seconds.record(end.saturating_duration_since(woken));
        }
    }
}

/// Called by a waiting loop before each store attempt.
pub(crate) fn note_attempt() {
    let _ = PROBE.try_with(|p| {
        p.attempts.set(p.attempts.get() + 1);
        // A new attempt after a wake-up that was not granted: the next
        // hand-off starts at the next wake-up.
    });
}

/// Called by the waiting policy when a store call failed and is retried.
pub(crate) fn note_transient_error() {
    let _ = PROBE.try_with(|p| p.transient_errors.set(p.transient_errors.get() + 1));
}

/// Called by a waiting loop when an attempt found the key busy.
pub(crate) fn note_busy() {
    let _ = PROBE.try_with(|p| {
        if p.first_busy.get().is_none() {
            p.first_busy.set(Some(Instant::now()));
        }
        p.woken.set(None);
    });
}

/// Called by a waiting loop woken by the store's notification.
pub(crate) fn note_woken() {
    let _ = PROBE.try_with(|p| p.woken.set(Some(Instant::now())));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_bounded() {
        assert_eq!(prefix_label("a:b:c"), "a");
        assert_eq!(prefix_label(":x"), OTHER_PREFIX);
        assert_eq!(prefix_label(&format!("{}:x", "p".repeat(33))), OTHER_PREFIX);
        assert_eq!(prefix_label(&format!("{}:x", "p".repeat(32))), "p".repeat(32));
        let m = ClientMetrics::new("test");
        for i in 0..MAX_PREFIXES + 10 {
            m.key(&format!("p{i}:k"));
        }
        let prefixes = m.prefixes.lock().unwrap();
        assert_eq!(prefixes.len(), MAX_PREFIXES + 1);
        assert!(prefixes.contains_key(OTHER_PREFIX));
    }
}
