//! The property each primitive promises, checked over the intervals its
//! holders believed they held: the mutex (never two holders), the semaphore
//! (never more than N permits' weight at once), the read-write lock (a
//! writer holds alone, readers share) and the election (at most one leader
//! at a time, terms increasing).
//!
//! `holdfast verify` computes the intervals (each from its acquire's return
//! to the first of release begun, `lost()` seen, its local lease deadline,
//! its holder's death) and checks them here, so the lease's expiry is taken
//! into account the same way for every primitive: a holder whose lease ran
//! out locally no longer counts, whether or not it noticed. Pure and
//! separate from [`history`](crate::history), which checks the simulation's
//! richer events; the tests below feed each rule a history that breaks it.

use std::fmt;
use std::time::Duration;

/// What one grant held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The key alone: a mutex, a read-write lock's writer, a leader.
    Exclusive,
    /// A read-write lock's reader: shared with other readers.
    Read,
    /// A semaphore's grant of this many permits.
    Permits(u32),
}

impl Hold {
    /// Whether it excludes every other grant.
    pub fn is_exclusive(self) -> bool {
        self == Hold::Exclusive
    }
}

/// One grant as its holder believed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Who held it (a process id, say), for the messages.
    pub holder: u32,
    /// Its fence (an election's term).
    pub fence: u64,
    /// What it held.
    pub hold: Hold,
    /// When its acquire returned.
    pub start: Duration,
    /// When the belief ended.
    pub end: Duration,
}

/// The primitive under test, with the property it promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Property {
    /// Never two holders at once.
    Mutex,
    /// Never more than this many permits' weight held at once.
    Semaphore {
        /// The permit count.
        permits: u32,
    },
    /// A writer holds alone; readers share.
    RwLock,
    /// At most one leader at a time; each term (fence) above every earlier leader's.
    Election,
}

impl Property {
    /// The property in words, for reports.
    pub fn exclusion(&self) -> String {
        match self {
            Property::Mutex => "exclusion: never two holders at once".to_owned(),
            Property::Semaphore { permits } => {
                format!("permit bound: never more than {permits} permits' weight held at once")
            }
            Property::RwLock => "read-write exclusion: a writer holds alone; readers share".to_owned(),
            Property::Election => "election safety: at most one leader at a time".to_owned(),
        }
    }

    /// The fence property in words, for reports.
    pub fn fencing(&self) -> &'static str {
        match self {
            Property::Mutex => "fencing: fences strictly increase",
            Property::Election => "terms increase: each leader's term (fence) above every earlier one's",
            Property::Semaphore { .. } | Property::RwLock => {
                "fencing: fences never repeat and increase in grant order (two shared grants may be answered in either order)"
            }
        }
    }
}

/// Which rule a [`Breach`] broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The primitive's exclusion (two holders, too many permits, a writer beside anyone, two leaders).
    Exclusion,
    /// Fences (terms) repeated or going backwards.
    Fencing,
}

/// A broken property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    /// The rule.
    pub rule: Rule,
    /// When it showed: the start of the grant that broke it.
    pub at: Duration,
    /// Indices (into the checked slice) of the grants involved, the one that broke it last.
    pub grants: Vec<usize>,
    /// What happened, in words.
    pub what: String,
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} at {:?}: {}", self.rule, self.at, self.what)
    }
}

/// A time for people: `750 µs`, `1.5 ms`, `988 ms`, `1.5 s`, `10 s`.
pub fn human(d: Duration) -> String {
    let us = d.as_micros();
    let trimmed = |x: f64, places: usize| {
        let s = format!("{x:.places$}");
        if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_owned() } else { s }
    };
    match us {
        0 => "0 s".to_owned(),
        1..1_000 => format!("{us} µs"),
        1_000..10_000 => format!("{} ms", trimmed(us as f64 / 1e3, 1)),
        10_000..1_000_000 => format!("{} ms", (us as f64 / 1e3).round()),
        _ => format!("{} s", trimmed(us as f64 / 1e6, 2)),
    }
}

fn ms(d: Duration) -> String {
    human(d)
}

fn describe(h: &Held) -> String {
    let what = match h.hold {
        Hold::Exclusive => String::new(),
        Hold::Read => " (reader)".to_owned(),
        Hold::Permits(n) => format!(" ({n} permit{})", if n == 1 { "" } else { "s" }),
    };
    format!("holder {} fence {}{what} believed {} to {}", h.holder, h.fence, ms(h.start), ms(h.end))
}

/// Indices of `held` in start order (then fence), which both rules walk.
fn by_start(held: &[Held]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..held.len()).filter(|&i| held[i].end > held[i].start).collect();
    order.sort_by_key(|&i| (held[i].start, held[i].fence));
    order
}

/// Every moment `property`'s exclusion broke: for each grant, the grants
/// believed held when it began. Mutex and election: one breach per pair that
/// overlaps; read-write lock: per overlapping pair with a writer in it;
/// semaphore: one per grant whose start took the weight held over the
/// permits (the weight held only grows at a start, so this finds every
/// instant over the bound).
pub fn exclusion(property: Property, held: &[Held]) -> Vec<Breach> {
    let order = by_start(held);
    let mut found = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        let b = &held[i];
        let others: Vec<usize> = order[..k].iter().copied().filter(|&j| held[j].end > b.start).collect();
        match property {
            Property::Semaphore { permits } => {
                let weight = |h: &Held| match h.hold {
                    Hold::Permits(n) => u64::from(n),
                    // Anything else on a semaphore's key takes it whole.
                    _ => u64::from(permits),
                };
                let total: u64 = others.iter().map(|&j| weight(&held[j])).sum::<u64>() + weight(b);
                if total > u64::from(permits) {
                    let list: Vec<String> = others.iter().map(|&j| describe(&held[j])).collect();
                    found.push(Breach {
                        rule: Rule::Exclusion,
                        at: b.start,
                        grants: others.iter().copied().chain([i]).collect(),
                        what: format!(
                            "{total} permits held at once, over the {permits}: {} began while {}",
                            describe(b),
                            list.join("; ")
                        ),
                    });
                }
            }
            Property::Mutex | Property::Election | Property::RwLock => {
                let shared_ok = property == Property::RwLock;
                for j in others {
                    let a = &held[j];
                    if shared_ok && !a.hold.is_exclusive() && !b.hold.is_exclusive() {
                        continue;
                    }
                    let overlap = a.end.min(b.end).saturating_sub(b.start);
                    let who = if property == Property::Election { "two leaders" } else { "two holders" };
                    found.push(Breach {
                        rule: Rule::Exclusion,
                        at: b.start,
                        grants: vec![j, i],
                        what: format!("{who}: {} while {}; overlap {}", describe(a), describe(b), ms(overlap)),
                    });
                }
            }
        }
    }
    found
}

/// Every fence (term) that repeated or went backwards, in start order: a
/// fence is never another grant's, and each grant's fence is above every
/// earlier-started grant's, except between two shared grants (readers,
/// permits), which the store may grant together and whose replies may come
/// back in either order.
pub fn fences(held: &[Held]) -> Vec<Breach> {
    let order = by_start(held);
    let mut found = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        let b = &held[i];
        let earlier = order[..k].iter().copied().filter(|&j| {
            let a = &held[j];
            // Two shared grants' replies may come back in either order (the
            // store may grant both at once; a slow reply returns after the
            // other holder is gone), so only a repeat between them is a breach.
            let both_shared = !a.hold.is_exclusive() && !b.hold.is_exclusive();
            a.fence == b.fence || (a.fence > b.fence && !both_shared)
        });
        // The highest such fence names the breach; one breach per grant.
        if let Some(j) = earlier.max_by_key(|&j| (held[j].fence, held[j].start)) {
            let a = &held[j];
            let how = if a.fence == b.fence { "repeats" } else { "goes backwards from" };
            found.push(Breach {
                rule: Rule::Fencing,
                at: b.start,
                grants: vec![j, i],
                what: format!(
                    "fence {} (holder {}, from {}) {how} fence {} (holder {}, from {})",
                    b.fence,
                    b.holder,
                    ms(b.start),
                    a.fence,
                    a.holder,
                    ms(a.start)
                ),
            });
        }
    }
    found
}

#[cfg(test)]
#[path = "properties_tests.rs"]
mod tests;
