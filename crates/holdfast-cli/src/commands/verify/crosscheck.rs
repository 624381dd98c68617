//! A second opinion: the same history through the history checker
//! (`holdfast_verify::history`, which the simulation uses), so verify and
//! the simulated runs judge exclusion, fencing and stale writes by one
//! definition. Whatever it finds that [`check`](super::check) did not is
//! added to the findings as a violation of its own.

use std::time::Duration;

use holdfast::backend::{LeaseMode, UNLIMITED};
use holdfast_verify::history::{self, EndCause, Event, GrantId};

use super::check::{Findings, Violation};
use super::record::{GrantHold, Micros, Record};

const KEY: &str = "verify";

fn at(us: Micros) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

/// A grant's id for the history checker: its worker's pid and its fence.
fn id(pid: u32, fence: u64) -> GrantId {
    GrantId { store: 0, token: (u128::from(pid) << 64) | u128::from(fence) }
}

/// The history as the history checker's events, beliefs ending where `f` says.
pub fn events(f: &Findings, records: &[Record]) -> Vec<Event> {
    let mut events = Vec::new();
    for b in &f.beliefs {
        let id = id(b.pid, b.fence);
        let mode = match b.hold {
            GrantHold::Exclusive => LeaseMode::Exclusive,
            GrantHold::Read => LeaseMode::Shared { weight: 1, limit: UNLIMITED },
            GrantHold::Permits(weight) => LeaseMode::Shared { weight, limit: f.permits.max(weight) },
        };
        let (key, fence, client) = (KEY.to_owned(), b.fence, b.lane);
        events.push(Event::Granted { id, key, fence, mode, client, at: at(b.start) });
        events.push(Event::Ended { id, cause: EndCause::Released, at: at(b.end) });
    }
    for r in records {
        if let Record::Write { t, issued, pid, fence, accepted, .. } = r {
            let (key, issued, applied, accepted) = (KEY.to_owned(), at(*issued), at(*t), *accepted);
            events.push(Event::Write { id: id(*pid, *fence), key, fence: *fence, issued, applied, accepted });
        }
    }
    events
}

/// Runs the history checker; adds what it found if `f` has no violation
/// of that guarantee already.
pub fn second_opinion(f: &mut Findings, records: &[Record]) {
    let verdict = history::check(&events(f, records), at(f.end));
    for v in verdict.violations {
        let guarantee = v.guarantee;
        if !f.violations.iter().chain(&f.weaknesses).any(|mine| mine.guarantee == guarantee) {
            f.violations.push(Violation {
                guarantee,
                at: f.end,
                pids: Vec::new(),
                what: format!("the second checker (holdfast_verify::history) found: {v}"),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_checkers_agree_on_a_double_grant_and_on_a_clean_run() {
        let g = |t, lane, fence| Record::Grant {
            t,
            lane,
            pid: 100 + lane,
            fence,
            deadline: t + 1_000_000,
            hold: Default::default(),
        };
        let rel = |t, lane, fence| Record::Release { t, lane, pid: 100 + lane, fence, deadline: t + 1_000_000 };
        let clean = vec![g(0, 0, 1), rel(100, 0, 1), g(200, 1, 2), rel(300, 1, 2)];
        let f = super::super::check::check(&clean);
        assert!(history::check(&events(&f, &clean), at(f.end)).ok());
        let double = vec![g(0, 0, 1), g(50, 1, 2), rel(100, 0, 1), rel(300, 1, 2)];
        let f = super::super::check::check(&double);
        let verdict = history::check(&events(&f, &double), at(f.end));
        assert_eq!(verdict.violations.iter().map(|v| v.guarantee).collect::<Vec<_>>(), vec!["exclusion"]);
    }
}
