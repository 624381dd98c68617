//! Model 6: the Redis store's local hand-over (issue 33, item 2): a release
//! that passes the lock straight to a waiting task of the same process, in
//! one store call, bounded so that other processes are not kept out.
//!
//! One store key: holder `o`, lease end `x` on the store clock, fence `f`,
//! and `hn`, the grant the last hand-over made with the count of hand-overs
//! in a row behind it. Process A runs tasks A0 and A1, process B task B0.
//! Tasks acquire by plain attempts (granted when the lease is gone, a new
//! fence, a lease of `ttl`; a retry by the holding token is granted again)
//! and release by token (owner- and clock-checked). A holder of A may
//! instead hand the lock to A's other task while it waits: it takes the
//! waiter's offer and sends one call, which the store applies when it likes
//! (or never): if `o` is the releaser's token with an unexpired lease, fair
//! waiters are not queued and fewer than `bound` hand-overs led to this
//! grant, `o` becomes the waiter's own token with the next fence and a fresh
//! TTL; otherwise nothing changes. The reply comes back (the waiter counts
//! the lease from the releaser's send), or the call fails without one: the
//! releaser then releases its own token, and only once that is confirmed
//! tells the waiter, which tries its own token again (a hand-over applied
//! meanwhile is found as a retry by the holder), or releases the waiter's
//! token if the waiter is gone. A waiter may be cancelled at any moment; its
//! client then releases its token (C9). While its offer is taken, the
//! waiter does not return a grant of its own attempts before the call's
//! outcome is known (a releaser told "gone" releases the waiter's token).
//!
//! The store clock is real time here: clock drift and steps are the
//! subjects of `fair_handoff` and `redis_cycle`, and a hand-over's lease is
//! a lease like any other (counted by the waiter from before the call).

mod state;

pub use state::{Flight, HandOverState, Outcome, Stage, Store, Task, Token, task_name, write_tasks};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandOverVariant {
    /// Shipped: as described in the module docs.
    Shipped,
    /// Rejected: no bound on hand-overs in a row.
    NoBound,
    /// Rejected: the store checks that the releaser's token is `o`, not
    /// that its lease is unexpired (a released lease keeps `o`).
    NoLeaseCheck,
    /// Rejected: the handed grant keeps the releaser's fence.
    KeepFence,
    /// Rejected: the waiter counts the handed lease from the reply.
    LeaseFromReply,
    /// Rejected: after a call without a reply, the releaser tells the
    /// waiter (or releases the gone waiter's token) before its own release.
    TellBeforeRelease,
}

/// Name of the mutual-exclusion property.
pub const MUTUAL_EXCLUSION: &str = "no two tasks count themselves the holder at once";
/// Name of the fence-order property.
pub const FENCES_INCREASE: &str = "each grant's fence is above every earlier grant's";
/// Name of the no-leak property.
pub const NO_LEAKED_GRANT: &str = "no live lease is left to a token no task will use or release";
/// Name of the bounded-bypass property.
pub const BOUNDED_BYPASS: &str = "another process's waiter is passed over by at most `bound` hand-overs";
/// Reachability: a task holds a handed grant.
pub const HAND_OVER_HAPPENS: &str = "a task holds a grant handed over by its process";
/// Reachability: the bound refuses a hand-over.
pub const BOUND_REFUSES: &str = "the bound refuses a hand-over";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct HandOverModel {
    /// Which design.
    pub variant: HandOverVariant,
    /// Acquisitions per task: A0, A1, B0.
    pub acquisitions: [u8; 3],
    /// Lease TTL, in ticks.
    pub ttl: u8,
    /// Hand-overs in a row the store allows.
    pub bound: u8,
    /// Real time stops here.
    pub horizon: u8,
}

impl HandOverModel {
    /// A0 and A1 two acquisitions each, B0 one; TTL 2, bound 1, time 1..6.
    pub fn new(variant: HandOverVariant) -> Self {
        HandOverModel { variant, acquisitions: [2, 2, 1], ttl: 2, bound: 1, horizon: 6 }
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandOverAction {
    /// A task starts an acquisition (a new token).
    Begin(u8),
    /// A waiting task makes an attempt.
    Attempt(u8),
    /// A holder releases by its token.
    Release(u8),
    /// A holder of process A takes its other task's offer and sends a hand-over.
    HandOver(u8),
    /// The store applies the hand-over call.
    Apply,
    /// The hand-over's reply reaches the releaser.
    Reply,
    /// The hand-over call fails at the releaser without a reply.
    TimeOut,
    /// The releaser's next step after a failed call.
    Settle,
    /// A waiting task's acquire is dropped; its client releases its token.
    Cancel(u8),
    /// Time moves one tick.
    Tick,
}

impl fmt::Display for HandOverAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Begin(t) => write!(f, "{} starts an acquisition", task_name(*t)),
            Self::Attempt(t) => write!(f, "{} attempts", task_name(*t)),
            Self::Release(t) => write!(f, "{} releases", task_name(*t)),
            Self::HandOver(t) => write!(f, "{} hands over to its waiting peer", task_name(*t)),
            Self::Apply => write!(f, "the store applies the hand-over"),
            Self::Reply => write!(f, "the hand-over's reply arrives"),
            Self::TimeOut => write!(f, "the hand-over call fails without a reply"),
            Self::Settle => write!(f, "the releaser settles the failed call"),
            Self::Cancel(t) => write!(f, "{} is cancelled", task_name(*t)),
            Self::Tick => write!(f, "time passes"),
        }
    }
}

impl HandOverModel {
    /// A new grant (not a retry's) at the store: `f + 1`, a fresh lease.
    fn grant(&self, s: &mut HandOverState, token: Token, keep_fence: bool) -> u8 {
        let fence = if keep_fence { s.store.f } else { s.store.f + 1 };
        if s.top_fence > 0 && fence <= s.top_fence {
            s.fence_went_back = true;
        }
        s.top_fence = s.top_fence.max(fence);
        s.store.f = fence;
        s.store.o = Some(token);
        s.store.x = s.now + self.ttl;
        fence
    }

    /// An owner- and clock-checked release of `token` (release.lua).
    fn store_release(s: &mut HandOverState, token: Token) {
        if s.store.o == Some(token) && s.store.x > s.now {
            s.store.x = 0;
            s.passed = 0;
        }
    }

    fn attempt(&self, s: &mut HandOverState, t: u8) {
        let Task::Waiting { token, taken, own } = s.tasks[t as usize] else { return };
        let st = &mut s.store;
        let fence = if st.o == Some(token) && st.x > s.now {
            // A retry by the holder (a hand-over applied meanwhile).
            st.x = s.now + self.ttl;
            st.f
        } else if st.o.is_none() || st.x <= s.now {
            s.passed = 0;
            self.grant(s, token, false)
        } else {
            return;
        };
        let until = s.now + self.ttl;
        s.tasks[t as usize] = if taken {
            Task::Waiting { token, taken, own: Some(own.map_or((fence, until), |(_, u)| (fence, u.min(until)))) }
        } else {
            Task::Holding { token, fence, until }
        };
    }

    fn apply(&self, s: &mut HandOverState) {
        let Some(mut fl) = s.flight else { return };
        let st = &s.store;
        let in_row = match st.chain {
            Some((t, n)) if t == fl.from => n,
            _ => 0,
        };
        let lease_ok = self.variant == HandOverVariant::NoLeaseCheck || st.x > s.now;
        let under_bound = self.variant == HandOverVariant::NoBound || in_row < self.bound;
        if st.o == Some(fl.from) && lease_ok && under_bound {
            let fence = self.grant(s, fl.to, self.variant == HandOverVariant::KeepFence);
            s.store.chain = Some((fl.to, in_row + 1));
            if matches!(s.tasks[2], Task::Waiting { .. }) {
                s.passed += 1;
            }
            fl.outcome = Outcome::Handed(fence);
        } else {
            if st.o == Some(fl.from) && st.x > s.now {
                s.bound_reached = true;
            }
            fl.outcome = Outcome::Refused;
        }
        s.flight = if fl.stage == Stage::Settled { None } else { Some(fl) };
    }

    /// The waiter learns the call's outcome: `handed` with its fence, or
    /// not (it goes on waiting, or returns its own grant).
    fn tell_waiter(&self, s: &mut HandOverState, fl: &Flight, handed: Option<u8>, reply_at: u8) {
        let Task::Waiting { token, own, .. } = s.tasks[fl.waiter as usize] else { return };
        s.tasks[fl.waiter as usize] = match (handed, own) {
            (Some(fence), _) => {
                let from = if self.variant == HandOverVariant::LeaseFromReply { reply_at } else { fl.sent };
                s.handed_reached = true;
                Task::Holding { token, fence, until: from + self.ttl }
            }
            (None, Some((fence, until))) => Task::Holding { token, fence, until },
            (None, None) => Task::Waiting { token, taken: false, own: None },
        };
    }

    fn reply(&self, s: &mut HandOverState) {
        let Some(fl) = s.flight else { return };
        s.flight = None;
        match fl.outcome {
            Outcome::Handed(fence) => {
                if s.tasks[fl.waiter as usize] == Task::Gone {
                    // The oneshot's receiver is gone: release its token.
                    Self::store_release(s, fl.to);
                } else {
                    self.tell_waiter(s, &fl, Some(fence), s.now);
                }
            }
            Outcome::Refused => {
                Self::store_release(s, fl.from);
                self.tell_waiter(s, &fl, None, s.now);
            }
            Outcome::Pending => unreachable!("no reply before the store applied the call"),
        }
    }

    fn settle(&self, s: &mut HandOverState) {
        let Some(mut fl) = s.flight else { return };
        let tell_first = self.variant == HandOverVariant::TellBeforeRelease;
        match (fl.stage, tell_first) {
            (Stage::TimedOut, false) | (Stage::Settling, true) => {
                Self::store_release(s, fl.from);
                fl.stage = if tell_first { Stage::Settled } else { Stage::Settling };
            }
            (Stage::Settling, false) | (Stage::TimedOut, true) => {
                if s.tasks[fl.waiter as usize] == Task::Gone {
                    Self::store_release(s, fl.to);
                } else {
                    self.tell_waiter(s, &fl, None, s.now);
                }
                fl.stage = if tell_first { Stage::Settling } else { Stage::Settled };
            }
            _ => return,
        }
        s.flight = if fl.stage == Stage::Settled && fl.outcome != Outcome::Pending { None } else { Some(fl) };
    }
}

impl Model for HandOverModel {
    type State = HandOverState;
    type Action = HandOverAction;

    fn init_states(&self) -> Vec<HandOverState> {
        vec![HandOverState {
            now: 1,
            store: Store { o: None, x: 0, f: 0, chain: None },
            tasks: vec![Task::Idle; 3],
            used: vec![0; 3],
            flight: None,
            passed: 0,
            top_fence: 0,
            fence_went_back: false,
            handed_reached: false,
            bound_reached: false,
        }]
    }

    fn actions(&self, s: &HandOverState, actions: &mut Vec<HandOverAction>) {
        for t in 0..3u8 {
            match s.tasks[t as usize] {
                Task::Idle if s.used[t as usize] < self.acquisitions[t as usize] => {
                    actions.push(HandOverAction::Begin(t))
                }
                Task::Waiting { .. } => actions.extend([HandOverAction::Attempt(t), HandOverAction::Cancel(t)]),
                Task::Holding { .. } => {
                    actions.push(HandOverAction::Release(t));
                    let peer = 1 - t.min(1);
                    if t < 2
                        && s.flight.is_none()
                        && matches!(s.tasks[peer as usize], Task::Waiting { taken: false, .. })
                    {
                        actions.push(HandOverAction::HandOver(t));
                    }
                }
                _ => {}
            }
        }
        if let Some(fl) = s.flight {
            if fl.outcome == Outcome::Pending {
                actions.push(HandOverAction::Apply);
            }
            match fl.stage {
                Stage::Sent if fl.outcome != Outcome::Pending => actions.push(HandOverAction::Reply),
                _ => {}
            }
            match fl.stage {
                Stage::Sent => actions.push(HandOverAction::TimeOut),
                Stage::TimedOut | Stage::Settling => actions.push(HandOverAction::Settle),
                Stage::Settled => {}
            }
        }
        if s.now < self.horizon {
            actions.push(HandOverAction::Tick);
        }
    }

    fn next_state(&self, s: &HandOverState, action: HandOverAction) -> Option<HandOverState> {
        let mut n = s.clone();
        match action {
            HandOverAction::Begin(t) => {
                n.used[t as usize] += 1;
                n.tasks[t as usize] = Task::Waiting { token: (t, n.used[t as usize]), taken: false, own: None };
                if t == 2 {
                    n.passed = 0;
                }
            }
            HandOverAction::Attempt(t) => self.attempt(&mut n, t),
            HandOverAction::Release(t) => {
                if let Task::Holding { token, .. } = n.tasks[t as usize] {
                    Self::store_release(&mut n, token);
                    n.tasks[t as usize] = Task::Idle;
                }
            }
            HandOverAction::HandOver(t) => {
                let Task::Holding { token: from, .. } = n.tasks[t as usize] else { return None };
                let peer = 1 - t;
                let Task::Waiting { token: to, own, .. } = n.tasks[peer as usize] else { return None };
                n.tasks[peer as usize] = Task::Waiting { token: to, taken: true, own };
                n.tasks[t as usize] = Task::Idle;
                n.flight =
                    Some(Flight { from, to, waiter: peer, sent: n.now, outcome: Outcome::Pending, stage: Stage::Sent });
            }
            HandOverAction::Apply => self.apply(&mut n),
            HandOverAction::Reply => self.reply(&mut n),
            HandOverAction::TimeOut => {
                if let Some(fl) = n.flight.as_mut() {
                    fl.stage = Stage::TimedOut;
                }
            }
            HandOverAction::Settle => self.settle(&mut n),
            HandOverAction::Cancel(t) => {
                if let Task::Waiting { token, .. } = n.tasks[t as usize] {
                    // The client's cleanup releases the attempt's token (C9).
                    Self::store_release(&mut n, token);
                    n.tasks[t as usize] = Task::Gone;
                }
            }
            HandOverAction::Tick => {
                n.now += 1;
                if n.store.x <= n.now {
                    // The lease ran out: B0 may be granted at its next attempt.
                    n.passed = 0;
                }
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(MUTUAL_EXCLUSION, |_, s: &HandOverState| !s.two_holders()),
            Property::always(FENCES_INCREASE, |_, s: &HandOverState| !s.fence_went_back),
            Property::always(NO_LEAKED_GRANT, |_, s: &HandOverState| !s.orphan()),
            Property::always(BOUNDED_BYPASS, |m, s: &HandOverState| s.passed <= m.bound),
            Property::sometimes(HAND_OVER_HAPPENS, |_, s: &HandOverState| s.handed_reached),
            Property::sometimes(BOUND_REFUSES, |_, s: &HandOverState| s.bound_reached),
        ]
    }
}
