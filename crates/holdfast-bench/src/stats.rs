//! Small measuring helpers and the figures they make: latency histograms, the
//! median round, resident memory, probe latencies and operation rates.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// A histogram of microseconds from 1 µs to 10 minutes, 3 significant digits.
pub(crate) fn histogram() -> holdfast::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 600_000_000, 3).map_err(|e| holdfast::Error::backend("holdfast-bench", false, e))
}

/// Records `d` in microseconds (at least 1, saturating at the histogram's top).
pub(crate) fn record(h: &mut Histogram<u64>, d: Duration) {
    let us = (d.as_micros() as u64).max(1);
    h.saturating_record(us);
}

/// The value at `q` (0..1) in microseconds, `None` if empty.
pub(crate) fn quantile_us(h: &Histogram<u64>, q: f64) -> Option<u64> {
    (!h.is_empty()).then(|| h.value_at_quantile(q))
}

/// The element with the median `key` (the lower median for an even count).
pub(crate) fn median_by<T>(mut items: Vec<T>, key: impl Fn(&T) -> f64) -> T {
    items.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let mid = (items.len().saturating_sub(1)) / 2;
    items.swap_remove(mid)
}

/// This process's resident set size in bytes (`VmRSS` of /proc/self/status), if readable.
pub(crate) fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.trim_start_matches("VmRSS:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// Latencies of the probe: one try_acquire + release of another key, timed together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeStats {
    /// Probes run.
    pub samples: u64,
    /// Median, µs.
    pub p50_us: Option<u64>,
    /// 99th percentile, µs.
    pub p99_us: Option<u64>,
    /// Longest, µs.
    pub max_us: Option<u64>,
    /// Probes that found the key busy or failed (must be 0).
    pub errors: u64,
}

/// A run of operations: how many, how fast, and the client CPU each took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RateWindow {
    /// Operations.
    pub ops: u64,
    /// Wall time, seconds.
    pub secs: f64,
    /// Operations per second.
    pub per_sec: f64,
    /// Process CPU time (user + system, all threads) per operation, µs.
    pub cpu_us_per_op: f64,
}
