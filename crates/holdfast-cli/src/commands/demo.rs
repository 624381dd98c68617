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

use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use holdfast_testkit::witness::{Report, Witness};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::{DemoArgs, DemoWorkerArgs, ENV_BACKEND};
use crate::duration;
use crate::exit::{Failure, INTERNAL, INVARIANT_BROKEN, OK, UNAVAILABLE};

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
    drop(client);

    let witness_dir = tmp.path().join("witness");
    let witness = Witness::new(&witness_dir).map_err(io_failure)?;
    witness.reset(args.stock as i64).map_err(io_failure)?;
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let key = format!("holdfast-demo/{}-{nanos}", std::process::id());

    let how = if args.without_lock { "WITHOUT a lock".to_owned() } else { format!("under lock {key:?}") };
    crate::say!(
        "holdfast demo: {} workers sell {} items {how} on {store} ({})",
        args.workers,
        args.stock,
        holdfast::redact_url(&url)
    );
    let bar = progress_bar(args.stock);
    let started = Instant::now();
    let exe = std::env::current_exe().map_err(|e| Failure::new(INTERNAL, format!("cannot find my own binary: {e}")))?;
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        let child = tokio::process::Command::new(&exe)
            .arg("__demo-worker")
            .arg("--key")
            .arg(&key)
            .arg("--witness")
            .arg(&witness_dir)
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
        if let Ok(left) = witness.counter() {
            bar.set_position(args.stock.saturating_sub(left.max(0) as u64));
        }
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

    let report = witness.report().map_err(io_failure)?;
    let v = Verdict::new(args.stock, sold, &report);
    let mark = |ok: bool| if ok { "ok" } else { "BROKEN" };
    let rate = sold as f64 / elapsed.as_secs_f64().max(1e-9);
    crate::say!("sold               {}", v.sold);
    crate::say!("left               {}", v.left);
    crate::say!("oversold           {}    {} (must be 0)", v.oversold, mark(v.oversold == 0 && v.left >= 0));
    let inside = if v.max_inside > 1 { format!("{}+", v.max_inside) } else { v.max_inside.to_string() };
    crate::say!("max holders inside {inside}    {} (must be 1)", mark(v.max_inside <= 1));
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

/// What the demo concludes from the workers' sales and the witness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Items the workers say they sold.
    pub sold: u64,
    /// Stock left in the witness.
    pub left: i64,
    /// Sales beyond what left the stock: two workers sold the same item.
    pub oversold: i64,
    /// The most holders the witness saw inside at once.
    pub max_inside: u64,
    /// Whether fences rose strictly in entry order.
    pub fences_increasing: bool,
    /// Grants the witness recorded.
    pub grants: u64,
}

impl Verdict {
    /// Judges a run that started with `stock` items.
    pub fn new(stock: u64, sold: u64, report: &Report) -> Self {
        let taken = stock as i64 - report.counter;
        Verdict {
            sold,
            left: report.counter,
            oversold: sold as i64 - taken,
            max_inside: report.max_inside,
            fences_increasing: report.fences_increasing,
            grants: report.entries,
        }
    }

    /// Whether every invariant held.
    pub fn ok(&self) -> bool {
        self.oversold == 0 && self.left >= 0 && self.max_inside <= 1 && self.fences_increasing
    }
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

/// One worker: buys items until the stock is gone, then prints `sold N lost L`.
pub async fn worker(args: DemoWorkerArgs) -> Result<u8, Failure> {
    let url = args.backend.backend.clone().ok_or_else(|| Failure::usage(format!("{ENV_BACKEND} is not set")))?;
    let client = super::connect(&url, None).await?;
    let witness = Witness::new(&args.witness).map_err(io_failure)?;
    let mutex = client.mutex(args.key.as_str()).ttl(WORKER_TTL);
    let (mut sold, mut lost) = (0u64, 0u64);
    if args.without_lock {
        // No lock, so no fence either: every entry records fence 0.
        while !buy(&witness, 0, &mut sold)? {}
        crate::say!("sold {sold} lost 0");
        return Ok(OK);
    }
    loop {
        let guard = mutex.acquire_timeout(WORKER_WAIT).await.map_err(|e| match e {
            holdfast::Error::Timeout { .. } => {
                Failure::new(UNAVAILABLE, format!("no turn at the lock in {WORKER_WAIT:?}"))
            }
            e => e.into(),
        })?;
        let sold_out = buy(&witness, guard.fence(), &mut sold)?;
        match guard.release().await {
            Ok(()) => {}
            Err(holdfast::Error::Lost { .. }) => lost += 1,
            Err(e) => return Err(e.into()),
        }
        if sold_out {
            break;
        }
    }
    crate::say!("sold {sold} lost {lost}");
    Ok(OK)
}

/// Reads the stock. Only without the lock can a read meet another worker's
/// half-done write (an empty file); it then reads again.
fn read_counter(witness: &Witness) -> Result<i64, Failure> {
    let mut tries = 0;
    loop {
        match witness.counter() {
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData && tries < 1000 => tries += 1,
            other => return other.map_err(io_failure),
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Inside the lock: one purchase if any stock is left. Returns whether it was sold out.
fn buy(witness: &Witness, fence: u64, sold: &mut u64) -> Result<bool, Failure> {
    let inside = witness.enter(fence).map_err(io_failure)?;
    let left = read_counter(witness)?;
    if left > 0 {
        witness.set_counter(left - 1).map_err(io_failure)?;
        *sold += 1;
    }
    witness.exit(inside).map_err(io_failure)?;
    Ok(left <= 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(counter: i64, max_inside: u64, fences_increasing: bool) -> Report {
        Report { entries: 10, overlaps: max_inside.saturating_sub(1), max_inside, fences_increasing, counter }
    }

    #[test]
    fn verdict_catches_each_broken_invariant() {
        assert!(Verdict::new(10, 10, &report(0, 1, true)).ok());
        let oversold = Verdict::new(10, 11, &report(0, 1, true));
        assert_eq!(oversold.oversold, 1);
        assert!(!oversold.ok());
        assert!(!Verdict::new(10, 10, &report(0, 2, true)).ok());
        assert!(!Verdict::new(10, 10, &report(0, 1, false)).ok());
        assert!(!Verdict::new(10, 11, &report(-1, 1, true)).ok());
    }

    #[test]
    fn worker_lines_parse() {
        assert_eq!(parse_worker_line("sold 12 lost 0\n"), Some((12, 0)));
        assert_eq!(parse_worker_line("garbage"), None);
    }
}
