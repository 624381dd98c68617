//! A history of a lock run and the one checker of it: what the simulation
//! records and checks, and what `holdfast verify` is to record and check.
//!
//! Times are offsets from the run's start on one clock. Client events say
//! what holders believed (a grant returned, belief ended by release or by
//! `lost()`, writes to a fenced register); store events, where the store can
//! be watched (the simulated store), say what the store did.
//!
//! The checker reports every violation of:
//!
//! - **exclusion**: believed-held intervals of one key never overlap beyond
//!   what the lease modes allow (one exclusive holder; shared weights within
//!   the limit);
//! - **fencing**: fences of a key never repeat and increase in the order
//!   grants began to be believed;
//! - **no stale write accepted**: a write is issued only while its writer
//!   believes it holds, and the register never accepts a fence below one it
//!   accepted;
//! - **lost first**: the store never lets a lease go by expiry before the
//!   holder stopped believing in it (`lost()` always comes first).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast::backend::LeaseMode;

/// One grant, named by where it was granted and its owner token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GrantId {
    /// The store (an index the run chooses).
    pub store: u32,
    /// The grant's owner token.
    pub token: u128,
}

/// Why a holder stopped believing it held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndCause {
    /// It started to release.
    Released,
    /// `lost()` fired.
    Lost,
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// An acquire returned a grant to `client`.
    Granted {
        /// The grant.
        id: GrantId,
        /// The key.
        key: String,
        /// The grant's fence.
        fence: u64,
        /// Its lease mode.
        mode: LeaseMode,
        /// The client.
        client: u32,
        /// When the acquire returned.
        at: Duration,
    },
    /// The holder stopped believing it held.
    Ended {
        /// The grant.
        id: GrantId,
        /// Why.
        cause: EndCause,
        /// When.
        at: Duration,
    },
    /// A write to the fenced register of a key.
    Write {
        /// The grant it was written under.
        id: GrantId,
        /// The key.
        key: String,
        /// The fence it carried.
        fence: u64,
        /// When the writer sent it (it believed it held then).
        issued: Duration,
        /// When the register decided.
        applied: Duration,
        /// Whether the register took it.
        accepted: bool,
    },
    /// The store granted a lease (seen only where the store can be watched).
    StoreGranted {
        /// The grant.
        id: GrantId,
        /// The key.
        key: String,
        /// Its fence.
        fence: u64,
        /// When.
        at: Duration,
        /// When the store will let it go unless renewed.
        expires: Duration,
    },
    /// The store extended a lease (a renewal, or an acquire retried by its holder).
    StoreExtended {
        /// The grant.
        id: GrantId,
        /// When.
        at: Duration,
        /// The new expiry.
        expires: Duration,
    },
    /// The store deleted a lease on its holder's release.
    StoreReleased {
        /// The grant.
        id: GrantId,
        /// When.
        at: Duration,
    },
    /// The store restarted; without its state, every lease is gone.
    StoreRestarted {
        /// The store.
        store: u32,
        /// When.
        at: Duration,
        /// Whether it kept its data.
        kept_state: bool,
    },
}

/// A shared, append-only history on the run's clock.
#[derive(Debug, Clone)]
pub struct Recorder {
    start: tokio::time::Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Recorder {
    /// A history whose clock starts now.
    pub fn new() -> Self {
        Recorder { start: tokio::time::Instant::now(), events: Arc::default() }
    }

    /// Now, on the history's clock.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// The history's time of a tokio instant.
    pub fn at(&self, instant: tokio::time::Instant) -> Duration {
        instant.saturating_duration_since(self.start)
    }

    /// Appends an event.
    pub fn record(&self, event: Event) {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).push(event);
    }

    /// Every event so far, in the order recorded.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

/// A broken guarantee, with the events that show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// Which guarantee: `exclusion`, `fencing`, `stale write` or `lost first`.
    pub guarantee: &'static str,
    /// What happened, in words.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.guarantee, self.what)
    }
}

/// What a check found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// Grants believed held (non-empty intervals).
    pub grants: u64,
    /// Writes the register accepted.
    pub writes_accepted: u64,
    /// Writes the register refused (the fence doing its job).
    pub writes_refused: u64,
    /// Every violation, in the order found.
    pub violations: Vec<Violation>,
}

impl Verdict {
    /// Whether every guarantee held.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// One grant as the checker sees it.
#[derive(Debug, Clone)]
struct Belief {
    id: GrantId,
    key: String,
    fence: u64,
    mode: LeaseMode,
    start: Duration,
    end: Duration,
}

/// Checks a history; `end` is when the run stopped (beliefs still open end
/// there). A store restarted without its data may reissue fences and let a
/// second holder in: the checker reports that as it would any other
/// violation (it is the documented limit of such stores).
pub fn check(events: &[Event], end: Duration) -> Verdict {
    let mut verdict = Verdict::default();
    let mut beliefs: HashMap<GrantId, Belief> = HashMap::new();
    for e in events {
        match e {
            Event::Granted { id, key, fence, mode, at, .. } => {
                let b = Belief { id: *id, key: key.clone(), fence: *fence, mode: *mode, start: *at, end };
                beliefs.insert(*id, b);
            }
            Event::Ended { id, at, .. } => {
                if let Some(b) = beliefs.get_mut(id) {
                    b.end = b.end.min(*at).max(b.start);
                }
            }
            _ => {}
        }
    }
    let mut by_key: BTreeMap<(u32, String), Vec<&Belief>> = BTreeMap::new();
    for b in beliefs.values().filter(|b| b.end > b.start) {
        by_key.entry((b.id.store, b.key.clone())).or_default().push(b);
    }
    for ((store, key), list) in by_key.iter_mut() {
        list.sort_by_key(|b| (b.start, b.fence));
        verdict.grants += list.len() as u64;
        check_exclusion(*store, key, list, &mut verdict);
        check_fences(*store, key, list, &mut verdict);
    }
    check_writes(events, &beliefs, &mut verdict);
    check_lost_first(events, &beliefs, &mut verdict);
    verdict
}

fn check_exclusion(store: u32, key: &str, list: &[&Belief], verdict: &mut Verdict) {
    for (i, a) in list.iter().enumerate() {
        // Who else is believed to hold at the moment `a` starts.
        let others: Vec<&&Belief> = list[..i].iter().filter(|b| b.end > a.start).collect();
        if others.is_empty() {
            continue;
        }
        let exclusive = a.mode.is_exclusive() || others.iter().any(|b| b.mode.is_exclusive());
        let weight: u64 = others.iter().map(|b| u64::from(b.mode.weight())).sum::<u64>() + u64::from(a.mode.weight());
        let limit = a.mode.limit().map_or(1, u64::from);
        if exclusive || weight > limit {
            let b = others[0];
            verdict.violations.push(Violation {
                guarantee: "exclusion",
                what: format!(
                    "store {store} key {key:?}: fence {} ({:?}) believed held {:?}..{:?} while fence {} ({:?}) was believed held {:?}..{:?}",
                    a.fence, a.mode, a.start, a.end, b.fence, b.mode, b.start, b.end
                ),
            });
        }
    }
}

fn check_fences(store: u32, key: &str, list: &[&Belief], verdict: &mut Verdict) {
    let mut seen: HashMap<u64, GrantId> = HashMap::new();
    let mut last: Option<&Belief> = None;
    for b in list {
        if let Some(other) = seen.insert(b.fence, b.id).filter(|o| *o != b.id) {
            verdict.violations.push(Violation {
                guarantee: "fencing",
                what: format!(
                    "store {store} key {key:?}: fence {} issued to two grants ({other:?}, {:?})",
                    b.fence, b.id
                ),
            });
        }
        // Shared grants held together may begin in either order; an
        // exclusive one begins after every earlier grant and above them.
        if let Some(prev) = last.filter(|p| p.fence > b.fence && (p.mode.is_exclusive() || b.mode.is_exclusive())) {
            verdict.violations.push(Violation {
                guarantee: "fencing",
                what: format!(
                    "store {store} key {key:?}: fence {} believed from {:?} after fence {} believed from {:?}",
                    b.fence, b.start, prev.fence, prev.start
                ),
            });
        }
        if last.is_none_or(|p| b.fence > p.fence) {
            last = Some(b);
        }
    }
}

fn check_writes(events: &[Event], beliefs: &HashMap<GrantId, Belief>, verdict: &mut Verdict) {
    let mut highest: HashMap<(u32, &str), u64> = HashMap::new();
    let mut writes: Vec<(&GrantId, &str, u64, Duration, Duration, bool)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Write { id, key, fence, issued, applied, accepted } => {
                Some((id, key.as_str(), *fence, *issued, *applied, *accepted))
            }
            _ => None,
        })
        .collect();
    writes.sort_by_key(|w| w.4);
    for (id, key, fence, issued, applied, accepted) in writes {
        let believed = beliefs.get(id).is_some_and(|b| b.start <= issued && issued <= b.end);
        if !believed {
            verdict.violations.push(Violation {
                guarantee: "stale write",
                what: format!("key {key:?}: fence {fence} wrote at {issued:?} without believing it held"),
            });
        }
        let top = highest.entry((id.store, key)).or_insert(0);
        if accepted {
            verdict.writes_accepted += 1;
            if fence < *top {
                verdict.violations.push(Violation {
                    guarantee: "stale write",
                    what: format!("key {key:?}: the register took fence {fence} at {applied:?} after fence {top}"),
                });
            }
            *top = (*top).max(fence);
        } else {
            verdict.writes_refused += 1;
        }
    }
}

fn check_lost_first(events: &[Event], beliefs: &HashMap<GrantId, Belief>, verdict: &mut Verdict) {
    // Each store lease (by token and fence: a retry after its lease ran out
    // gets a new grant under the same token) with its expiry, moved by
    // extensions, until it is released, wiped by a restart, or passes.
    let mut live: HashMap<GrantId, (u64, Duration)> = HashMap::new();
    let mut gone: Vec<(GrantId, u64, Duration)> = Vec::new();
    let mut close = |id: GrantId, at: Duration, live: &mut HashMap<GrantId, (u64, Duration)>, released: bool| {
        if let Some((fence, exp)) = live.remove(&id).filter(|(_, exp)| *exp <= at || !released) {
            gone.push((id, fence, exp.min(at)));
        }
    };
    for e in events {
        match e {
            Event::StoreGranted { id, fence, at, expires, .. } => {
                close(*id, *at, &mut live, false);
                live.insert(*id, (*fence, *expires));
            }
            Event::StoreExtended { id, at, expires } => match live.get_mut(id) {
                // It ran out before this extension reached it.
                Some((_, exp)) if *exp <= *at => close(*id, *at, &mut live, false),
                Some((_, exp)) => *exp = (*exp).max(*expires),
                None => {}
            },
            Event::StoreReleased { id, at } => close(*id, *at, &mut live, true),
            Event::StoreRestarted { store, at, kept_state: false } => {
                let wiped: Vec<GrantId> = live.keys().filter(|id| id.store == *store).copied().collect();
                for id in wiped {
                    close(id, *at, &mut live, false);
                }
            }
            _ => {}
        }
    }
    gone.extend(live.drain().map(|(id, (fence, exp))| (id, fence, exp)));
    // In time order, so that a verdict lists its violations the same way in
    // every run (the map above iterates in a per-process order).
    gone.sort_by_key(|(id, fence, at)| (*at, *id, *fence));
    for (id, fence, at) in gone {
        if let Some(b) = beliefs.get(&id).filter(|b| b.fence == fence && b.end > at && b.start < b.end) {
            verdict.violations.push(Violation {
                guarantee: "lost first",
                what: format!(
                    "store {} key {:?}: fence {fence} expired or vanished at the store at {at:?}, but its holder believed it held until {:?}",
                    id.store, b.key, b.end
                ),
            });
        }
    }
}
