//! CMD on a terminal, run the way a shell runs a job.
//!
//! When stdin is a terminal and holdfast's process group is its foreground
//! group, CMD gets a process group of its own and makes it the terminal's
//! foreground before it execs (so it never runs in the background): CMD
//! reads the terminal, Ctrl-C and Ctrl-Z reach CMD's group, and a lost lease
//! or a forwarded signal reach every process in it. holdfast takes the
//! terminal back when CMD is done (on drop of [`Terminal`]).
//!
//! Ctrl-Z stops CMD's group only, so holdfast finishes the job: under a
//! job-control shell it takes the terminal back and stops its own group with
//! SIGTSTP, so the shell reports the job stopped; on `fg` (SIGCONT) it gives
//! the terminal back to CMD and continues it. holdfast renews nothing while
//! it is stopped: a job stopped longer than its lease loses it, and CMD is
//! stopped (exit 74) once continued. Without such a shell (holdfast's group
//! is orphaned, as under `script` or `ssh -t host holdfast ...`) nobody could
//! continue the job, and the terminal itself discards Ctrl-Z for orphaned
//! groups: holdfast continues CMD at once.
//!
//! A stop of CMD's group that CMD's own process survives is a stop of the
//! job too. holdfast hears of its child's stops only (SIGCHLD), so while CMD
//! has the terminal it also looks through CMD's group every
//! [`STOP_POLL`] for a stopped member. Two ways to get there: CMD catches
//! SIGTSTP and goes on waiting for a child that Ctrl-Z stopped; or Ctrl-Z
//! lands while a shell vforks (dash, `posix_spawn`): the vfork child stops
//! before it execs, and the shell cannot stop until it does. Without this
//! the command would hang, and the lock with it.
//!
//! holdfast leaves the terminal alone when processes other than its own
//! ancestors share its process group, as in `holdfast run ... | less`: they
//! may be using the terminal. CMD then stays in holdfast's group, where the
//! terminal delivers Ctrl-C to everyone, and holdfast's signals reach CMD alone.

use std::io::IsTerminal;
use std::os::fd::{AsFd, OwnedFd};

use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};

use super::procfs::{self, Stat};

/// How often holdfast looks for a stopped member of CMD's group while CMD
/// has the terminal (see the module docs): a scan of `/proc`, so not often.
pub(crate) const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// Where CMD runs, relative to holdfast's process group and the terminal.
#[derive(Debug)]
pub(crate) enum Placement {
    /// CMD leads a process group of its own; signals go to the whole group.
    OwnGroup,
    /// The same, and CMD's group is the terminal's foreground while it runs.
    Foreground(Terminal),
    /// CMD stays in holdfast's process group, which shares the terminal with
    /// other processes; signals go to CMD alone.
    SharedGroup,
}

impl Placement {
    /// Looks at stdin and holdfast's process group (see the module docs).
    pub(crate) fn choose() -> Self {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Placement::OwnGroup;
        }
        let holdfast_group = getpgrp();
        // In the background, or stdin is not holdfast's controlling terminal:
        // CMD could not read it in holdfast's group either.
        if tcgetpgrp(stdin.as_fd()) != Ok(holdfast_group) {
            return Placement::OwnGroup;
        }
        let Ok(family) = Family::survey() else {
            return Placement::SharedGroup;
        };
        if !family.alone_with_ancestors {
            return Placement::SharedGroup;
        }
        match stdin.as_fd().try_clone_to_owned() {
            Ok(tty) => Placement::Foreground(Terminal {
                tty,
                holdfast_group,
                command_group: None,
                job_control: family.job_control,
            }),
            Err(_) => Placement::SharedGroup,
        }
    }
}

/// The terminal while CMD's group is its foreground group.
#[derive(Debug)]
pub(crate) struct Terminal {
    tty: OwnedFd,
    holdfast_group: Pid,
    /// CMD's group, once CMD has started.
    command_group: Option<Pid>,
    /// A shell in holdfast's session (outside its group) can resume a stopped holdfast.
    job_control: bool,
}

impl Terminal {
    /// A descriptor of the terminal for CMD, which makes its own group the
    /// foreground before exec (closed on exec).
    pub(crate) fn for_command(&self) -> std::io::Result<OwnedFd> {
        self.tty.try_clone()
    }

    /// CMD has started and leads process group `group`.
    pub(crate) fn started(&mut self, group: Pid) {
        self.command_group = Some(group);
    }

    /// Whether CMD's group has a stopped member (its leader or another).
    pub(crate) fn command_group_stopped(&self) -> bool {
        self.command_group.is_some_and(procfs::group_has_stopped_member)
    }

    /// CMD's group has stopped (Ctrl-Z, SIGTTIN, SIGSTOP): stop holdfast's
    /// group too, as the terminal would have, and return true; or, with no
    /// shell to resume it, continue CMD and return false.
    pub(crate) fn command_stopped(&self, command_group: Pid) -> bool {
        if !self.job_control {
            let _ = killpg(command_group, Signal::SIGCONT);
            return false;
        }
        self.give_to(self.holdfast_group);
        let _ = killpg(self.holdfast_group, Signal::SIGTSTP);
        true
    }

    /// holdfast was continued after [`command_stopped`](Self::command_stopped):
    /// in the foreground (`fg`) CMD gets the terminal back; either way it continues.
    pub(crate) fn resumed(&self, command_group: Pid) {
        if tcgetpgrp(&self.tty) == Ok(self.holdfast_group) {
            self.give_to(command_group);
        }
        let _ = killpg(command_group, Signal::SIGCONT);
    }

    fn give_to(&self, group: Pid) {
        if let Err(e) = with_sigttou_blocked(|| tcsetpgrp(&self.tty, group)) {
            tracing::debug!(%e, "could not set the terminal's foreground group");
        }
    }
}

impl Drop for Terminal {
    /// Takes the terminal back from CMD's group; not from a shell that has
    /// since taken it (after Ctrl-Z and `bg`, holdfast runs in the background).
    fn drop(&mut self) {
        let foreground = tcgetpgrp(&self.tty);
        let cmd_has_it = match self.command_group {
            Some(group) => foreground == Ok(group),
            // CMD may have taken the terminal, then failed to exec.
            None => foreground != Ok(self.holdfast_group),
        };
        if cmd_has_it {
            self.give_to(self.holdfast_group);
        }
    }
}

/// Makes the calling process's group the foreground of `tty`. Called in CMD
/// between fork and exec: it makes only system calls, no allocation.
pub(crate) fn take_foreground(tty: &OwnedFd) -> nix::Result<()> {
    with_sigttou_blocked(|| tcsetpgrp(tty, getpgrp()))
}

/// Runs `f` with SIGTTOU blocked on this thread: a process outside the
/// terminal's foreground group may set the foreground group only then (or
/// with SIGTTOU ignored); otherwise the kernel stops it with SIGTTOU.
fn with_sigttou_blocked<T>(f: impl FnOnce() -> nix::Result<T>) -> nix::Result<T> {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut before = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut before))?;
    let result = f();
    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None)?;
    result
}

/// Whether `pid` (a child of holdfast) is stopped, without reaping it.
pub(crate) fn is_stopped(pid: Pid) -> bool {
    let flags = WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    matches!(waitid(Id::Pid(pid), flags), Ok(WaitStatus::Stopped(..)))
}

/// holdfast's place among the processes of its group, from /proc.
struct Family {
    /// No process but holdfast and its ancestors is in holdfast's group.
    alone_with_ancestors: bool,
    /// The group is not orphaned: the first ancestor outside it is in the same session.
    job_control: bool,
}

impl Family {
    fn survey() -> std::io::Result<Self> {
        let me = std::process::id() as i32;
        let mine = Stat::of(me)?;
        let mut in_group = vec![me];
        let mut job_control = false;
        let mut pid = me;
        // Bounded: a parent chain is short, and /proc may change under us.
        for _ in 0..64 {
            let ppid = Stat::of(pid)?.ppid;
            if ppid <= 0 {
                break;
            }
            let parent = Stat::of(ppid)?;
            if parent.pgrp != mine.pgrp {
                job_control = parent.session == mine.session;
                break;
            }
            in_group.push(ppid);
            pid = ppid;
        }
        // A process that exits during the walk is no one to worry about.
        let mut others = procfs::pids()?.filter(|pid| !in_group.contains(pid));
        let alone_with_ancestors = !others.any(|pid| Stat::of(pid).is_ok_and(|s| s.pgrp == mine.pgrp));
        Ok(Family { alone_with_ancestors, job_control })
    }
}
