//! `holdfast demo`: the flash sale.
//!
//! W worker processes (this binary, re-run as `holdfast __demo-worker`) sell
//! a stock of S items. The stock lives outside the lock store, in a
//! [`Witness`] directory on the local disk: a worker takes the lock, enters
//! the witness with its fence, reads the stock, writes it back one lower,
//! leaves, releases. If the lock ever let two workers in at once, the witness
//! records the overlap, the fences come out of order, or two workers sell the
//! same item (oversold > 0). The demo uses only the public `holdfast::Client`
//! API, so it runs unchanged on every store URL.
//!
//! With `--segments N` the stock is split evenly over N segments, each with
//! its own lock ([`holdfast::Segmented`]) and its own witness (`seg-I`); a
//! buyer id is routed to a segment and falls over to the next one with
//! stock, and every witness is checked the same way.

mod verdict;
mod worker;

use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use holdfast_verify::witness::Witness;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use verdict::Verdict;
pub use worker::worker;

use crate::cli::{DemoArgs, ENV_BACKEND};
use crate::duration;
use crate::exit::{Failure, INTERNAL, INVARIANT_BROKEN, OK};

/// The lease TTL workers take the lock with: a worker that dies holding it
/// holds up the others this long at most.
const WORKER_TTL: Duration = Duration::from_secs(10);
/// How long a worker waits for one purchase before it gives up.
const WORKER_WAIT: Duration = Duration::from_secs(60);

/// The parent: sets up the stock, starts the workers, checks the invariants.
pub async fn demo(args: DemoArgs) -> Result<u8, Failure> {
    let tmp = tempfile::Builder::new()
        .prefix("holdfast-demo-")
        .tempdir()
        .map_err(|e| Failure::new(INTERNAL, format!("cannot create a temp dir: {e}")))?;
    let url = match &args.backend {
        Some(url) => url.clone(),
        None => format!("sqlite://{}", tmp.path().join("locks.db").display()),
    };
    // Fail fast, once, on a bad URL or a store that is down.
    let client = super::connect(&url, None).await?;
    let store = client.store_name();
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let key = format!("holdfast-demo/{}-{nanos}", std::process::id());
    if let Some(n) = args.segments {
        client.segmented(key.as_str(), n as usize)?;
    }
    drop(client);

    let witness_dir = tmp.path().join("witness");
    let witnesses = stock_witnesses(&witness_dir, args.stock, args.segments)?;

    let how = match args.segments {
        _ if args.without_lock => "WITHOUT a lock".to_owned(),
        None => format!("under lock {key:?}"),
        Some(n) => format!("in {n} segments under locks \"{key}/seg-0..{}\"", n - 1),
    };
    crate::say!(
        "holdfast demo: {} workers ({} buyer tasks each) sell {} items {how} on {store} ({})",
        args.workers,
        args.tasks,
        args.stock,
        holdfast::stores::redact_url(&url)
    );
    let bar = progress_bar(args.stock);
    let started = Instant::now();
    let exe = std::env::current_exe().map_err(|e| Failure::new(INTERNAL, format!("cannot find my own binary: {e}")))?;
    let mut workers = Vec::new();
    for index in 0..args.workers {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("__demo-worker").arg("--key").arg(&key).arg("--witness").arg(&witness_dir);
        cmd.args(["--tasks", &args.tasks.to_string(), "--work-ms", &args.work_ms.to_string()]);
        cmd.args(["--index", &index.to_string()]);
        if let Some(n) = args.segments {
            cmd.args(["--segments", &n.to_string()]);
        }
        let child = cmd
            .args(args.without_lock.then_some("--without-lock"))
            .env(ENV_BACKEND, &url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Failure::new(INTERNAL, format!("cannot start a worker: {e}")))?;
        workers.push(tokio::spawn(child.wait_with_output()));
    }

    while !workers.iter().all(|w| w.is_finished()) {
        let left: i64 = witnesses.iter().filter_map(|w| w.counter().ok()).map(|c| c.max(0)).sum();
        bar.set_position(args.stock.saturating_sub(left as u64));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();

    let (mut sold, mut lost) = (0u64, 0u64);
    let mut failure: Option<Failure> = None;
    for (i, w) in workers.into_iter().enumerate() {
        let out = w
            .await
            .map_err(|e| Failure::new(INTERNAL, format!("worker task: {e}")))?
            .map_err(|e| Failure::new(INTERNAL, format!("worker {i}: {e}")))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        match (out.status.code(), parse_worker_line(&stdout)) {
            (Some(0), Some((s, l))) => {
                sold += s;
                lost += l;
            }
            (code, _) => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let why = stderr.lines().last().unwrap_or("no message").trim_start_matches("holdfast: ").to_owned();
                let code = code.and_then(|c| u8::try_from(c).ok()).filter(|c| *c != 0).unwrap_or(INTERNAL);
                failure.get_or_insert(Failure::new(code, format!("demo worker {i} failed: {why}")));
            }
        }
    }
    if let Some(f) = failure {
        return Err(f);
    }

    let reports = witnesses.iter().map(Witness::report).collect::<Result<Vec<_>, _>>().map_err(io_failure)?;
    let v = Verdict::segmented(args.stock, sold, &reports);
    let mark = |ok: bool| if ok { "ok" } else { "BROKEN" };
    let rate = sold as f64 / elapsed.as_secs_f64().max(1e-9);
    if let Some(n) = args.segments {
        let (low, high) = (args.stock / u64::from(n), args.stock.div_ceil(u64::from(n)));
        let each = if low == high { low.to_string() } else { format!("{low} or {high}") };
        crate::say!("segments           {n} ({each} items each; a lock and a witness each)");
    }
    if args.work_ms > 0 {
        crate::say!("critical section   {} ms of simulated work per item, under the lock", args.work_ms);
    }
    crate::say!("sold               {}", v.sold);
    crate::say!("left               {}", v.left);
    crate::say!("oversold           {}    {} (must be 0)", v.oversold, mark(v.oversold == 0 && v.below_zero == 0));
    let inside = if v.max_inside > 1 { format!("{}+", v.max_inside) } else { v.max_inside.to_string() };
    let per = if args.segments.is_some() { " per segment" } else { "" };
    crate::say!("max holders inside {inside}    {} (must be 1{per})", mark(v.max_inside <= 1));
    crate::say!(
        "fences             {}    {} ({} grants)",
        if v.fences_increasing { "strictly increasing" } else { "NOT increasing" },
        mark(v.fences_increasing),
        v.grants
    );
    crate::say!("leases lost        {lost}");
    crate::say!("throughput         {rate:.0} items/s ({sold} items in {})", duration::show(elapsed));
    if v.ok() {
        crate::say!("result             ok: no item oversold, one holder at a time");
        Ok(OK)
    } else {
        if args.without_lock {
            crate::say!("result             BROKEN, as expected without the lock");
        } else {
            crate::say!("result             BROKEN: the lock let more than one holder in");
        }
        Ok(INVARIANT_BROKEN)
    }
}

/// The witnesses holding the stock: one in `dir`, or with `segments` one
/// per segment in `dir/seg-I`, the stock split evenly (the first
/// `stock % n` segments one more).
fn stock_witnesses(dir: &std::path::Path, stock: u64, segments: Option<u32>) -> Result<Vec<Witness>, Failure> {
    let Some(n) = segments else {
        let witness = Witness::new(dir).map_err(io_failure)?;
        witness.reset(stock as i64).map_err(io_failure)?;
        return Ok(vec![witness]);
    };
    (0..n)
        .map(|i| {
            let witness = worker::segment_witness(dir, i)?;
            let share = stock / u64::from(n) + u64::from(u64::from(i) < stock % u64::from(n));
            witness.reset(share as i64).map_err(io_failure)?;
            Ok(witness)
        })
        .collect()
}

fn progress_bar(len: u64) -> ProgressBar {
    // Drawn on stderr, and only when stderr is a terminal.
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} sold  {elapsed}") {
        bar.set_style(style);
    }
    bar
}

fn io_failure(e: std::io::Error) -> Failure {
    Failure::new(INTERNAL, format!("witness directory: {e}"))
}

/// A worker's last stdout line: `sold N lost L`.
fn parse_worker_line(stdout: &str) -> Option<(u64, u64)> {
    let line = stdout.lines().last()?;
    let mut it = line.split_whitespace();
    match (it.next(), it.next(), it.next(), it.next()) {
        (Some("sold"), Some(s), Some("lost"), Some(l)) => Some((s.parse().ok()?, l.parse().ok()?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn worker_lines_parse() {
        assert_eq!(parse_worker_line("sold 12 lost 0\n"), Some((12, 0)));
        assert_eq!(parse_worker_line("garbage"), None);
    }
}
