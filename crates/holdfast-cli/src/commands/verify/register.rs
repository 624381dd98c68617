//! The fenced register, served by the parent on a loopback TCP port, and the
//! parent's end of each worker's connection: workers send their records and
//! their writes here, as JSON lines.
//!
//! The register remembers the highest fence it accepted and the grant that
//! wrote it. A write is accepted if its fence is higher, or equal and from
//! the same grant (same process and fence); anything else is refused and
//! recorded: a stale write that fencing stopped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::clock::RunClock;
use super::record::{Micros, Phase, Record};
use super::sink::Sink;
use crate::cli::FaultKind;

/// A line from a worker to the parent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum ToParent {
    /// A record of the worker's own (a grant, `lost()`, a release, an error).
    Record {
        /// The record.
        record: Record,
    },
    /// A write to the register; the parent answers with a [`Reply`].
    Write {
        /// The writer's lane.
        lane: u32,
        /// The writer's process id.
        pid: u32,
        /// When the worker checked its lease and sent the write.
        issued: Micros,
        /// The fence.
        fence: u64,
        /// The writer's local lease deadline then.
        deadline: Micros,
    },
}

/// The register's answer to a write.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Reply {
    /// Whether the write was taken.
    pub accepted: bool,
}

/// The register's state: the highest fence taken and by whom.
#[derive(Debug, Default)]
struct Highest {
    fence: u64,
    pid: u32,
}

/// A pause armed for a worker's next write: its length, and whom to tell when it is over.
type Armed = (Duration, tokio::sync::oneshot::Sender<()>);

/// The register, and the pauses armed to hit a worker at its next write.
#[derive(Clone)]
pub struct Register {
    clock: RunClock,
    sink: Sink,
    highest: Arc<Mutex<Highest>>,
    armed: Arc<Mutex<HashMap<u32, Armed>>>,
}

impl Register {
    /// A register writing its decisions to `sink`.
    pub fn new(clock: RunClock, sink: Sink) -> Self {
        Register { clock, sink, highest: Arc::default(), armed: Arc::default() }
    }

    /// Decides one write now.
    fn decide(&self, lane: u32, pid: u32, issued: Micros, fence: u64, deadline: Micros) -> bool {
        let mut h = self.highest.lock().unwrap_or_else(|p| p.into_inner());
        let before = h.fence;
        let accepted = fence > h.fence || (fence == h.fence && pid == h.pid);
        if accepted {
            *h = Highest { fence, pid };
        }
        let t = self.clock.now();
        self.sink.push(Record::Write { t, issued, lane, pid, fence, deadline, accepted, highest: before });
        accepted
    }

    /// Arms a pause of `length` for worker `pid` at its next write: the
    /// worker is stopped (SIGSTOP) when the write arrives, before the
    /// register decides it, and continued (SIGCONT) `length` later; then the
    /// write is decided. The receiver fires once the pause is over.
    pub fn pause_at_next_write(&self, pid: u32, length: Duration) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.armed.lock().unwrap_or_else(|p| p.into_inner()).insert(pid, (length, tx));
        rx
    }

    /// Disarms a pause that found no write to hit; true if it was still armed.
    pub fn disarm(&self, pid: u32) -> bool {
        self.armed.lock().unwrap_or_else(|p| p.into_inner()).remove(&pid).is_some()
    }

    /// Serves workers on `listener` until the process ends.
    pub async fn serve(self, listener: TcpListener) {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(self.clone().connection(stream));
        }
    }

    async fn connection(self, stream: TcpStream) {
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let msg: ToParent = match serde_json::from_str(&line) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(%e, line, "verify: bad line from a worker");
                    continue;
                }
            };
            match msg {
                ToParent::Record { record } => self.sink.push(record),
                ToParent::Write { lane, pid, issued, fence, deadline } => {
                    let armed = self.armed.lock().unwrap_or_else(|p| p.into_inner()).remove(&pid);
                    if let Some((length, done)) = armed {
                        self.pause(lane, pid, length, true).await;
                        let _ = done.send(());
                    }
                    let accepted = self.decide(lane, pid, issued, fence, deadline);
                    let reply = serde_json::to_string(&Reply { accepted }).unwrap_or_default() + "\n";
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        break;
                    }
                }
            }
        }
    }

    /// Stops `pid` for `length` (SIGSTOP, then SIGCONT), recording both edges.
    pub async fn pause(&self, lane: u32, pid: u32, length: Duration, holder: bool) {
        self.stop_for(FaultKind::Pause, lane, pid, length, holder).await;
    }

    /// Stops `pid` for `length` as fault `kind`, recording both edges.
    pub async fn stop_for(&self, kind: FaultKind, lane: u32, pid: u32, length: Duration, holder: bool) {
        use nix::sys::signal::{Signal, kill};
        let target = nix::unistd::Pid::from_raw(pid as i32);
        if kill(target, Signal::SIGSTOP).is_err() {
            return;
        }
        self.sink.push(Record::Fault { t: self.clock.now(), kind, lane, pid, phase: Phase::Start, holder });
        tokio::time::sleep(length).await;
        let _ = kill(target, Signal::SIGCONT);
        self.sink.push(Record::Fault { t: self.clock.now(), kind, lane, pid, phase: Phase::End, holder });
    }
}
