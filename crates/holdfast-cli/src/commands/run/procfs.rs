//! What `/proc` says about processes: their group and session, and whether
//! a process group still has a member that can run, or one that is stopped.

use nix::sys::signal::killpg;
use nix::unistd::Pid;

/// The fields of `/proc/PID/stat` used here.
pub(crate) struct Stat {
    /// `R`, `S`, `D`, `T`, `Z`, ...
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
}

impl Stat {
    /// Reads `/proc/PID/stat`.
    pub(crate) fn of(pid: i32) -> std::io::Result<Self> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let malformed = || std::io::Error::other(format!("/proc/{pid}/stat is malformed"));
        // The command name may contain anything, ')' included: fields start after the last ')'.
        let (_, rest) = text.rsplit_once(')').ok_or_else(malformed)?;
        let mut fields = rest.split_whitespace();
        let state = fields.next().and_then(|s| s.chars().next()).ok_or_else(malformed)?;
        let mut numbers = fields.map(|f| f.parse::<i32>());
        match (numbers.next(), numbers.next(), numbers.next()) {
            (Some(Ok(ppid)), Some(Ok(pgrp)), Some(Ok(session))) => Ok(Stat { state, ppid, pgrp, session }),
            _ => Err(malformed()),
        }
    }

    /// A zombie (or a dying task) runs nothing any more.
    fn can_run(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// The process ids in `/proc` (processes that end during the walk may be missing or fail to read).
pub(crate) fn pids() -> std::io::Result<impl Iterator<Item = i32>> {
    Ok(std::fs::read_dir("/proc")?.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok()))
}

/// The members of process group `pgid` as `/proc` lists them, or `None` if
/// `/proc` cannot be read.
fn group_members(pgid: Pid) -> Option<impl Iterator<Item = Stat>> {
    let pids = pids().ok()?;
    Some(pids.filter_map(|pid| Stat::of(pid).ok()).filter(move |s| s.pgrp == pgid.as_raw()))
}

/// Whether process group `pgid` has a member that is not a zombie. A
/// zombie still counts for `kill`, and orphans' zombies may stay unreaped
/// for good under a PID 1 that does not reap (some containers).
pub(crate) fn group_can_run(pgid: Pid) -> bool {
    if killpg(pgid, None).is_err() {
        return false;
    }
    group_members(pgid).is_none_or(|mut members| members.any(|s| s.can_run()))
}

/// Whether a member of process group `pgid`, its leader or another, is
/// stopped by a signal (state `T`; not `t`, a process a debugger stopped).
/// holdfast hears only of its own child's stops (SIGCHLD); this finds the
/// others.
pub(crate) fn group_has_stopped_member(pgid: Pid) -> bool {
    group_members(pgid).is_some_and(|mut members| members.any(|s| s.state == 'T'))
}
