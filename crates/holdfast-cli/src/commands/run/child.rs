//! Starting CMD and stopping it.
//!
//! CMD gets a parent-death signal: if holdfast itself is killed (SIGKILL,
//! the OOM killer), the kernel SIGKILLs CMD, which would otherwise run on
//! with nobody renewing its lease. Linux ties that signal to the *thread*
//! that forked CMD, so CMD is spawned from one thread that lives as long as
//! holdfast, never from a tokio pool thread that may end while CMD runs.
//! Only CMD itself gets it: processes CMD started live on unless CMD's own
//! death ends them.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getppid};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::exit::INTERNAL;

/// Where CMD's signals go.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// CMD's own process group (its id is CMD's pid).
    Group(Pid),
    /// CMD alone (it shares holdfast's group, see `terminal`).
    Process(Pid),
}

impl Target {
    /// Sends `sig`; an ended CMD is not an error.
    pub(crate) fn send(self, sig: Signal) {
        let _ = match self {
            Target::Group(pgid) => killpg(pgid, sig),
            Target::Process(pid) => kill(pid, sig),
        };
    }

    /// Whether any process of CMD's own group is left that can still run
    /// (after CMD was reaped; zombies do not count).
    fn group_can_run(self) -> bool {
        match self {
            Target::Group(pgid) => super::procfs::group_can_run(pgid),
            Target::Process(_) => false,
        }
    }
}

/// How CMD starts: in a process group of its own or not, and whether it
/// makes its group the foreground of this terminal before exec.
pub(crate) struct Setup {
    /// CMD leads a new process group.
    pub own_group: bool,
    /// The terminal whose foreground CMD takes (needs `own_group`).
    pub terminal: Option<OwnedFd>,
}

/// Spawns `command` as [`Setup`] says, with SIGKILL as its parent-death signal.
pub(crate) async fn spawn(mut command: Command, setup: Setup) -> io::Result<Child> {
    if setup.own_group {
        command.process_group(0);
    }
    before_exec(&mut command, std::process::id(), setup.terminal);
    let (reply, result) = tokio::sync::oneshot::channel();
    // tokio's Command::spawn registers the child with the runtime it runs in.
    let runtime = tokio::runtime::Handle::current();
    lasting_thread()?
        .send(Box::new(move || {
            let _runtime = runtime.enter();
            let _ = reply.send(command.spawn());
        }))
        .map_err(|_| io::Error::other("the spawning thread is gone"))?;
    result.await.map_err(|_| io::Error::other("the spawning thread is gone"))?
}

type Job = Box<dyn FnOnce() + Send>;

/// The thread CMD is spawned from, started on first use; it lives until
/// holdfast exits (its channel's sender is never dropped).
fn lasting_thread() -> io::Result<mpsc::Sender<Job>> {
    static SENDER: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);
    let mut sender = SENDER.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(sender) = sender.as_ref() {
        return Ok(sender.clone());
    }
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new().name("holdfast-spawner".into()).spawn(move || {
        for job in rx {
            job();
        }
    })?;
    *sender = Some(tx.clone());
    Ok(tx)
}

/// Installs what CMD does between fork and exec: see [`in_child_before_exec`].
#[allow(unsafe_code)]
fn before_exec(command: &mut Command, holdfast: u32, terminal: Option<OwnedFd>) {
    // SAFETY: the closure runs in the forked child, where only
    // async-signal-safe work is sound. `in_child_before_exec` makes system
    // calls only (prctl, getppid, pthread_sigmask, tcsetpgrp, getpgrp) through
    // nix wrappers that neither allocate nor lock, on values the closure owns.
    unsafe {
        command.pre_exec(move || in_child_before_exec(holdfast, terminal.as_ref()));
    }
}

/// In CMD before exec: SIGKILL when holdfast dies; the terminal's foreground.
fn in_child_before_exec(holdfast: u32, terminal: Option<&OwnedFd>) -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    // holdfast may have died between fork and prctl; no signal would come then.
    if getppid().as_raw() as u32 != holdfast {
        return Err(io::Error::from(io::ErrorKind::BrokenPipe));
    }
    if let Some(tty) = terminal {
        super::terminal::take_foreground(tty)?;
    }
    Ok(())
}

/// SIGTERM (and SIGCONT, so that a stopped CMD acts on it); SIGKILL once
/// `grace` has passed with CMD or anything of its own group alive. Returns
/// once CMD has been reaped and its group is gone, or `linger` after the
/// SIGKILL: SIGKILL ends a process the next time it would run, but one in an
/// uninterruptible system call (disk, NFS) finishes that call first.
pub(crate) async fn stop(child: &mut Child, target: Target, grace: Duration, linger: Duration) {
    target.send(Signal::SIGTERM);
    target.send(Signal::SIGCONT);
    let deadline = Instant::now() + grace;
    let exited = tokio::time::timeout_at(deadline, child.wait()).await.is_ok();
    // CMD is gone; give the rest of its group the same grace.
    while exited && Instant::now() < deadline && target.group_can_run() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed = !exited || target.group_can_run();
    if killed {
        target.send(Signal::SIGKILL);
    }
    if !exited {
        let _ = child.wait().await;
    }
    let linger_until = Instant::now() + linger;
    while killed && target.group_can_run() && Instant::now() < linger_until {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tracing::debug!(exited_on_sigterm = !killed, "command stopped");
}

/// The shell's view of an exit status: the code, or 128 + the signal number.
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
        (None, None) => INTERNAL,
    }
}
