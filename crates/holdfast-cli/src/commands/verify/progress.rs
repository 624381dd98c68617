//! The progress line: while a run goes on, one line on stderr, rewritten in
//! place, when stderr is a terminal: time gone of the run's length, the
//! fault under way (or the last one), grants and writes so far, violations
//! so far. Not a terminal (a pipe, a CI log): nothing, so that logs carry
//! the report alone. stdout, which carries the report, never gets it.
//!
//! Violations so far are the checker's, on the history up to a little
//! while ago: a worker's records reach the parent late when it was paused,
//! and a history cut at "now" would lack a release still in flight and
//! show a double grant that is not one. So the line checks the history up
//! to `now - settle` (settle: a pause's length plus a TTL) and says so.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::check::{check, kind_name};
use super::clock::RunClock;
use super::record::{Micros, Phase, Record};
use super::report::ms;
use super::sink::Sink;
use crate::cli::FaultKind;

/// The line, while it is shown; [`Progress::finish`] clears it.
pub struct Progress {
    bar: ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    /// Shows the line for a run of `length` from `clock`'s start, if stderr is a terminal.
    pub fn start(sink: Sink, clock: RunClock, length: Micros, settle: Micros) -> Option<Progress> {
        if !std::io::stderr().is_terminal() {
            return None;
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{wide_msg}") {
            bar.set_style(style);
        }
        let shown = bar.clone();
        let task = tokio::spawn(async move {
            loop {
                let now = clock.now();
                shown.set_message(line(now, length, &sink.snapshot(), settle));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Some(Progress { bar, task })
    }

    /// Stops and clears the line (the report follows on stdout).
    pub fn finish(self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

/// The line at `now` of a run of `length`, from the records so far.
pub fn line(now: Micros, length: Micros, records: &[Record], settle: Micros) -> String {
    let grants = records.iter().filter(|r| matches!(r, Record::Grant { .. })).count();
    let writes = records.iter().filter(|r| matches!(r, Record::Write { .. })).count();
    let cutoff = now - settle;
    let checked = if cutoff <= 0 {
        "violations: checked once the first records settle".to_owned()
    } else {
        let mut settled: Vec<Record> = records.iter().filter(|r| r.t() <= cutoff).cloned().collect();
        settled.push(Record::End { t: cutoff });
        let f = check(&settled);
        let weak = match f.weaknesses.len() {
            0 => String::new(),
            n => format!(", {n} within documented weaknesses"),
        };
        format!("violations so far: {}{weak} (checked to {})", f.violations.len(), ms(cutoff))
    };
    format!(
        "verify {} / {} | {} | {grants} grants, {writes} writes | {checked}",
        ms(now.min(length).max(0)),
        ms(length),
        fault_now(records, now)
    )
}

/// The fault under way, or the last one.
fn fault_now(records: &[Record], now: Micros) -> String {
    let last = records.iter().enumerate().rev().find_map(|(i, r)| match r {
        Record::Fault { t, kind, lane, pid, phase: Phase::Start, .. } => Some((i, *t, *kind, *lane, *pid)),
        _ => None,
    });
    let Some((i, t, kind, lane, pid)) = last else { return "no fault yet".to_owned() };
    let target = match (pid, kind) {
        (0, FaultKind::Leader) => format!("the server (member {lane})"),
        (0, _) => "the server".to_owned(),
        _ => format!("worker {lane}"),
    };
    let ended = kind == FaultKind::Kill
        || records[i..]
            .iter()
            .any(|r| matches!(r, Record::Fault { pid: p, kind: k, phase: Phase::End, .. } if *p == pid && *k == kind));
    if ended {
        format!("last fault: {} on {target} at {}", kind_name(kind), ms(t))
    } else {
        format!("fault: {} on {target} for {}", kind_name(kind), ms(now - t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start() -> Record {
        Record::Start {
            t: 0,
            store: "test".into(),
            ttl: 1_000_000,
            expiry: 0,
            workers: 2,
            faults: vec![FaultKind::Pause],
            restart_keeps_state: None,
            primitive: Default::default(),
            permits: 0,
        }
    }

    fn grant(t: Micros, lane: u32, fence: u64) -> Record {
        Record::Grant { t, lane, pid: 100 + lane, fence, deadline: t + 900_000, hold: Default::default() }
    }

    #[test]
    fn the_line_says_time_fault_operations_and_settled_violations() {
        let pause = |t, phase| Record::Fault { t, kind: FaultKind::Pause, lane: 1, pid: 101, phase, holder: true };
        let mut records = vec![start(), grant(10_000, 1, 1), pause(500_000, Phase::Start)];
        let line = line(1_500_000, 10_000_000, &records, 3_000_000);
        assert!(
            line.starts_with("verify 1.5 s / 10 s | fault: pause on worker 1 for 1 s | 1 grants, 0 writes"),
            "{line}"
        );
        assert!(line.contains("checked once the first records settle"), "{line}");
        // Two holders at 4 s: counted once the history up to then has settled, not before.
        records.push(pause(2_200_000, Phase::End));
        records.push(grant(4_000_000, 0, 2));
        records.push(grant(4_100_000, 1, 3));
        let early = super::line(5_000_000, 10_000_000, &records, 3_000_000);
        assert!(early.contains("last fault: pause on worker 1 at 500 ms"), "{early}");
        assert!(early.contains("violations so far: 0 (checked to 2 s)"), "{early}");
        let late = super::line(7_500_000, 10_000_000, &records, 3_000_000);
        assert!(late.contains("violations so far: 1 (checked to 4.5 s)"), "{late}");
    }
}
