//! The one clock of a run: CLOCK_MONOTONIC, which on Linux is the same for
//! every process on the machine (it counts from boot and is not stepped by
//! NTP). Workers time their own events with it and the parent times faults
//! and the register's decisions with it, so a worker's events keep their true
//! times even when a pause delays their delivery to the parent.

use std::time::Instant;

use nix::time::{ClockId, clock_gettime};

use super::record::Micros;

/// CLOCK_MONOTONIC now, in microseconds.
pub fn now_us() -> i64 {
    // CLOCK_MONOTONIC cannot fail on Linux; 0 would only shift one event.
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |ts| ts.tv_sec() * 1_000_000 + ts.tv_nsec() / 1_000)
}

/// A `std::time::Instant` (CLOCK_MONOTONIC on Linux) in microseconds of
/// CLOCK_MONOTONIC, possibly in the past or the future.
pub fn instant_us(at: Instant) -> i64 {
    let (now, mono) = (Instant::now(), now_us());
    match at.checked_duration_since(now) {
        Some(ahead) => mono + ahead.as_micros() as i64,
        None => mono - now.duration_since(at).as_micros() as i64,
    }
}

/// Times relative to a run's start.
#[derive(Debug, Clone, Copy)]
pub struct RunClock {
    /// CLOCK_MONOTONIC µs at the start.
    pub epoch: i64,
}

impl RunClock {
    /// Now, since the start.
    pub fn now(&self) -> Micros {
        now_us() - self.epoch
    }

    /// An instant, since the start.
    pub fn at(&self, at: Instant) -> Micros {
        instant_us(at) - self.epoch
    }
}
