//! The checker's rules, one function per guarantee; each adds to the
//! per-fault rows and to the violations.

use std::collections::BTreeMap;
use std::time::Duration;

use holdfast_verify::properties::{self, Breach, Held};

use super::findings::{Attribution, EndCause, FREE_BOUND, Findings, Violation};
use super::record::{Micros, Phase, Record};
use super::report::ms;
use crate::cli::FaultKind;

/// The beliefs as the property checker takes them (times from the run's start).
fn held(f: &Findings) -> Vec<Held> {
    let at = |us: Micros| Duration::from_micros(us.max(0) as u64);
    f.beliefs
        .iter()
        .map(|b| Held { holder: b.pid, fence: b.fence, hold: b.hold.hold(), start: at(b.start), end: at(b.end) })
        .collect()
}

/// A breach as a violation of `guarantee`: its processes, and its lanes and
/// why each belief ended in its words.
fn violation(f: &Findings, guarantee: &'static str, b: &Breach) -> Violation {
    let involved: Vec<_> = b.grants.iter().map(|&i| &f.beliefs[i]).collect();
    let ends: Vec<String> =
        involved.iter().map(|x| format!("lane {} pid {} {}", x.lane, x.pid, x.cause.words())).collect();
    Violation {
        guarantee,
        at: b.at.as_micros() as Micros,
        pids: involved.iter().map(|x| x.pid).collect(),
        what: format!("{} (beliefs: {})", b.what, ends.join("; ")),
    }
}

/// The primitive's exclusion (never two holders; never over N permits; a
/// writer alone; one leader), over the beliefs, by [`properties::exclusion`].
pub fn exclusion(f: &mut Findings, at: &Attribution<'_>) {
    let found = properties::exclusion(f.property(), &held(f));
    for b in &found {
        let v = violation(f, "exclusion", b);
        f.rows.entry(at.row(v.at, &v.pids)).or_default().double_grants += 1;
        f.violations.push(v);
    }
}

/// Fencing: fences (terms) never repeat and increase in grant order, by
/// [`properties::fences`].
pub fn fences(f: &mut Findings, at: &Attribution<'_>) {
    for b in &properties::fences(&held(f)) {
        let v = violation(f, "fencing", b);
        f.rows.entry(at.row(v.at, &v.pids)).or_default().fence_faults += 1;
        f.violations.push(v);
    }
}

/// The register: no stale write accepted; every write sent while believed.
pub fn writes(recs: &[Record], f: &mut Findings, at: &Attribution<'_>) {
    let belief: BTreeMap<(u32, u64), (Micros, Micros)> =
        f.beliefs.iter().map(|b| ((b.pid, b.fence), (b.start, b.end))).collect();
    let mut top: Option<(u64, u32)> = None;
    for r in recs {
        let Record::Write { t, issued, lane, pid, fence, accepted, .. } = r else { continue };
        let stale = top.is_some_and(|(hf, hp)| *fence < hf || (*fence == hf && *pid != hp));
        let row = at.row(*t, &[*pid]);
        let window = belief.get(&(*pid, *fence)).copied();
        if window.is_none_or(|(s, e)| *issued < s || *issued > e) {
            f.violations.push(Violation {
                guarantee: "belief",
                at: *issued,
                pids: vec![*pid],
                what: format!(
                    "lane {lane} (pid {pid}) sent a write with fence {fence} at {} outside its belief",
                    ms(*issued)
                ),
            });
        }
        if window.is_some_and(|(_, e)| *t > e) {
            f.rows.entry(row).or_default().late_writes += 1;
        }
        if *accepted {
            f.writes.0 += 1;
            if stale {
                let (hf, hp) = top.unwrap_or_default();
                f.rows.entry(row).or_default().stale_accepted += 1;
                f.violations.push(Violation {
                    guarantee: "stale write",
                    at: *t,
                    pids: vec![*pid, hp],
                    what: format!(
                        "the register took fence {fence} from lane {lane} (pid {pid}) at {} after fence {hf} (pid {hp})",
                        ms(*t)
                    ),
                });
            }
            top = Some(top.map_or((*fence, *pid), |(hf, hp)| if *fence >= hf { (*fence, *pid) } else { (hf, hp) }));
        } else {
            f.writes.1 += 1;
            if stale {
                f.rows.entry(row).or_default().stale_refused += 1;
            } else {
                f.violations.push(Violation {
                    guarantee: "fencing",
                    at: *t,
                    pids: vec![*pid],
                    what: format!("the register refused fence {fence} from pid {pid}, which was not stale"),
                });
            }
        }
    }
}

/// Expiry: after a holder is killed, the next grant comes within TTL + [`FREE_BOUND`].
pub fn expiry(recs: &[Record], f: &mut Findings) {
    let bound = f.expiry + FREE_BOUND;
    let kills = recs.iter().filter_map(|r| match r {
        Record::Fault { t, kind: FaultKind::Kill, pid, lane, phase: Phase::Start, holder: true } => {
            Some((*t, *pid, *lane))
        }
        _ => None,
    });
    let mut found = Vec::new();
    for (t, pid, lane) in kills {
        let next = f.beliefs.iter().map(|b| b.start).find(|s| *s > t);
        let free = next.unwrap_or(f.end) - t;
        if next.is_none() && free <= bound {
            continue; // the run ended first; nothing to judge
        }
        let row = f.rows.entry("kill").or_default();
        row.longest_free = row.longest_free.max(Some(free));
        if free > bound {
            found.push(Violation {
                guarantee: "expiry",
                at: t,
                pids: vec![pid],
                what: format!(
                    "after lane {lane}'s holder (pid {pid}) was killed at {}, the key stood free {} (bound: the store's lease {} + {})",
                    ms(t), ms(free), ms(f.expiry), ms(FREE_BOUND)
                ),
            });
        }
    }
    f.violations.extend(found);
}

/// Holders that acted after their lease was lost, and `lost()` counts.
pub fn after_loss(recs: &[Record], f: &mut Findings, at: &Attribution<'_>) {
    let mut seen = std::collections::BTreeSet::new();
    for r in recs {
        if let Record::Lost { t, pid, fence, .. } = r
            && seen.insert((*pid, *fence))
        {
            f.rows.entry(at.row(*t, &[*pid])).or_default().lost += 1;
        }
    }
    let late: Vec<(Micros, u32, Micros)> = f
        .beliefs
        .iter()
        .filter(|b| matches!(b.cause, EndCause::Lost | EndCause::Deadline) && b.last_act > b.end)
        .map(|b| (b.end, b.pid, b.last_act - b.end))
        .collect();
    for (end, pid, ran) in late {
        let row = f.rows.entry(at.row(end, &[pid])).or_default();
        row.ran_after_loss += 1;
        row.longest_after_loss = row.longest_after_loss.max(ran);
    }
}
