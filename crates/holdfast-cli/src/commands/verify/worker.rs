//! One verify worker process (`holdfast __verify-worker`): loops acquire,
//! critical section, release on one key until the run's end, sending its
//! records and its register writes to the parent over one TCP connection.
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
use super::record::Record;
use super::register::{Reply, ToParent};
use crate::cli::{ENV_BACKEND, VerifyWorkerArgs};
use crate::exit::{Failure, INTERNAL, OK, UNAVAILABLE};

/// Writes per critical section, spread over [`hold`].
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
    let mutex = client.mutex(args.key.as_str()).ttl(ttl);
    let until = args.until_us;
    while clock.now() < until {
        let left = Duration::from_micros((until - clock.now()).max(0) as u64);
        let guard = tokio::select! {
            r = mutex.acquire_timeout(left + ttl) => r,
            _ = tokio::time::sleep(left) => break,
        };
        let guard = match guard {
            Ok(g) => g,
            Err(holdfast::Error::Timeout { .. }) => continue,
            Err(e) => {
                link.record(Record::Error { t: clock.now(), lane, pid, message: e.to_string() }).await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let fence = guard.fence();
        let t = clock.now();
        link.record(Record::Grant { t, lane, pid, fence, deadline: clock.at(guard.valid_until()) }).await?;
        let watcher = {
            let (link, lost) = (link.clone(), guard.lost());
            let valid_until = guard.valid_until();
            tokio::spawn(async move {
                lost.await;
                // The deadline as of the grant: a lower bound (renewals
                // move it later); the checker takes the latest it knows.
                let t = clock.now();
                let _ = link.record(Record::Lost { t, lane, pid, fence, deadline: clock.at(valid_until) }).await;
            })
        };
        critical_section(&link, &guard, clock, lane, pid).await?;
        let (t, deadline) = (clock.now(), clock.at(guard.valid_until()));
        link.record(Record::Release { t, lane, pid, fence, deadline }).await?;
        let ok = match guard.release().await {
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
    drop(client);
    Ok(OK)
}

/// The writes of one grant: each only while the lease is believed held.
async fn critical_section(
    link: &Link,
    guard: &holdfast::MutexGuard,
    clock: RunClock,
    lane: u32,
    pid: u32,
) -> Result<(), Failure> {
    let fence = guard.fence();
    let gap = hold(guard.ttl()) / (WRITES - 1);
    for i in 0..WRITES {
        if i > 0 {
            tokio::time::sleep(gap).await;
        }
        if guard.is_lost() {
            let deadline = clock.at(guard.valid_until());
            return link.record(Record::Lost { t: clock.now(), lane, pid, fence, deadline }).await;
        }
        let (issued, deadline) = (clock.now(), clock.at(guard.valid_until()));
        link.send(&ToParent::Write { lane, pid, issued, fence, deadline }).await?;
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
