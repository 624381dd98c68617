//! One verify worker process (`holdfast __verify-worker`): loops acquire,
//! critical section, release on one key (of the `--primitive` asked for)
//! until the run's end, sending its records and its register writes to the
//! parent over one TCP connection.
//!
//! Before each write it checks that it still believes it holds the lock
//! (`is_lost()`, which also compares the local lease deadline with the
//! clock); a worker paused between that check and the write's arrival is
//! the case fencing exists for, and the register decides it.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Mutex;

use super::clock::RunClock;
use super::held::{Acquirer, Held};
use super::record::{Micros, Record};
use super::register::{Reply, ToParent};
use crate::cli::{ENV_BACKEND, VerifyWorkerArgs};
use crate::exit::{Failure, INTERNAL, OK, UNAVAILABLE};

/// Steps (writes, or checks for a shared grant) per critical section, spread over [`hold`].
const WRITES: u32 = 3;

/// How long a worker holds the lock per grant: 40% of the TTL, so that a
/// grant usually sees one renewal and faults meet holders mid-section.
pub fn hold(ttl: Duration) -> Duration {
    ttl * 2 / 5
}

/// The worker's link to the parent.
struct Link {
    write: Mutex<OwnedWriteHalf>,
    replies: Mutex<Lines<BufReader<OwnedReadHalf>>>,
}

impl Link {
    async fn send(&self, msg: &ToParent) -> Result<(), Failure> {
        let line = serde_json::to_string(msg).map_err(|e| Failure::new(INTERNAL, e.to_string()))? + "\n";
        self.write.lock().await.write_all(line.as_bytes()).await.map_err(parent_gone)
    }

    async fn record(&self, record: Record) -> Result<(), Failure> {
        self.send(&ToParent::Record { record }).await
    }
}

fn parent_gone(e: std::io::Error) -> Failure {
    Failure::new(INTERNAL, format!("verify worker: lost the parent: {e}"))
}

/// When the worker last saw a leadership still held: a leader's lease
/// deadline is not shown by the library, so this stands in for it (a lower
/// bound: a paused leader's belief ends where it was stopped).
type Alive = std::sync::Arc<std::sync::atomic::AtomicI64>;

/// The local lease deadline now, as far as the worker can tell (see [`Alive`]).
fn deadline(held: &Held, clock: RunClock, alive: &Alive) -> Micros {
    use std::sync::atomic::Ordering;
    match held.valid_until() {
        Some(at) => clock.at(at),
        None => {
            let now = clock.now();
            if !held.is_lost() {
                alive.fetch_max(now, Ordering::Relaxed);
            }
            alive.load(Ordering::Relaxed)
        }
    }
}

/// One worker, until `--until-us`.
pub async fn worker(args: VerifyWorkerArgs) -> Result<u8, Failure> {
    // Die with the parent, whatever kills it.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    let url = args.backend.backend.clone().ok_or_else(|| Failure::usage(format!("{ENV_BACKEND} is not set")))?;
    let ttl = Duration::from_millis(args.ttl_ms);
    let url = super::super::run::timing::zk_session_fitting(&url, ttl);
    let stream = TcpStream::connect(&args.register).await.map_err(parent_gone)?;
    let (read, write) = stream.into_split();
    let link =
        std::sync::Arc::new(Link { write: Mutex::new(write), replies: Mutex::new(BufReader::new(read).lines()) });
    let clock = RunClock { epoch: args.epoch_us };
    let (lane, pid) = (args.lane, std::process::id());
    let client = super::super::connect(&url, Some(format!("verify-lane-{lane}-pid-{pid}"))).await?;
    let acquirer = Acquirer::new(client.clone(), &args.key, ttl, args.primitive, args.permits, lane);
    let value = format!("lane-{lane}-pid-{pid}");
    let until = args.until_us;
    let mut n = 0u64;
    while clock.now() < until {
        let left = Duration::from_micros((until - clock.now()).max(0) as u64);
        let held = tokio::select! {
            r = acquirer.acquire(n, left + ttl, &value) => r,
            _ = tokio::time::sleep(left) => break,
        };
        n += 1;
        let held = match held {
            Ok(Some(h)) => h,
            Ok(None) => continue,
            Err(e) => {
                link.record(Record::Error { t: clock.now(), lane, pid, message: e.to_string() }).await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (fence, what) = (held.fence(), held.hold());
        let t = clock.now();
        let alive: Alive = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(t));
        let at_grant = deadline(&held, clock, &alive);
        link.record(Record::Grant { t, lane, pid, fence, deadline: at_grant, hold: what }).await?;
        let watcher = {
            let (link, lost, alive) = (link.clone(), held.lost(), alive.clone());
            // The deadline as of the grant: a lower bound (renewals
            // move it later); the checker takes the latest it knows.
            let at_grant = held.valid_until().map(|v| clock.at(v));
            tokio::spawn(async move {
                lost.await;
                let t = clock.now();
                let deadline = at_grant.unwrap_or_else(|| alive.load(std::sync::atomic::Ordering::Relaxed));
                let _ = link.record(Record::Lost { t, lane, pid, fence, deadline }).await;
            })
        };
        critical_section(&link, &held, &alive, clock, hold(ttl), lane, pid).await?;
        let (t, until) = (clock.now(), deadline(&held, clock, &alive));
        link.record(Record::Release { t, lane, pid, fence, deadline: until }).await?;
        let ok = match held.release().await {
            Ok(()) => true,
            Err(holdfast::Error::Lost { .. }) => false,
            Err(e) => {
                link.record(Record::Error { t: clock.now(), lane, pid, message: e.to_string() }).await?;
                false
            }
        };
        watcher.abort();
        link.record(Record::Released { t: clock.now(), lane, pid, fence, ok }).await?;
    }
    drop(acquirer);
    drop(client);
    Ok(OK)
}

/// The steps of one grant, spread over `length`, each only while the lease
/// is believed held: a write to the fenced register for a grant that holds
/// the key alone, a [`Record::Holding`] for a shared one (readers and
/// permits have no one order to write in).
async fn critical_section(
    link: &Link,
    held: &Held,
    alive: &Alive,
    clock: RunClock,
    length: Duration,
    lane: u32,
    pid: u32,
) -> Result<(), Failure> {
    let fence = held.fence();
    let gap = length / (WRITES - 1);
    for i in 0..WRITES {
        if i > 0 {
            tokio::time::sleep(gap).await;
        }
        if held.is_lost() {
            let until = deadline(held, clock, alive);
            return link.record(Record::Lost { t: clock.now(), lane, pid, fence, deadline: until }).await;
        }
        let (issued, until) = (clock.now(), deadline(held, clock, alive));
        if !held.hold().is_exclusive() {
            link.record(Record::Holding { t: issued, lane, pid, fence, deadline: until }).await?;
            continue;
        }
        link.send(&ToParent::Write { lane, pid, issued, fence, deadline: until }).await?;
        let reply = link.replies.lock().await.next_line().await.map_err(parent_gone)?;
        let reply: Reply = reply
            .and_then(|l| serde_json::from_str(&l).ok())
            .ok_or_else(|| Failure::new(UNAVAILABLE, "verify worker: the register closed"))?;
        if !reply.accepted {
            // Fenced out: someone newer wrote; stop using this grant.
            return Ok(());
        }
    }
    Ok(())
}
