//! `holdfast run --key K -- CMD [ARGS]`: run a command while holding a lock.
//!
//! The lock is taken first; CMD then runs with `HOLDFAST_KEY` and
//! `HOLDFAST_FENCE` set, while the library renews the lease. Three things can
//! end the run:
//!
//! - CMD exits: the lock is released and CMD's status is passed through
//!   (128 + signal number if a signal killed it).
//! - The lease is lost (`guard.lost()`): CMD gets SIGTERM, then SIGKILL once
//!   `--kill-after` has passed with it (or anything of its process group)
//!   still alive; holdfast exits [`LEASE_LOST`].
//! - holdfast gets SIGINT, SIGTERM or SIGHUP: the signal is forwarded to CMD,
//!   holdfast keeps holding (and renewing) the lock until CMD has exited, then
//!   releases it and passes CMD's status through.
//!
//! Process groups: when stdin is not a terminal (cron, CI, scripts), CMD runs
//! in a process group of its own and signals go to the whole group, so a
//! lost lease stops a script's children too. When stdin is a terminal, CMD
//! stays in holdfast's (foreground) group so that it can read the terminal;
//! signals then go to CMD alone, and SIGINT is not forwarded because the
//! terminal already delivers Ctrl-C to CMD.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use std::io::IsTerminal;

use nix::sys::signal::{Signal, kill, killpg};
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

    // Connecting holds nothing yet: until here SIGINT/SIGTERM simply end holdfast.
    let client = super::connect(&url, args.label.clone()).await?;
    let mut signals = Signals::new()?;
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
        let _ = tokio::time::timeout(RELEASE_AFTER_LOSS, guard.release()).await;
        return Ok(LEASE_LOST);
    }

    let interactive = std::io::stdin().is_terminal();
    let mut command = Command::new(program);
    command.args(program_args).env(ENV_KEY, &args.key).env(ENV_FENCE, guard.fence().to_string()).kill_on_drop(false);
    if !interactive {
        command.process_group(0);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            release(guard, &args.key).await;
            // As shells do: 127 when not found, 126 when found but not executable.
            return Err(if e.kind() == std::io::ErrorKind::NotFound {
                Failure::new(NOT_FOUND, format!("{program}: command not found"))
            } else {
                Failure::new(NOT_EXECUTABLE, format!("{program}: {e}"))
            });
        }
    };
    let target = match child.id() {
        Some(pid) if interactive => Target::Process(Pid::from_raw(pid as i32)),
        Some(pid) => Target::Group(Pid::from_raw(pid as i32)),
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
                stop(&mut child, target, args.kill_after).await;
                // Tidy up if the store still has the grant; never hang on a store that is down.
                let _ = tokio::time::timeout(RELEASE_AFTER_LOSS, guard.release()).await;
                return Ok(LEASE_LOST);
            }
            signo = signals.recv() => {
                let sig = Signal::try_from(i32::from(signo)).unwrap_or(Signal::SIGTERM);
                if matches!(target, Target::Process(_)) && sig == Signal::SIGINT {
                    tracing::debug!("SIGINT not forwarded: the terminal delivers it to the command");
                } else {
                    tracing::info!(signo, "forwarding signal to the command");
                    target.send(sig);
                }
            }
        }
    };
    let status = status.map_err(|e| Failure::new(INTERNAL, format!("waiting for the command: {e}")))?;
    match guard.release().await {
        Ok(()) => Ok(exit_code(status)),
        Err(holdfast::Error::Lost { .. }) => {
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

/// Where CMD's signals go.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// CMD's own process group (its id is CMD's pid).
    Group(Pid),
    /// CMD alone (it shares holdfast's group, for a terminal).
    Process(Pid),
}

impl Target {
    fn send(self, sig: Signal) {
        let _ = match self {
            Target::Group(pgid) => killpg(pgid, sig),
            Target::Process(pid) => kill(pid, sig),
        };
    }

    /// Whether any process of CMD's own group is left (after CMD was reaped).
    fn group_alive(self) -> bool {
        match self {
            Target::Group(pgid) => killpg(pgid, None).is_ok(),
            Target::Process(_) => false,
        }
    }
}

/// SIGTERM; SIGKILL once `grace` has passed with CMD (or its group) alive.
async fn stop(child: &mut Child, target: Target, grace: Duration) {
    target.send(Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    let exited = tokio::time::timeout_at(deadline, child.wait()).await.is_ok();
    // CMD is gone; give the rest of its group the same grace.
    while exited && Instant::now() < deadline && target.group_alive() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !exited || target.group_alive() {
        target.send(Signal::SIGKILL);
    }
    if !exited {
        let _ = child.wait().await;
    }
    tracing::debug!(exited_on_sigterm = exited, "command stopped");
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
