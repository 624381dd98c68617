//! The fault injector: one fault at a time, round robin over the kinds
//! asked for, each aimed at a worker that holds the lock now.

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::clock::RunClock;
use super::record::{Micros, Phase, Record};
use super::register::Register;
use super::sink::Sink;
use super::spawn;
use crate::cli::FaultKind;

/// How long a pause lasts: past the store's lease, so that it runs out there.
pub fn pause_length(ttl: Duration) -> Duration {
    ttl * 3 / 2 + Duration::from_millis(200)
}

/// How long a slowed worker stops: its renewal runs late, within the TTL.
pub fn slow_length(ttl: Duration) -> Duration {
    ttl * 3 / 5
}

/// What faults are aimed at.
pub struct Target {
    /// The history, which also says who holds now.
    pub sink: Sink,
    /// The register, which pauses a worker at its write.
    pub register: Register,
    /// The server, with `--spawn`.
    pub server: Option<spawn::Shared>,
    /// Each lane's proxy to the store (empty without `--faults partition`).
    pub proxies: Vec<std::sync::Arc<holdfast_verify::proxy::FaultProxy>>,
    /// How long the store keeps a lease unrenewed (the TTL, or more: see
    /// [`store_lease`](super::store_lease)); pauses outlast it.
    pub store_lease: Duration,
}

/// Injects `kinds` until `until` (on the run's clock).
pub async fn inject(kinds: Vec<FaultKind>, ttl: Duration, clock: RunClock, until: Micros, target: Target) {
    if kinds.is_empty() {
        return;
    }
    let Target { sink, register: reg, server, store_lease, proxies } = target;
    // Let the workers start and settle first.
    tokio::time::sleep(ttl / 2).await;
    let mut pauses = 0u32;
    for kind in kinds.iter().cycle() {
        let budget = match kind {
            // Room for the store to free the key and grant it again (its
            // lease + the 1 s bound) before the run ends, so that every kill
            // can be judged: a kill near the end left the expiry unmeasured.
            FaultKind::Kill => store_lease + Duration::from_secs(1),
            FaultKind::Pause => pause_length(store_lease),
            FaultKind::Slow => slow_length(ttl),
            FaultKind::Restart => ttl * 2,
            FaultKind::Leader => ttl * 3,
            FaultKind::Partition => pause_length(store_lease),
        };
        if clock.now() + budget.as_micros() as Micros >= until {
            return;
        }
        if let (true, Some(server)) = (kind.is_server(), &server) {
            server_fault(*kind, ttl, clock, &sink, server.clone()).await;
            tokio::time::sleep(ttl).await;
            continue;
        }
        let Some((lane, pid, exclusive)) = holder(&sink, clock, until).await else { return };
        let target = Pid::from_raw(pid as i32);
        match kind {
            FaultKind::Kill => {
                if kill(target, Signal::SIGKILL).is_ok() {
                    sink.push(Record::Fault {
                        t: clock.now(),
                        kind: *kind,
                        lane,
                        pid,
                        phase: Phase::Start,
                        holder: true,
                    });
                }
            }
            FaultKind::Pause => {
                pauses += 1;
                let length = pause_length(store_lease);
                // A shared holder (reader, permits) writes nothing: it is
                // stopped where it is, as every other pause.
                if pauses % 2 == 1 && exclusive {
                    // At its next write: between its lease check and the write.
                    let done = reg.pause_at_next_write(pid, length);
                    match tokio::time::timeout(ttl, done).await {
                        Ok(_) => {}
                        Err(_) if reg.disarm(pid) => reg.pause(lane, pid, length, sink.holds(pid)).await,
                        // It was hit just as the timeout ran out.
                        Err(_) => tokio::time::sleep(length).await,
                    }
                } else {
                    reg.pause(lane, pid, length, true).await;
                }
            }
            FaultKind::Slow => reg.stop_for(*kind, lane, pid, slow_length(ttl), true).await,
            FaultKind::Partition => {
                let Some(proxy) = proxies.get(lane as usize).cloned() else { continue };
                let at = |phase| Record::Fault { t: clock.now(), kind: *kind, lane, pid, phase, holder: true };
                proxy.blackhole();
                sink.push(at(Phase::Start));
                tokio::time::sleep(pause_length(store_lease)).await;
                // Connections that lived through the partition are dropped, as a real one's time out.
                let _ = tokio::task::spawn_blocking(move || {
                    proxy.cut();
                    proxy.forward();
                })
                .await;
                sink.push(at(Phase::End));
            }
            FaultKind::Restart | FaultKind::Leader => {}
        }
        // Let the lock change hands before the next fault.
        tokio::time::sleep(ttl).await;
    }
}

/// A lane holding the lock now, waiting for one up to `until`.
/// Returns its lane, its process and whether it holds the key alone.
async fn holder(sink: &Sink, clock: RunClock, until: Micros) -> Option<(u32, u32, bool)> {
    while clock.now() < until {
        let holders = sink.holders();
        if !holders.is_empty() {
            // Any of them, by the clock's low bits (no two runs alike).
            let (lane, h) = holders[clock.now().unsigned_abs() as usize % holders.len()];
            return Some((lane, h.pid, h.exclusive));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// A call on the spawned server, run on a blocking thread.
type ServerCall = Box<dyn FnOnce(&mut spawn::Spawned) -> Option<usize> + Send>;

/// A server fault: `restart` (SIGKILL, start again on the same data) or
/// `leader` (SIGKILL the ensemble's leader; etcd's is started again after
/// one TTL). Recorded with pid 0; for `leader`, lane is the member.
async fn server_fault(kind: FaultKind, ttl: Duration, clock: RunClock, sink: &Sink, server: spawn::Shared) {
    let record =
        |phase, member: u32| Record::Fault { t: clock.now(), kind, lane: member, pid: 0, phase, holder: false };
    let blocking = |f: ServerCall| {
        let server = server.clone();
        tokio::task::spawn_blocking(move || f(&mut server.lock().unwrap_or_else(|p| p.into_inner())))
    };
    match kind {
        FaultKind::Restart => {
            sink.push(record(Phase::Start, 0));
            let _ = blocking(Box::new(|s| {
                s.restart();
                None
            }))
            .await;
            sink.push(record(Phase::End, 0));
        }
        _ => {
            let t = clock.now();
            let Ok(Some(member)) = blocking(Box::new(spawn::Spawned::kill_leader)).await else { return };
            sink.push(Record::Fault { t, kind, lane: member as u32, pid: 0, phase: Phase::Start, holder: false });
            tokio::time::sleep(ttl).await;
            let _ = blocking(Box::new(move |s| {
                s.revive(member);
                None
            }))
            .await;
            sink.push(record(Phase::End, member as u32));
        }
    }
}
