//! The scale workloads' figures as tables: `--held N` and `--hot W`.

use std::fmt;

use crate::held::HeldResult;
use crate::hot::HotResult;
use crate::stats::{ProbeStats, RateWindow};

pub(crate) fn ms(us: Option<u64>) -> String {
    us.map_or("-".to_owned(), |us| format!("{:.1} ms", us as f64 / 1e3))
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("n/a".to_owned(), |v| format!("{v:.digits$}"))
}

fn times(v: Option<f64>) -> String {
    v.map_or("n/a".to_owned(), |v| format!("{v:.2}x"))
}

fn bytes(b: Option<i64>) -> String {
    b.map_or("n/a".to_owned(), |b| format!("{:.1} MB", b as f64 / 1e6))
}

fn rate(w: &RateWindow) -> String {
    format!("{} in {:.2} s, {:.0}/s, CPU {:.0} µs each", w.ops, w.secs, w.per_sec, w.cpu_us_per_op)
}

/// Writes `--held N`'s table.
pub(crate) fn write_held(f: &mut fmt::Formatter<'_>, h: &HeldResult) -> fmt::Result {
    writeln!(
        f,
        "held: {} leases on one client, ttl {} ms (renewal every {} ms), held {:.1} s{}",
        h.leases,
        h.lease_ttl_ms,
        h.renew_period_ms,
        h.hold_secs,
        if h.churn { ", churn on the same client" } else { "" }
    )?;
    let row = |f: &mut fmt::Formatter<'_>, name: &str, value: String| writeln!(f, "  {name:<38} {value}");
    row(f, "acquire, all", rate(&h.acquire))?;
    row(f, "acquire, first", rate(&h.acquire_first))?;
    row(f, "acquire, last", rate(&h.acquire_last))?;
    row(
        f,
        "acquire cost last/first",
        format!("{:.2}x CPU", h.acquire_last.cpu_us_per_op / h.acquire_first.cpu_us_per_op.max(1e-9)),
    )?;
    row(
        f,
        "memory per held lease",
        match h.rss_per_lease_bytes {
            Some(b) => format!("{b:.0} bytes ({} in all)", bytes(h.rss_delta_bytes)),
            None => "n/a".to_owned(),
        },
    )?;
    row(f, "renewing", h.renewing.to_string())?;
    let probe = |p: &ProbeStats| {
        format!(
            "p50 {}, p99 {}, max {} ({} probes, {} failed)",
            ms(p.p50_us),
            ms(p.p99_us),
            ms(p.max_us),
            p.samples,
            p.errors
        )
    };
    row(f, "probe on the idle client", probe(&h.idle_probe))?;
    row(f, "probe while holding", probe(&h.probe))?;
    row(f, "probe p99 holding/idle", times(h.probe_p99_over_idle))?;
    if let Some(cycles) = h.churn_cycles {
        row(
            f,
            "churn (16 tasks, other keys)",
            format!("{cycles} cycles, {:.0}/s, {} failed", h.churn_per_sec.unwrap_or(0.0), h.churn_errors),
        )?;
    }
    row(f, "leases lost (is_lost / lost() fired)", format!("{} / {}", h.lost, h.lost_fired))?;
    row(
        f,
        "renew calls per period",
        format!(
            "{:.2}, {:.0} leases renewed per period, largest call {} leases",
            h.renew_calls_per_period, h.leases_renewed_per_period, h.largest_renew_batch
        ),
    )?;
    row(
        f,
        "renew time",
        format!("longest call {:.1} ms, {:.1} ms in calls per period", h.longest_renew_ms, h.renew_busy_ms_per_period),
    )?;
    row(f, "client CPU per period", format!("{:.1} ms", h.client_cpu_ms_per_period))?;
    row(
        f,
        "store commands (requests) per period",
        format!("{} ({})", opt(h.store_commands_per_period, 1), opt(h.store_requests_per_period, 1)),
    )?;
    row(f, "release, all", rate(&h.release))?;
    row(f, "memory back after release", bytes(h.rss_released_bytes))?;
    let failed = match &h.first_release_error {
        Some(first) => format!("{} ({} lost; first: {first})", h.release_errors, h.releases_lost),
        None => "0".to_owned(),
    };
    row(f, "failed releases", failed)
}

/// Writes `--hot W`'s table.
pub(crate) fn write_hot(f: &mut fmt::Formatter<'_>, h: &HotResult) -> fmt::Result {
    writeln!(
        f,
        "hot: {} tasks on one key{} in {} process(es), hold {} µs, {:.1} s{}",
        h.tasks,
        h.permits.map(|n| format!(" (a semaphore of {n} permits, one a task)")).unwrap_or_default(),
        h.procs,
        h.hold_us,
        h.elapsed_secs,
        if h.fair { ", fair locks" } else { "" }
    )?;
    let row = |f: &mut fmt::Formatter<'_>, name: &str, value: String| writeln!(f, "  {name:<38} {value}");
    row(f, "acquisitions", format!("{} ({:.0}/s)", h.acquisitions, h.per_sec))?;
    row(f, "tasks that never acquired", h.never_acquired.to_string())?;
    row(
        f,
        "wait",
        format!("p50 {}, p99 {}, longest {:.1} ms", ms(h.wait_p50_us), ms(h.wait_p99_us), h.longest_wait_ms),
    )?;
    row(
        f,
        "per task busiest/least busy",
        format!("{} / {} ({})", h.per_task_max, h.per_task_min, times(h.busiest_over_least)),
    )?;
    row(f, "re-acquired by the releasing task", format!("{:.1}% (within a process)", h.reacquired_share * 100.0))?;
    row(
        f,
        "library calls per acquisition",
        format!("{:.2} ({:.2} acquire calls)", h.library_calls_per_acquisition, h.acquire_calls_per_acquisition),
    )?;
    row(f, "store requests per acquisition", opt(h.store_requests_per_acquisition, 2))?;
    row(f, "server commands per acquisition", opt(h.store_commands_per_acquisition, 2))?;
    row(f, "client CPU per acquisition", format!("{:.0} µs", h.client_cpu_us_per_acquisition))?;
    row(f, "overlaps / failed releases", format!("{} / {}", h.overlaps, h.release_errors))
}
