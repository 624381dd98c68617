//! The fault injector: one fault at a time, round robin over the kinds
//! asked for, each aimed at a worker that holds the lock now.

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::clock::RunClock;
use super::record::{Micros, Phase, Record};
use super::register::Register;
use super::sink::Sink;
use crate::cli::FaultKind;

/// How long a pause lasts: past the TTL, so that the lease runs out.
pub fn pause_length(ttl: Duration) -> Duration {
    ttl * 3 / 2 + Duration::from_millis(200)
}

/// How long a slowed worker stops: its renewal runs late, within the TTL.
pub fn slow_length(ttl: Duration) -> Duration {
    ttl * 3 / 5
}

/// Injects `kinds` until `until` (on the run's clock).
pub async fn inject(kinds: Vec<FaultKind>, ttl: Duration, clock: RunClock, until: Micros, sink: Sink, reg: Register) {
    if kinds.is_empty() {
        return;
    }
    // Let the workers start and settle first.
    tokio::time::sleep(ttl / 2).await;
    let mut pauses = 0u32;
    for kind in kinds.iter().cycle() {
        let budget = match kind {
            FaultKind::Kill => ttl,
            FaultKind::Pause => pause_length(ttl),
            FaultKind::Slow => slow_length(ttl),
        };
        if clock.now() + budget.as_micros() as Micros >= until {
            return;
        }
        let Some((lane, pid)) = holder(&sink, clock, until).await else { return };
        let target = Pid::from_raw(pid as i32);
        match kind {
            FaultKind::Kill => {
                if kill(target, Signal::SIGKILL).is_ok() {
                    sink.push(Record::Fault {
                        t: clock.now(),
                        kind: *kind,
                        lane,
                        pid,
                        phase: Phase::Start,
                        holder: true,
                    });
                }
            }
            FaultKind::Pause => {
                pauses += 1;
                let length = pause_length(ttl);
                if pauses % 2 == 1 {
                    // At its next write: between its lease check and the write.
                    let done = reg.pause_at_next_write(pid, length);
                    match tokio::time::timeout(ttl, done).await {
                        Ok(_) => {}
                        Err(_) if reg.disarm(pid) => reg.pause(lane, pid, length, sink.holds(pid)).await,
                        // It was hit just as the timeout ran out.
                        Err(_) => tokio::time::sleep(length).await,
                    }
                } else {
                    reg.pause(lane, pid, length, true).await;
                }
            }
            FaultKind::Slow => reg.stop_for(*kind, lane, pid, slow_length(ttl), true).await,
        }
        // Let the lock change hands before the next fault.
        tokio::time::sleep(ttl).await;
    }
}

/// A lane holding the lock now, waiting for one up to `until`.
async fn holder(sink: &Sink, clock: RunClock, until: Micros) -> Option<(u32, u32)> {
    while clock.now() < until {
        let holders = sink.holders();
        if !holders.is_empty() {
            // Any of them, by the clock's low bits (no two runs alike).
            let (lane, h) = holders[clock.now().unsigned_abs() as usize % holders.len()];
            return Some((lane, h.pid));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}
