//! One demo worker process (`holdfast __demo-worker`): `--tasks` buyer
//! tasks that buy one item at a time until the stock is gone, then one line
//! on stdout, `sold N lost L`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use holdfast_verify::witness::Witness;

use super::{WORKER_TTL, WORKER_WAIT, io_failure};
use crate::cli::{DemoWorkerArgs, ENV_BACKEND};
use crate::exit::{Failure, INTERNAL, OK, UNAVAILABLE};

/// What one buyer task did.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    sold: u64,
    lost: u64,
}

/// How the buyers sell: without a lock, under one mutex, or segmented.
#[derive(Clone)]
enum Sale {
    Unlocked(Witness),
    OneLock(holdfast::Mutex, Witness),
    Segmented(holdfast::Segmented, Arc<Vec<Witness>>),
}

/// One worker: buys items until the stock is gone, then prints `sold N lost L`.
pub async fn worker(args: DemoWorkerArgs) -> Result<u8, Failure> {
    let url = args.backend.backend.clone().ok_or_else(|| Failure::usage(format!("{ENV_BACKEND} is not set")))?;
    let client = super::super::connect(&url, None).await?;
    let sale = match args.segments {
        _ if args.without_lock => Sale::Unlocked(Witness::new(&args.witness).map_err(io_failure)?),
        None => Sale::OneLock(
            client.mutex(args.key.as_str()).ttl(WORKER_TTL),
            Witness::new(&args.witness).map_err(io_failure)?,
        ),
        Some(n) => {
            let seg = client.segmented(args.key.as_str(), n as usize)?.ttl(WORKER_TTL).wait_timeout(WORKER_WAIT);
            let witnesses = (0..n).map(|i| segment_witness(&args.witness, i)).collect::<Result<Vec<_>, _>>()?;
            Sale::Segmented(seg, Arc::new(witnesses))
        }
    };
    let work = Duration::from_millis(args.work_ms);
    let tasks: Vec<_> =
        (0..args.tasks).map(|t| tokio::spawn(buyer(sale.clone(), work, format!("buyer-{}-{t}", args.index)))).collect();
    let mut total = Tally::default();
    for task in tasks {
        let tally = task.await.map_err(|e| Failure::new(INTERNAL, format!("buyer task: {e}")))??;
        total.sold += tally.sold;
        total.lost += tally.lost;
    }
    crate::say!("sold {} lost {}", total.sold, total.lost);
    Ok(OK)
}

/// Segment `i`'s witness under the demo's witness directory.
pub(super) fn segment_witness(dir: &Path, i: u32) -> Result<Witness, Failure> {
    Witness::new(dir.join(format!("seg-{i}"))).map_err(io_failure)
}

/// One buyer task: one purchase after another, each by a new buyer id
/// (`{who}-{n}`), until sold out.
async fn buyer(sale: Sale, work: Duration, who: String) -> Result<Tally, Failure> {
    let mut tally = Tally::default();
    let no_turn = |e| match e {
        holdfast::Error::Timeout { .. } => Failure::new(UNAVAILABLE, format!("no turn at the lock in {WORKER_WAIT:?}")),
        e => e.into(),
    };
    for n in 0u64.. {
        let (guard, witness, fence) = match &sale {
            Sale::Unlocked(w) => {
                // No lock, so no fence either: every entry records fence 0.
                if buy(w, 0, work, &mut tally).await? {
                    break;
                }
                continue;
            }
            Sale::OneLock(mutex, w) => {
                let guard = mutex.acquire_timeout(WORKER_WAIT).await.map_err(no_turn)?;
                let fence = guard.fence();
                (guard, w, fence)
            }
            Sale::Segmented(seg, ws) => {
                let id = format!("{who}-{n}");
                let has_stock = |i: usize| {
                    let ws = ws.clone();
                    async move { Ok::<_, Failure>(read_counter(&ws[i])? > 0) }
                };
                let Some(guard) = seg.acquire_available(&id, has_stock).await? else { break };
                let fence = guard.fence();
                let witness = &ws[guard.segment()];
                (guard.into_mutex_guard(), witness, fence)
            }
        };
        let sold_out = buy(witness, fence, work, &mut tally).await?;
        match guard.release().await {
            Ok(()) => {}
            Err(holdfast::Error::Lost { .. }) => tally.lost += 1,
            Err(e) => return Err(e.into()),
        }
        // One lock: a buyer that found the stock gone stops. Segmented: the
        // check under the lock said there was stock; the next id falls over.
        if sold_out && matches!(sale, Sale::OneLock(..)) {
            break;
        }
    }
    Ok(tally)
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

/// Inside the lock: one purchase if any stock is left, the simulated work
/// (`work`) between reading the stock and writing it back. Returns whether
/// it was sold out.
async fn buy(witness: &Witness, fence: u64, work: Duration, tally: &mut Tally) -> Result<bool, Failure> {
    let inside = witness.enter(fence).map_err(io_failure)?;
    let left = read_counter(witness)?;
    if left > 0 {
        if !work.is_zero() {
            tokio::time::sleep(work).await;
        }
        witness.set_counter(left - 1).map_err(io_failure)?;
        tally.sold += 1;
    }
    witness.exit(inside).map_err(io_failure)?;
    Ok(left <= 0)
}
