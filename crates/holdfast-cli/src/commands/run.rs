//! `holdfast run --key K -- CMD [ARGS]`: run a command while holding a lock.
//!
//! The lock is taken first; CMD then runs in its own process group with
//! `HOLDFAST_KEY` and `HOLDFAST_FENCE` set, while the library renews the
//! lease. Three things can end the run:
//!
//! - CMD exits: the lock is released and CMD's status is passed through
//!   (128 + signal number if a signal killed it).
//! - The lease is lost (`guard.lost()`): CMD's process group gets SIGTERM,
//!   then SIGKILL once `--kill-after` has passed with anything of it still
//!   alive; holdfast exits [`LEASE_LOST`].
//! - holdfast gets SIGINT, SIGTERM or SIGHUP: the signal is forwarded to CMD's
//!   process group, holdfast keeps holding (and renewing) the lock until CMD
//!   has exited, then releases it and passes CMD's status through.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::cli::{ENV_FENCE, ENV_KEY, RunArgs};
use crate::duration;
use crate::exit::{BUSY, Failure, INTERNAL, LEASE_LOST, NOT_EXECUTABLE, NOT_FOUND};

/// Runs `args.command` under the lock `args.key`; returns the exit code.
pub async fn run(args: RunArgs) -> Result<u8, Failure> {
    let Some((program, program_args)) = args.command.split_first() else {
        return Err(Failure::usage("no command given; usage: holdfast run --key KEY [OPTIONS] -- CMD [ARGS]..."));
    };
    // Everything that can be checked without I/O, before any I/O.
    holdfast::LockKey::new(args.key.as_str())?;
    holdfast::check_ttl(args.ttl)?;
    let max_hold = args.max_hold.map(|d| duration::non_zero("--max-hold", d)).transpose()?;
    let url = args.backend.url()?;

    let mut signals = Signals::new()?;
    let client = super::connect(&url, args.label.clone()).await?;
    let mut mutex = client.mutex(args.key.as_str()).ttl(args.ttl);
    if let Some(max_hold) = max_hold {
        mutex = mutex.max_hold(max_hold);
    }

    tracing::debug!(key = %args.key, "waiting for the lock");
    let acquire = async {
        match args.wait {
            Some(wait) if wait.is_zero() => mutex.try_acquire().await?.ok_or_else(|| busy(&args.key, None)),
            Some(wait) => mutex.acquire_timeout(wait).await.map_err(|e| match e {
                holdfast::Error::Timeout { waited, .. } => busy(&args.key, Some(waited)),
                other => other.into(),
            }),
            None => Ok(mutex.acquire().await?),
        }
    };
    let guard = tokio::select! {
        guard = acquire => guard?,
        signo = signals.recv() => {
            eprintln!("holdfast: got signal {signo} while waiting for lock {:?}; giving up", args.key);
            // The dropped acquire releases an attempt that raced the signal in the
            // background; give that a moment before the runtime stops (past it, such
            // a grant expires after --ttl).
            tokio::time::sleep(Duration::from_millis(200)).await;
            return Ok(128 + signo);
        }
    };
    tracing::info!(key = %args.key, fence = guard.fence(), "lock acquired");
    if guard.is_lost() {
        // Lost between the grant and here (a stalled process): do not start CMD unprotected.
        eprintln!("holdfast: lease on lock {:?} was lost before the command could start", args.key);
        return Ok(LEASE_LOST);
    }

    let mut child = match Command::new(program)
        .args(program_args)
        .env(ENV_KEY, &args.key)
        .env(ENV_FENCE, guard.fence().to_string())
        .process_group(0)
        .kill_on_drop(false)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            release(guard, &args.key).await;
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => NOT_FOUND,
                std::io::ErrorKind::PermissionDenied => NOT_EXECUTABLE,
                _ => NOT_EXECUTABLE,
            };
            let what = if code == NOT_FOUND { "command not found".to_owned() } else { e.to_string() };
            return Err(Failure::new(code, format!("{program}: {what}")));
        }
    };
    let pgid = match child.id() {
        Some(pid) => Pid::from_raw(pid as i32),
        None => return Err(Failure::new(INTERNAL, "the command's process id is unknown")),
    };

    let lost = guard.lost();
    tokio::pin!(lost);
    let status = loop {
        tokio::select! {
            biased;
            status = child.wait() => break status,
            _ = &mut lost => {
                eprintln!(
                    "holdfast: lease on lock {:?} lost while the command ran; stopping it (SIGTERM, SIGKILL after {})",
                    args.key,
                    duration::show(args.kill_after)
                );
                stop(&mut child, pgid, args.kill_after).await;
                // Tidy up if the store still has the grant; never hang on a store that is down.
                let _ = tokio::time::timeout(RELEASE_AFTER_LOSS, guard.release()).await;
                return Ok(LEASE_LOST);
            }
            signo = signals.recv() => {
                tracing::info!(signo, "forwarding signal to the command");
                if let Ok(sig) = Signal::try_from(signo as i32) {
                    let _ = killpg(pgid, sig);
                }
            }
        }
    };
    let status = status.map_err(|e| Failure::new(INTERNAL, format!("waiting for the command: {e}")))?;
    match guard.release().await {
        Ok(()) => Ok(exit_code(status)),
        Err(holdfast::Error::Lost { .. } | holdfast::Error::NotHeld { .. }) => {
            eprintln!("holdfast: lease on lock {:?} ran out before the command finished", args.key);
            Ok(LEASE_LOST)
        }
        Err(e) => {
            // The command ran under the lock; only the release failed, and the lease will expire.
            eprintln!("holdfast: warning: could not release lock {:?} (it expires within its TTL): {e}", args.key);
            Ok(exit_code(status))
        }
    }
}

/// How long to try releasing a lost lease before exiting anyway.
const RELEASE_AFTER_LOSS: Duration = Duration::from_secs(1);

fn busy(key: &str, waited: Option<Duration>) -> Failure {
    let msg = match waited {
        Some(w) => format!("lock {key:?} is busy (waited {})", duration::show(w)),
        None => format!("lock {key:?} is busy"),
    };
    Failure::new(BUSY, msg)
}

async fn release(guard: holdfast::MutexGuard, key: &str) {
    if let Err(e) = guard.release().await {
        eprintln!("holdfast: warning: could not release lock {key:?}: {e}");
    }
}

/// The shell's view of an exit status: the code, or 128 + the signal number.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
        (None, None) => INTERNAL,
    }
}

/// SIGTERM to the process group; SIGKILL once `grace` has passed with any of it alive.
async fn stop(child: &mut Child, pgid: Pid, grace: Duration) {
    let _ = killpg(pgid, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    let mut exited = tokio::time::timeout_at(deadline, child.wait()).await.is_ok();
    // The command is gone (or the grace ran out); wait for the rest of its group too.
    while exited && Instant::now() < deadline && group_alive(pgid) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if group_alive(pgid) {
        let _ = killpg(pgid, Signal::SIGKILL);
    }
    if !exited {
        exited = child.wait().await.is_ok();
    }
    tracing::debug!(exited, "command stopped");
}

fn group_alive(pgid: Pid) -> bool {
    killpg(pgid, None).is_ok()
}

/// SIGINT, SIGTERM and SIGHUP, as numbers.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self, Failure> {
        let listen = |kind| signal(kind).map_err(|e| Failure::new(INTERNAL, format!("cannot listen for signals: {e}")));
        Ok(Signals {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) -> u8 {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT as u8,
            _ = self.term.recv() => Signal::SIGTERM as u8,
            _ = self.hup.recv() => Signal::SIGHUP as u8,
        }
    }
}
