//! What the hand-over model remembers: the store's lock hash, each task's
//! view, the one hand-over call that may be in flight, and what the
//! properties check.

use std::fmt;

/// A token: the task and which of its acquisitions (each draws a new one).
pub type Token = (u8, u8);

/// The store's lock hash `H` (the fields the hand-over reads and writes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Store {
    /// `o`: the token of the last grant.
    pub o: Option<Token>,
    /// `x`: the end of `o`'s lease on the store clock, 0 once released.
    pub x: u8,
    /// `f`: the lock's last fence.
    pub f: u8,
    /// `hn`: the grant made by the last hand-over and how many hand-overs
    /// in a row led to it (a grant of another token is a fresh chain).
    pub chain: Option<(Token, u8)>,
}

/// Where a task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Task {
    /// Holds nothing; may start an acquisition while it has some left.
    Idle,
    /// Waits with `token`. `taken`: a releaser of its process took its
    /// offer and a hand-over call for it is under way, so the task does not
    /// return its own grant (`own`: fence and lease end, real time) before
    /// that call's outcome is known.
    Waiting {
        /// The acquisition's token.
        token: Token,
        /// A hand-over to this task is under way.
        taken: bool,
        /// A grant its own attempt got meanwhile.
        own: Option<(u8, u8)>,
    },
    /// Holds `token` with `fence`, counting the lease until `until`.
    Holding {
        /// The grant's token.
        token: Token,
        /// The grant's fence.
        fence: u8,
        /// The lease's end as the task counts it (real time).
        until: u8,
    },
    /// Its acquire future was dropped (cancelled); it does nothing more.
    Gone,
}

/// How far the hand-over call has come.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Not applied by the store yet (it may never be).
    Pending,
    /// Applied: the lease passed to the waiter's token with this fence.
    Handed(u8),
    /// Applied: refused (the releaser's lease was gone, or the bound).
    Refused,
}

/// The releaser's side of a hand-over call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Waiting for the reply.
    Sent,
    /// The call failed without a reply (timeout, connection lost): the
    /// releaser releases its own token next.
    TimedOut,
    /// Its own release is confirmed: it tells the waiter next (or releases
    /// the waiter's token if the waiter is gone).
    Settling,
    /// The releaser is done; only a late request may still be applied.
    Settled,
}

/// The hand-over call in flight (one at most: one holder at a time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Flight {
    /// The releaser's token.
    pub from: Token,
    /// The waiter's token (its own acquisition's).
    pub to: Token,
    /// The waiting task.
    pub waiter: u8,
    /// When the releaser sent it (real time): the waiter counts the handed
    /// lease from here.
    pub sent: u8,
    /// The store's side.
    pub outcome: Outcome,
    /// The releaser's side.
    pub stage: Stage,
}

/// The whole state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HandOverState {
    /// Real time, which the store clock follows here (drift is the
    /// `fair_handoff` model's subject).
    pub now: u8,
    /// The lock hash.
    pub store: Store,
    /// Each task's phase (tasks 0 and 1 in process A, task 2 in process B).
    pub tasks: Vec<Task>,
    /// Acquisitions each task started.
    pub used: Vec<u8>,
    /// The hand-over call in flight.
    pub flight: Option<Flight>,
    /// Hand-overs applied while B's task waited since the lock was last
    /// free to it (granted fresh, released, or expired).
    pub passed: u8,
    /// The highest fence the store issued.
    pub top_fence: u8,
    /// A new grant's fence was not above every earlier one.
    pub fence_went_back: bool,
    /// A task ever held a handed grant (reachability).
    pub handed_reached: bool,
    /// The bound ever refused a hand-over (reachability).
    pub bound_reached: bool,
}

impl HandOverState {
    /// Whether two tasks count themselves the holder at once.
    pub fn two_holders(&self) -> bool {
        let live = self.tasks.iter().filter(|t| matches!(t, Task::Holding { until, .. } if *until > self.now));
        live.count() > 1
    }

    /// Whether the store keeps a live lease for a token no task will ever
    /// use or release (a leaked grant), with no call under way that could
    /// still change it.
    pub fn orphan(&self) -> bool {
        if self.flight.is_some() {
            return false;
        }
        let Some(o) = self.store.o else { return false };
        if self.store.x <= self.now {
            return false;
        }
        !matches!(self.tasks[o.0 as usize],
            Task::Holding { token, .. } | Task::Waiting { token, .. } if token == o)
    }
}

/// A task's name in traces: A0 and A1 (process A), B0 (process B).
pub fn task_name(t: u8) -> &'static str {
    ["A0", "A1", "B0"][t as usize]
}

fn tok(t: Token) -> String {
    format!("{}#{}", task_name(t.0), t.1)
}

/// Writes each task's phase into a trace line ("; A0 waits A0#1 (offer
/// taken)"), naming tasks by `name`: this model's and `share_handover`'s.
pub fn write_tasks(f: &mut fmt::Formatter<'_>, tasks: &[Task], name: fn(u8) -> &'static str) -> fmt::Result {
    let tok = |t: Token| format!("{}#{}", name(t.0), t.1);
    for (i, t) in tasks.iter().enumerate() {
        let name = name(i as u8);
        match t {
            Task::Idle => {}
            Task::Waiting { token, taken, own } => {
                write!(f, "; {name} waits {}", tok(*token))?;
                if *taken {
                    write!(f, " (offer taken)")?;
                }
                if let Some((fence, until)) = own {
                    write!(f, " (own grant f={fence} until {until})")?;
                }
            }
            Task::Holding { token, fence, until } => {
                write!(f, "; {name} holds {} f={fence} until {until}", tok(*token))?
            }
            Task::Gone => write!(f, "; {name} cancelled")?,
        }
    }
    Ok(())
}

impl fmt::Display for HandOverState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.store;
        write!(f, "t={} H o={} x={} f={}", self.now, s.o.map_or("-".into(), tok), s.x, s.f)?;
        if let Some((t, n)) = s.chain {
            write!(f, " hn={} {n}", tok(t))?;
        }
        write_tasks(f, &self.tasks, task_name)?;
        if let Some(fl) = &self.flight {
            write!(f, "; hand-over {}->{} sent {} {:?} {:?}", tok(fl.from), tok(fl.to), fl.sent, fl.outcome, fl.stage)?;
        }
        if self.passed > 0 {
            write!(f, "; B0 passed over {}x", self.passed)?;
        }
        if self.fence_went_back {
            write!(f, " (a fence did not increase)")?;
        }
        Ok(())
    }
}
