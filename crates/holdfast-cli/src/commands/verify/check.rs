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

pub use super::findings::{Attribution, Belief, EndCause, FREE_BOUND, Findings, Row, Violation, kind_name};

/// Checks a history (any order; it is sorted by time here).
pub fn check(records: &[Record]) -> Findings {
    let mut recs = records.to_vec();
    recs.sort_by_key(Record::t);
    let mut f = Findings { end: recs.iter().map(Record::t).max().unwrap_or(0), ..Findings::default() };
    for r in &recs {
        match r {
            Record::Start { ttl, expiry, primitive, permits, .. } => {
                (f.ttl, f.expiry) = (*ttl, (*expiry).max(*ttl));
                (f.primitive, f.permits) = (*primitive, *permits);
            }
            Record::End { t } => f.end = *t,
            Record::Error { .. } => f.errors += 1,
            _ => {}
        }
    }
    f.rows.insert("none", Row::default());
    let faults = fault_starts(&recs);
    count_faults(&recs, &mut f);
    f.beliefs = beliefs(&recs, f.end);
    let attribution = Attribution::new(&faults, 4 * f.ttl + FREE_BOUND);
    super::rules::exclusion(&mut f, &attribution);
    super::rules::fences(&mut f, &attribution);
    super::rules::writes(&recs, &mut f, &attribution);
    super::rules::expiry(&recs, &mut f);
    super::rules::after_loss(&recs, &mut f, &attribution);
    f.violations.sort_by_key(|v| v.at);
    let volatile = recs.iter().any(|r| matches!(r, Record::Start { restart_keeps_state: Some(false), .. }));
    if volatile {
        let (weak, broken): (Vec<_>, Vec<_>) =
            f.violations.drain(..).partition(|v| attribution.row(v.at, &v.pids) == "restart");
        // Out of the row's unexpected counts, into its weaknesses: the row
        // and the summary then say the same.
        let row = f.rows.entry("restart").or_default();
        for v in &weak {
            let counter = match v.guarantee {
                "exclusion" => Some(&mut row.double_grants),
                "fencing" => Some(&mut row.fence_faults),
                "stale write" => Some(&mut row.stale_accepted),
                _ => None,
            };
            if let Some(n) = counter {
                *n = n.saturating_sub(1);
            }
            *row.weak.entry(v.guarantee).or_default() += 1;
        }
        (f.weaknesses, f.violations) = (weak, broken);
    }
    f
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
            Record::Grant { t, lane, pid, fence, deadline, hold } => {
                index.insert((*pid, *fence), out.len());
                let b = Belief {
                    lane: *lane,
                    pid: *pid,
                    fence: *fence,
                    hold: *hold,
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
            // A shared holder's check: as a write's proof of belief.
            Record::Holding { t, pid, fence, deadline, .. } => {
                if let Some(&i) = index.get(&(*pid, *fence)) {
                    out[i].1 = out[i].1.max(*deadline);
                    out[i].0.last_act = out[i].0.last_act.max(*t);
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
