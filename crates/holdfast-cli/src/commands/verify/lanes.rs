//! The worker processes, one lane each: a lane whose worker dies (killed by
//! a fault, or failing) gets a new worker until the run's end.

use std::process::Stdio;
use std::time::Duration;

use super::clock::RunClock;
use super::record::{Micros, Record};
use super::sink::Sink;
use crate::cli::{ENV_BACKEND, Primitive};
use crate::exit::{Failure, INTERNAL};

/// What every worker is told.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The store URL of each lane (the same, or each through its own proxy).
    pub urls: Vec<String>,
    /// The lock key.
    pub key: String,
    /// The register's address.
    pub register: String,
    /// The lease TTL.
    pub ttl: Duration,
    /// The run's clock.
    pub clock: RunClock,
    /// When workers stop taking the lock.
    pub until: Micros,
    /// The primitive they exercise.
    pub primitive: Primitive,
    /// The semaphore's permit count.
    pub permits: u32,
}

/// Starts `workers` lanes.
pub fn start(plan: Plan, workers: u32, sink: Sink) -> Result<Vec<tokio::task::JoinHandle<()>>, Failure> {
    let exe = std::env::current_exe().map_err(|e| Failure::new(INTERNAL, format!("cannot find my own binary: {e}")))?;
    Ok((0..workers).map(|lane| tokio::spawn(lane_loop(exe.clone(), plan.clone(), lane, sink.clone()))).collect())
}

/// Waits for every lane to end, at most `within`; false if some had to be killed.
/// A lane still running then is aborted, which kills its worker.
pub async fn finish(lanes: Vec<tokio::task::JoinHandle<()>>, within: Duration) -> bool {
    let aborts: Vec<_> = lanes.iter().map(|l| l.abort_handle()).collect();
    let ended = tokio::time::timeout(within, futures_join(lanes)).await.is_ok();
    aborts.iter().for_each(tokio::task::AbortHandle::abort);
    ended
}

async fn futures_join(lanes: Vec<tokio::task::JoinHandle<()>>) {
    for lane in lanes {
        let _ = lane.await;
    }
}

async fn lane_loop(exe: std::path::PathBuf, plan: Plan, lane: u32, sink: Sink) {
    let mut failures = 0u32;
    while plan.clock.now() < plan.until && failures < 20 {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("__verify-worker").args(["--key", &plan.key, "--register", &plan.register]);
        cmd.args(["--lane", &lane.to_string(), "--ttl-ms", &plan.ttl.as_millis().to_string()]);
        cmd.args(["--epoch-us", &plan.clock.epoch.to_string(), "--until-us", &plan.until.to_string()]);
        cmd.args(["--primitive", plan.primitive.name(), "--permits", &plan.permits.to_string()]);
        let child = cmd
            .env(ENV_BACKEND, &plan.urls[lane as usize % plan.urls.len()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                let message = format!("cannot start a worker: {e}");
                sink.push(Record::Error { t: plan.clock.now(), lane, pid: 0, message });
                return;
            }
        };
        let pid = child.id().unwrap_or(0);
        sink.push(Record::Spawn { t: plan.clock.now(), lane, pid });
        let out = child.wait_with_output().await;
        let status = match &out {
            Ok(o) => describe(o.status),
            Err(e) => format!("wait failed: {e}"),
        };
        if let Ok(o) = &out
            && !o.status.success()
            && o.status.code().is_some()
        {
            failures += 1;
            let why = String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("no message").to_owned();
            sink.push(Record::Error { t: plan.clock.now(), lane, pid, message: format!("worker failed: {why}") });
        }
        sink.push(Record::Exit { t: plan.clock.now(), lane, pid, status });
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "unknown".to_owned(),
    }
}
