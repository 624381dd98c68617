//! What the checker finds: beliefs, violations, the per-fault rows, and which
//! fault a finding follows. Shared by the checker (`check.rs`) and its rules
//! (`rules.rs`), so that neither imports the other's types.

use std::collections::BTreeMap;

use holdfast_verify::properties::Property;

use super::record::{GrantHold, Micros};
use crate::cli::{FaultKind, Primitive};

/// How much longer than the TTL a dead holder's key may stand free.
pub const FREE_BOUND: Micros = 1_000_000;

/// Why a belief ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndCause {
    /// The worker began to release.
    Released,
    /// The worker saw `lost()` or a failed lease check.
    Lost,
    /// The local lease deadline passed (the worker may not have noticed yet).
    Deadline,
    /// The worker died.
    Died,
    /// The run ended.
    RunEnd,
}

impl EndCause {
    /// In words, for a report.
    pub fn words(self) -> &'static str {
        match self {
            EndCause::Released => "released",
            EndCause::Lost => "saw lost()",
            EndCause::Deadline => "lease ran out locally",
            EndCause::Died => "died",
            EndCause::RunEnd => "held at the run's end",
        }
    }
}

/// One grant as its holder believed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Belief {
    /// The lane.
    pub lane: u32,
    /// The worker process.
    pub pid: u32,
    /// The fence.
    pub fence: u64,
    /// What it held.
    pub hold: GrantHold,
    /// When the acquire returned.
    pub start: Micros,
    /// When the belief ended.
    pub end: Micros,
    /// Why.
    pub cause: EndCause,
    /// The last thing the holder did under this grant (a write sent or
    /// decided, `lost()` seen, the release begun).
    pub last_act: Micros,
}

/// A broken guarantee.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// `exclusion`, `fencing`, `stale write`, `belief` or `expiry`.
    pub guarantee: &'static str,
    /// When it showed.
    pub at: Micros,
    /// The processes involved.
    pub pids: Vec<u32>,
    /// What happened.
    pub what: String,
}

/// Counts of one row of the per-fault table. Findings within a documented
/// weakness are counted in [`weak`](Self::weak) only, so that a row and the
/// summary agree on what was unexpected.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    /// Faults of this kind injected (0 for the `none` row).
    pub injected: u64,
    /// Of which hit a holder.
    pub on_holders: u64,
    /// Pauses (`pause` faults) longer than the TTL.
    pub past_ttl: u64,
    /// Two holders believed at once.
    pub double_grants: u64,
    /// Fences repeated or going backwards.
    pub fence_faults: u64,
    /// Writes taken with a fence below (or equal to another grant's) the highest.
    pub stale_accepted: u64,
    /// Stale writes the register refused.
    pub stale_refused: u64,
    /// Writes decided after their writer's belief ended.
    pub late_writes: u64,
    /// `lost()` seen by holders.
    pub lost: u64,
    /// The longest a dead holder's key stood free, µs.
    pub longest_free: Option<Micros>,
    /// Holders that acted after their lease was lost.
    pub ran_after_loss: u64,
    /// The longest such run, µs.
    pub longest_after_loss: Micros,
    /// Findings within a documented weakness of the store, by guarantee
    /// (`exclusion`, `fencing`, ...): not counted in the columns above.
    pub weak: BTreeMap<&'static str, u64>,
}

impl Row {
    /// How many findings fell within a documented weakness.
    pub fn weak_total(&self) -> u64 {
        self.weak.values().sum()
    }
}

/// The documented weakness verify knows: what a restart without durable
/// writes does (docs/guarantees.md, Redis).
pub const RESTART_WEAKNESS: &str = "a restart of a store without durable writes loses its locks, so a second holder \
gets the key while the first believes until its next renewal fails (fences stay increasing); see docs/guarantees.md#redis";

/// A row's weaknesses in words, or `None` if it has none:
/// "2 double grants, all within the documented weakness: ...".
pub fn weakness_note(row: &Row) -> Option<String> {
    if row.weak.is_empty() {
        return None;
    }
    let unexpected = |g: &str| match g {
        "exclusion" => row.double_grants,
        "fencing" => row.fence_faults,
        "stale write" => row.stale_accepted,
        _ => 0,
    };
    let parts: Vec<String> = row.weak.iter().map(|(g, n)| finding_words(g, *n)).collect();
    let parts = parts.join(", ");
    if row.weak.keys().all(|g| unexpected(g) == 0) {
        Some(format!("{parts}, all within the documented weakness: {RESTART_WEAKNESS}"))
    } else {
        Some(format!("{parts} within the documented weakness (the row's other findings are not): {RESTART_WEAKNESS}"))
    }
}

/// `n` findings of `guarantee`, in words: "2 double grants".
pub fn finding_words(guarantee: &str, n: u64) -> String {
    let (one, many) = match guarantee {
        "exclusion" => ("double grant", "double grants"),
        "fencing" => ("fence fault", "fence faults"),
        "stale write" => ("stale write accepted", "stale writes accepted"),
        "belief" => ("write outside belief", "writes outside belief"),
        "expiry" => ("slow expiry", "slow expiries"),
        _ => ("finding", "findings"),
    };
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Everything the checker found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Findings {
    /// The TTL, µs.
    pub ttl: Micros,
    /// How long the store may keep a dead holder's lease, µs (the TTL, or
    /// more where the store rounds it up).
    pub expiry: Micros,
    /// The run's end.
    pub end: Micros,
    /// The primitive the workers exercised.
    pub primitive: Primitive,
    /// Its permit count (the semaphore).
    pub permits: u32,
    /// Every grant, by start.
    pub beliefs: Vec<Belief>,
    /// Writes accepted / refused in all.
    pub writes: (u64, u64),
    /// Store errors the workers saw.
    pub errors: u64,
    /// Per fault kind (`none` for what no fault preceded).
    pub rows: BTreeMap<&'static str, Row>,
    /// Every broken guarantee, by time.
    pub violations: Vec<Violation>,
    /// What broke after a restart of a store without persistence: its
    /// documented weakness, reported but not failing the run.
    pub weaknesses: Vec<Violation>,
}

impl Findings {
    /// Whether every guarantee held.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// The property the primitive promises.
    pub fn property(&self) -> Property {
        match self.primitive {
            Primitive::Mutex => Property::Mutex,
            Primitive::Semaphore => Property::Semaphore { permits: self.permits.max(1) },
            Primitive::Rwlock => Property::RwLock,
            Primitive::Election => Property::Election,
        }
    }

    /// The primitive, as the reports name it: "semaphore (2 permits)".
    pub fn primitive_name(&self) -> String {
        match self.primitive {
            Primitive::Semaphore => format!("semaphore ({} permits)", self.permits.max(1)),
            p => p.name().to_owned(),
        }
    }

    /// The sum over the fault rows.
    pub fn total(&self) -> Row {
        let mut t = Row::default();
        for r in self.rows.values() {
            t.injected += r.injected;
            t.on_holders += r.on_holders;
            t.past_ttl += r.past_ttl;
            t.double_grants += r.double_grants;
            t.fence_faults += r.fence_faults;
            t.stale_accepted += r.stale_accepted;
            t.stale_refused += r.stale_refused;
            t.late_writes += r.late_writes;
            t.lost += r.lost;
            t.longest_free = t.longest_free.max(r.longest_free);
            t.ran_after_loss += r.ran_after_loss;
            t.longest_after_loss = t.longest_after_loss.max(r.longest_after_loss);
            for (g, n) in &r.weak {
                *t.weak.entry(g).or_default() += n;
            }
        }
        t
    }
}

/// The name of a fault kind's row.
pub fn kind_name(kind: FaultKind) -> &'static str {
    match kind {
        FaultKind::Kill => "kill",
        FaultKind::Pause => "pause",
        FaultKind::Slow => "slow",
        FaultKind::Restart => "restart",
        FaultKind::Leader => "leader",
        FaultKind::Partition => "partition",
    }
}

/// Which fault a finding follows: the latest fault on one of its processes
/// within a window before it, else `none`.
pub struct Attribution<'a> {
    faults: &'a [(Micros, FaultKind, u32)],
    window: Micros,
}

impl<'a> Attribution<'a> {
    /// Faults as (start, kind, process; 0 = every process), and how long
    /// after its start a fault is still named the cause of a finding.
    pub fn new(faults: &'a [(Micros, FaultKind, u32)], window: Micros) -> Self {
        Attribution { faults, window }
    }

    /// The row name for a finding at `at` involving `pids`.
    pub fn row(&self, at: Micros, pids: &[u32]) -> &'static str {
        self.faults
            .iter()
            .rev()
            .find(|(t, _, pid)| *t <= at && at - *t <= self.window && (*pid == 0 || pids.contains(pid)))
            .map_or("none", |(_, kind, _)| kind_name(*kind))
    }
}
