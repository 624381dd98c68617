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

use holdfast::audit::Witness;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::{DemoArgs, DemoWorkerArgs, ENV_BACKEND};
use crate::exit::{Failure, INTERNAL, INVARIANT_BROKEN, OK, UNAVAILABLE};
use crate::{duration, redact};

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

    println!(
        "holdfast demo: {} workers sell {} items under lock {key:?} on {store} ({})",
        args.workers,
        args.stock,
        redact::url(&url)
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
    let left = report.counter;
    let really_sold = args.stock as i64 - left;
    let oversold = sold as i64 - really_sold;
    let ok_oversold = oversold == 0 && left >= 0;
    let ok_inside = report.max_inside <= 1;
    let ok_fences = report.fences_increasing;
    let mark = |ok: bool| if ok { "ok" } else { "BROKEN" };
    let rate = sold as f64 / elapsed.as_secs_f64().max(1e-9);
    println!("sold               {sold}");
    println!("left               {left}");
    println!("oversold           {oversold}    {} (must be 0)", mark(ok_oversold));
    println!("max holders inside {}    {} (must be 1)", report.max_inside, mark(ok_inside));
    println!(
        "fences             {}    {} ({} grants, each fence above the one before)",
        if ok_fences { "strictly increasing" } else { "NOT increasing" },
        mark(ok_fences),
        report.entries
    );
    println!("leases lost        {lost}");
    println!("throughput         {rate:.0} items/s ({sold} items in {})", duration::show(elapsed));
    if ok_oversold && ok_inside && ok_fences {
        println!("result             ok: no item oversold, one holder at a time");
        Ok(OK)
    } else {
        println!("result             BROKEN: the lock let more than one holder in");
        Ok(INVARIANT_BROKEN)
    }
}

fn progress_bar(len: u64) -> ProgressBar {
    // Drawn on stderr, and only when stderr is a terminal.
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} sold  {per_sec}  {elapsed}") {
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
    loop {
        let guard = mutex.acquire_timeout(WORKER_WAIT).await.map_err(|e| match e {
            holdfast::Error::Timeout { .. } => Failure::new(UNAVAILABLE, format!("no turn at the lock in {WORKER_WAIT:?}")),
            e => e.into(),
        })?;
        let sold_out = buy(&witness, guard.fence(), &mut sold)?;
        match guard.release().await {
            Ok(()) => {}
            Err(holdfast::Error::Lost { .. } | holdfast::Error::NotHeld { .. }) => lost += 1,
            Err(e) => return Err(e.into()),
        }
        if sold_out {
            break;
        }
    }
    println!("sold {sold} lost {lost}");
    Ok(OK)
}

/// Inside the lock: one purchase if any stock is left. Returns whether it was sold out.
fn buy(witness: &Witness, fence: u64, sold: &mut u64) -> Result<bool, Failure> {
    let inside = witness.enter(fence).map_err(io_failure)?;
    let left = witness.counter().map_err(io_failure)?;
    if left > 0 {
        witness.set_counter(left - 1).map_err(io_failure)?;
        *sold += 1;
    }
    witness.exit(inside).map_err(io_failure)?;
    Ok(left <= 0)
}

