//! What a simulated store keeps: per key, its leases and reservations with
//! expiries on the store's own clock and the record kept with it, and the
//! fence counter: one per key, one for the whole store as SQLite keeps
//! per file, or PostgreSQL's and MySQL's per key over one per namespace
//! ([`CounterScope`]).
//! Every method is one atomic store operation, applied when a request
//! arrives over its link.

use std::collections::BTreeMap;
use std::time::Duration;

use holdfast::backend::admission::{self, Decision, Row, Shrink};
use holdfast::backend::{AcquireRequest, HolderInfo, LeaseMode, LockStatus, RenewRequest};

/// The highest fence floor the simulated store takes: 2^62, as the SQL
/// stores take, leaving 2^62 fences above it.
pub(crate) const MAX_FENCE_FLOOR: u64 = 1 << 62;

/// One row of a key: a held lease or a waiting request's reservation.
#[derive(Debug, Clone)]
struct Entry {
    token: [u8; 16],
    mode: LeaseMode,
    held: bool,
    /// A held lease's fence, or a reservation's place in the queue.
    order: u64,
    label: String,
    /// When the store lets the row go, on the store's clock.
    expires: Duration,
}

#[derive(Debug, Default, Clone)]
struct KeyState {
    entries: Vec<Entry>,
    /// The last fence or place handed out; survives release.
    counter: u64,
}

/// What an acquire did, for the store's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// A new grant with this fence.
    Granted(u64),
    /// The token held the key already; its lease was extended.
    Extended(u64),
    /// Busy; the holder's time left if one holds it exclusively.
    Busy(Option<Duration>),
    /// The request names another limit than the key's shared leases.
    Conflict(String),
}

/// How far one fence counter of a store reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CounterScope {
    /// One counter per key (Redis: a lock hash's last fence).
    #[default]
    PerKey,
    /// One counter for every key of the store: SQLite's per file (and
    /// MySQL's per namespace, for mutexes until 2026-11-29 and for shares
    /// until 2026-12-01). A grant or a raised floor on one key moves every
    /// key's later fences.
    PerStore,
    /// PostgreSQL's and MySQL's per-key fences (every mode of lease, on
    /// MySQL since 2026-12-01): a key's counter lives with its row,
    /// which a release keeps; a key without a row (never used, or swept)
    /// draws its first fence from the store's counter, and a swept row
    /// raises the store's counter to its fence. Here every key without a
    /// live row is swept at each release (a keep period of nothing, the
    /// harshest the model `pg_fence` allows); a raised floor moves the key's
    /// fence only.
    KeyRows,
}

/// The data of one simulated store.
#[derive(Debug, Default, Clone)]
pub(crate) struct StoreState {
    keys: BTreeMap<String, KeyState>,
    scope: CounterScope,
    /// The store's one counter, under [`CounterScope::PerStore`].
    counter: u64,
    /// The records kept with keys (never expire).
    records: BTreeMap<String, u64>,
}

impl StoreState {
    /// An empty store whose fence counters reach as far as `scope`.
    pub(crate) fn new(scope: CounterScope) -> Self {
        StoreState { scope, ..StoreState::default() }
    }

    /// The live rows of `key` at store time `now` (expired ones dropped).
    fn key(&mut self, key: &str, now: Duration) -> &mut KeyState {
        // A key without a row starts from the store's counter (KeyRows).
        let start = if self.scope == CounterScope::KeyRows { self.counter } else { 0 };
        let k = self.keys.entry(key.to_owned()).or_insert_with(|| KeyState { counter: start, ..KeyState::default() });
        k.entries.retain(|e| e.expires > now);
        k
    }

    /// Runs `f` on `key`'s live rows with the key's counter; under
    /// [`CounterScope::PerStore`] that counter is the store's one counter.
    fn with_key<R>(&mut self, key: &str, now: Duration, f: impl FnOnce(&mut KeyState) -> R) -> R {
        let (shared, scope) = (self.counter, self.scope);
        let new_row = !self.keys.contains_key(key);
        let k = self.key(key, now);
        if scope == CounterScope::PerStore || (scope == CounterScope::KeyRows && new_row) {
            k.counter = shared;
        }
        let out = f(k);
        let after = k.counter;
        if scope == CounterScope::PerStore || (scope == CounterScope::KeyRows && new_row) {
            self.counter = after;
        }
        out
    }

    /// [`CounterScope::KeyRows`]: deletes every key without a live row,
    /// raising the store's counter to its fence (PostgreSQL's and MySQL's sweep).
    fn sweep(&mut self, now: Duration) {
        if self.scope != CounterScope::KeyRows {
            return;
        }
        let counter = &mut self.counter;
        self.keys.retain(|_, k| {
            k.entries.retain(|e| e.expires > now);
            let keep = !k.entries.is_empty();
            if !keep {
                *counter = (*counter).max(k.counter);
            }
            keep
        });
    }

    /// One attempt. A waiting request (`reserve`) that is refused leaves or
    /// refreshes a reservation when its mode reserves or it asks to be fair.
    pub(crate) fn acquire(&mut self, req: &AcquireRequest, now: Duration, reserve: bool) -> Acquired {
        self.with_key(req.key.as_str(), now, |k| Self::acquire_in(k, req, now, reserve))
    }

    fn acquire_in(k: &mut KeyState, req: &AcquireRequest, now: Duration, reserve: bool) -> Acquired {
        let token = req.token.to_bytes();
        let rows: Vec<Row> =
            k.entries.iter().map(|e| Row { token: e.token, mode: e.mode, held: e.held, order: e.order }).collect();
        let decision = admission::decide(token, req.mode, &rows);
        let own_place = rows.iter().find(|r| !r.held && r.token == token).map(|r| r.order);
        // Fair: nobody passes an older reservation (of any mode).
        let passes_queue = |decision: &Decision| {
            matches!(decision, Decision::Grant)
                && req.fair
                && rows.iter().any(|r| !r.held && r.token != token && own_place.is_none_or(|mine| r.order < mine))
        };
        let decision =
            if passes_queue(&decision) { Decision::Refuse { reserve: true, keep_order: own_place } } else { decision };
        match decision {
            Decision::AlreadyHeld { fence } => {
                for e in k.entries.iter_mut().filter(|e| e.token == token && e.held) {
                    e.expires = now + req.ttl;
                }
                Acquired::Extended(fence)
            }
            Decision::Grant => {
                k.entries.retain(|e| e.token != token);
                // The request's fence floor (0: none) is the least fence; the
                // counter stands at the fence (never set to the floor below it).
                k.counter = (k.counter + 1).max(req.fence_floor);
                let fence = k.counter;
                let (label, mode, expires) = (req.label.clone(), req.mode, now + req.ttl);
                k.entries.push(Entry { token, mode, held: true, order: fence, label, expires });
                Acquired::Granted(fence)
            }
            Decision::Refuse { reserve: reserves, keep_order } => {
                if reserve && (reserves || req.fair) {
                    let order = keep_order.unwrap_or_else(|| {
                        k.counter += 1;
                        k.counter
                    });
                    k.entries.retain(|e| e.token != token);
                    let (label, mode, expires) = (req.label.clone(), req.mode, now + req.ttl);
                    k.entries.push(Entry { token, mode, held: false, order, label, expires });
                }
                let left = k.entries.iter().filter(|e| e.held).map(|e| e.expires.saturating_sub(now)).min();
                Acquired::Busy(left)
            }
            Decision::Conflict(why) => Acquired::Conflict(why),
        }
    }

    /// Removes `token`'s lease or reservation; whether it held a lease.
    pub(crate) fn release(&mut self, key: &str, token: [u8; 16], now: Duration) -> bool {
        let k = self.key(key, now);
        let held = k.entries.iter().any(|e| e.token == token && e.held);
        k.entries.retain(|e| e.token != token);
        self.sweep(now);
        held
    }

    /// Extends each listed lease its token still holds.
    pub(crate) fn renew(&mut self, leases: &[RenewRequest], now: Duration) -> Vec<bool> {
        leases
            .iter()
            .map(|l| {
                let token = l.token.to_bytes();
                let k = self.key(l.key.as_str(), now);
                let mut held = false;
                for e in k.entries.iter_mut().filter(|e| e.token == token && e.held) {
                    e.expires = now + l.ttl;
                    held = true;
                }
                held
            })
            .collect()
    }

    /// Who holds `key` and how many wait.
    pub(crate) fn status(&mut self, key: &str, now: Duration) -> LockStatus {
        let k = self.key(key, now);
        let info = |e: &Entry| HolderInfo {
            label: e.label.clone(),
            fence: e.order,
            ttl_left: Some(e.expires.saturating_sub(now)),
            weight: e.mode.weight(),
        };
        let held = || k.entries.iter().filter(|e| e.held);
        LockStatus {
            key: key.to_owned(),
            holder: held().find(|e| e.mode.is_exclusive()).map(info),
            shared: held().filter(|e| !e.mode.is_exclusive()).map(info).collect(),
            limit: held().find_map(|e| e.mode.limit()),
            waiters: Some(k.entries.iter().filter(|e| !e.held).count() as u64),
        }
    }

    /// Makes `token`'s held lease of `key` the smaller mode `to` (see
    /// [`admission::shrunk`]); its fence and expiry stay.
    pub(crate) fn shrink(&mut self, key: &str, token: [u8; 16], to: LeaseMode, now: Duration) -> Shrink {
        let k = self.key(key, now);
        let Some(e) = k.entries.iter_mut().find(|e| e.token == token && e.held) else { return Shrink::NotHeld };
        match admission::shrunk(e.mode, to) {
            Ok(mode) => {
                e.mode = mode;
                Shrink::Shrunk
            }
            Err(reason) => Shrink::NotSmaller(reason),
        }
    }

    /// Rewrites the limit of `key`'s shared rows; the weight held.
    pub(crate) fn resize(&mut self, key: &str, limit: u32, now: Duration) -> u64 {
        let k = self.key(key, now);
        let mut held = 0u64;
        for e in k.entries.iter_mut() {
            if let LeaseMode::Shared { weight, .. } = e.mode {
                e.mode = LeaseMode::Shared { weight, limit };
                if e.held {
                    held += u64::from(weight);
                }
            }
        }
        held
    }

    /// If `token` holds a lease of `key` (not a reservation), raises `key`'s
    /// counter to `floor` if it is lower (never lowers it), so the key's next
    /// fence or place is above `floor`; whether it held. The caller keeps
    /// `floor` at most [`MAX_FENCE_FLOOR`], so the counter never overflows.
    pub(crate) fn raise_fence(&mut self, key: &str, token: [u8; 16], floor: u64, now: Duration) -> bool {
        self.with_key(key, now, |k| {
            let held = k.entries.iter().any(|e| e.token == token && e.held);
            if held {
                k.counter = k.counter.max(floor);
            }
            held
        })
    }

    /// The record kept with `key`, if one was written.
    pub(crate) fn read_record(&self, key: &str) -> Option<u64> {
        self.records.get(key).copied()
    }

    /// If `token` holds an exclusive lease of `key` (exclusive or writer),
    /// sets the record kept with `key` to `value`; whether it held.
    pub(crate) fn write_record(&mut self, key: &str, token: [u8; 16], value: u64, now: Duration) -> bool {
        let k = self.key(key, now);
        let held = k.entries.iter().any(|e| e.token == token && e.held && e.mode.is_exclusive());
        if held {
            self.records.insert(key.to_owned(), value);
        }
        held
    }

    /// Replaces the label of `token`'s lease of `key`.
    pub(crate) fn relabel(&mut self, key: &str, token: [u8; 16], label: &str, now: Duration) -> bool {
        let k = self.key(key, now);
        let mut found = false;
        for e in k.entries.iter_mut().filter(|e| e.token == token && e.held) {
            e.label = label.to_owned();
            found = true;
        }
        found
    }

    /// Every row still live at `now`, as `(key, token, held)`: what a
    /// quiescence check looks for.
    pub(crate) fn live_rows(&mut self, now: Duration) -> Vec<(String, [u8; 16], bool)> {
        let mut out = Vec::new();
        for (key, k) in self.keys.iter_mut() {
            k.entries.retain(|e| e.expires > now);
            out.extend(k.entries.iter().map(|e| (key.clone(), e.token, e.held)));
        }
        out
    }
}
