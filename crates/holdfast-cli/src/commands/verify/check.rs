//! The checker: reads a history and finds every broken guarantee, with the
//! measures the report shows. Pure: tested on hand-made histories.
//!
//! A grant is *believed* from the moment its acquire returned until the
//! first of: its release began, its worker saw it lost, its local lease
//! deadline (the library promises the store grants nobody else before it),
//! its worker died (SIGKILL or exit), the run's end.

use std::collections::BTreeMap;

use super::record::{Micros, Phase, Record};
use crate::cli::FaultKind;

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

/// One grant as its holder believed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Belief {
    /// The lane.
    pub lane: u32,
    /// The worker process.
    pub pid: u32,
    /// The fence.
    pub fence: u64,
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

/// Counts of one row of the per-fault table.
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

/// Checks a history (any order; it is sorted by time here).
pub fn check(records: &[Record]) -> Findings {
    let mut recs = records.to_vec();
    recs.sort_by_key(Record::t);
    let mut f = Findings { end: recs.iter().map(Record::t).max().unwrap_or(0), ..Findings::default() };
    for r in &recs {
        match r {
            Record::Start { ttl, expiry, .. } => (f.ttl, f.expiry) = (*ttl, (*expiry).max(*ttl)),
            Record::End { t } => f.end = *t,
            Record::Error { .. } => f.errors += 1,
            _ => {}
        }
    }
    f.rows.insert("none", Row::default());
    let faults = fault_starts(&recs);
    count_faults(&recs, &mut f);
    f.beliefs = beliefs(&recs, f.end);
    let attribution = Attribution { faults: &faults, window: 4 * f.ttl + FREE_BOUND };
    super::rules::exclusion(&mut f, &attribution);
    super::rules::fences(&mut f, &attribution);
    super::rules::writes(&recs, &mut f, &attribution);
    super::rules::expiry(&recs, &mut f);
    super::rules::after_loss(&recs, &mut f, &attribution);
    f.violations.sort_by_key(|v| v.at);
    let volatile = recs.iter().any(|r| matches!(r, Record::Start { restart_keeps_state: Some(false), .. }));
    if volatile {
        let (weak, broken) = f.violations.drain(..).partition(|v| attribution.row(v.at, &v.pids) == "restart");
        (f.weaknesses, f.violations) = (weak, broken);
    }
    f
}

/// Which fault a finding follows: the latest fault on one of its processes
/// within a window before it, else `none`.
pub struct Attribution<'a> {
    faults: &'a [(Micros, FaultKind, u32)],
    window: Micros,
}

impl Attribution<'_> {
    /// The row name for a finding at `at` involving `pids`.
    pub fn row(&self, at: Micros, pids: &[u32]) -> &'static str {
        self.faults
            .iter()
            .rev()
            .find(|(t, _, pid)| *t <= at && at - *t <= self.window && (*pid == 0 || pids.contains(pid)))
            .map_or("none", |(_, kind, _)| kind_name(*kind))
    }
}

fn fault_starts(recs: &[Record]) -> Vec<(Micros, FaultKind, u32)> {
    recs.iter()
        .filter_map(|r| match r {
            Record::Fault { t, kind, pid, phase: Phase::Start, .. } => Some((*t, *kind, *pid)),
            _ => None,
        })
        .collect()
}

fn count_faults(recs: &[Record], f: &mut Findings) {
    let mut open: BTreeMap<u32, Micros> = BTreeMap::new();
    for r in recs {
        let Record::Fault { t, kind, pid, phase, holder, .. } = r else { continue };
        let row = f.rows.entry(kind_name(*kind)).or_default();
        match phase {
            Phase::Start => {
                row.injected += 1;
                row.on_holders += u64::from(*holder);
                open.insert(*pid, *t);
            }
            Phase::End => {
                if open.remove(pid).is_some_and(|s| t - s > f.ttl) && *kind == FaultKind::Pause {
                    row.past_ttl += 1;
                }
            }
        }
    }
}

/// Every grant's belief interval.
pub fn beliefs(recs: &[Record], run_end: Micros) -> Vec<Belief> {
    // (pid, fence) -> index
    let mut index: BTreeMap<(u32, u64), usize> = BTreeMap::new();
    let mut out: Vec<(Belief, Micros)> = Vec::new(); // with the latest known deadline
    let mut deaths: BTreeMap<u32, Micros> = BTreeMap::new();
    for r in recs {
        match r {
            Record::Grant { t, lane, pid, fence, deadline } => {
                index.insert((*pid, *fence), out.len());
                let b = Belief {
                    lane: *lane,
                    pid: *pid,
                    fence: *fence,
                    start: *t,
                    end: run_end,
                    cause: EndCause::RunEnd,
                    last_act: *t,
                };
                out.push((b, *deadline));
            }
            Record::Write { t, issued, pid, fence, deadline, .. } => {
                if let Some(&i) = index.get(&(*pid, *fence)) {
                    out[i].1 = out[i].1.max(*deadline);
                    out[i].0.last_act = out[i].0.last_act.max(*issued).max(*t);
                }
            }
            Record::Lost { t, pid, fence, deadline, .. } => {
                if let Some(&i) = index.get(&(*pid, *fence)) {
                    out[i].1 = out[i].1.max(*deadline);
                    end_at(&mut out[i].0, *t, EndCause::Lost);
                    out[i].0.last_act = out[i].0.last_act.max(*t);
                }
            }
            Record::Release { t, pid, fence, deadline, .. } => {
                if let Some(&i) = index.get(&(*pid, *fence)) {
                    out[i].1 = out[i].1.max(*deadline);
                    end_at(&mut out[i].0, *t, EndCause::Released);
                    out[i].0.last_act = out[i].0.last_act.max(*t);
                }
            }
            Record::Fault { t, kind: FaultKind::Kill, pid, phase: Phase::Start, .. } | Record::Exit { t, pid, .. } => {
                deaths.entry(*pid).or_insert(*t);
            }
            _ => {}
        }
    }
    let mut beliefs: Vec<Belief> = out
        .into_iter()
        .map(|(mut b, deadline)| {
            if let Some(&died) = deaths.get(&b.pid) {
                end_at(&mut b, died, EndCause::Died);
            }
            end_at(&mut b, deadline, EndCause::Deadline);
            b
        })
        .collect();
    beliefs.sort_by_key(|b| (b.start, b.fence));
    beliefs
}

fn end_at(b: &mut Belief, at: Micros, cause: EndCause) {
    let at = at.max(b.start);
    if at < b.end {
        b.end = at;
        b.cause = cause;
    }
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
