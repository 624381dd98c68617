//! Model 13: shared waiters of one process side by side (issue 33: the
//! semaphore whose rate one local head, asking after another, set).
//!
//! A store's semaphore of `limit` permits with first-come reservations (the
//! admission rule of holdfast's `backend/admission.rs`: a share is granted
//! when the permits held, the reservations placed before its own and its own
//! weight fit the limit; a refused waiting attempt places or keeps its
//! reservation). Another process holds every permit at the start and
//! releases them in one call. The process modelled has three tasks that
//! each want one permit; they take lanes of the key's local turn first come,
//! first served. A task in a lane arms its wake-up (tokio's `Notify`), sends
//! its attempt, and after a refusal sleeps until the wake-up fires. Every
//! release (and the cleanup of a cancelled waiter's reservation) fires one
//! wake-up: the oldest armed one, or, with none armed, one kept for the next
//! that is armed. A fired wake-up dropped unused is passed on (tokio does
//! so). A task that is granted leaves its lane to the next task, and holds
//! until it releases. One task may be cancelled once, at any point of its
//! wait. No fallback poll: a waiter that only a poll would wake is the defect
//! looked for.
//!
//! - `Shipped`: two lanes; a waiter granted after a refused attempt fires
//!   the next wake-up if another task is in a lane.
//! - `OneLane`: the design before, one lane (the local head).
//! - `NoCascade` (rejected): two lanes, and a grant passes nothing on.

mod state;

pub use state::{LanesState, Task, task_name};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LanesVariant {
    /// Shipped: lanes side by side; a granted waiter passes a wake-up on.
    Shipped,
    /// The design before: one lane.
    OneLane,
    /// Rejected: lanes side by side, nothing passed on.
    NoCascade,
}

/// Name of the limit property.
pub const WITHIN_LIMIT: &str = "the permits held never exceed the limit";
/// Name of the work-conserving property.
pub const NO_SLEEP_BESIDE_ROOM: &str = "no waiter sleeps, unwoken, while the store would grant it";
/// Name of the liveness property.
pub const ALL_SERVED: &str = "every task is granted and releases, or is cancelled";
/// Reachability: a waiter woken by a granted waiter's passed-on wake-up is granted.
pub const CASCADE_GRANTS: &str = "a passed-on wake-up leads to a grant";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct LanesModel {
    /// Which design.
    pub variant: LanesVariant,
    /// The semaphore's permits; the other process holds all of them at first.
    pub limit: u8,
    /// Tasks of the process modelled.
    pub tasks: u8,
}

impl LanesModel {
    /// Two permits, three tasks.
    pub fn new(variant: LanesVariant) -> Self {
        LanesModel { variant, limit: 2, tasks: 3 }
    }

    fn lanes(&self) -> u8 {
        match self.variant {
            LanesVariant::OneLane => 1,
            LanesVariant::Shipped | LanesVariant::NoCascade => self.limit,
        }
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LanesAction {
    /// The first queued task takes a free lane, arms its wake-up, sends its attempt.
    Enter(u8),
    /// The store applies a task's attempt and the reply arrives.
    Apply(u8),
    /// A woken task arms its wake-up again and sends its next attempt.
    Retry(u8),
    /// A holding task releases (the release fires a wake-up).
    Release(u8),
    /// The other process releases every permit it holds, in one call.
    OtherRelease,
    /// A task in a lane is cancelled; the client's cleanup removes its reservation.
    Cancel(u8),
}

impl fmt::Display for LanesAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Enter(t) => write!(f, "{} takes a lane and attempts", task_name(*t)),
            Self::Apply(t) => write!(f, "the store answers {}'s attempt", task_name(*t)),
            Self::Retry(t) => write!(f, "{}, woken, attempts again", task_name(*t)),
            Self::Release(t) => write!(f, "{} releases", task_name(*t)),
            Self::OtherRelease => write!(f, "the other process releases its permits"),
            Self::Cancel(t) => write!(f, "{} is cancelled", task_name(*t)),
        }
    }
}

impl LanesModel {
    /// Fires one wake-up: the oldest armed, or kept for the next.
    fn notify_one(s: &mut LanesState, cascade: bool) {
        if s.armed.is_empty() {
            s.stored = true;
            return;
        }
        let t = s.armed.remove(0);
        s.woken_by_cascade[t as usize] = cascade;
        s.tasks[t as usize] = match s.tasks[t as usize] {
            Task::Asleep => Task::Woken,
            Task::Attempting { waited, .. } => Task::Attempting { waited, fired: true },
            other => other,
        };
    }

    /// Task `t` arms its wake-up and sends an attempt; a kept wake-up fires at once.
    fn arm_and_attempt(s: &mut LanesState, t: u8, waited: bool) {
        let fired = std::mem::take(&mut s.stored);
        if !fired {
            s.armed.push(t);
        }
        s.tasks[t as usize] = Task::Attempting { waited, fired };
    }

    /// Task `t`'s wake-up is disarmed; one that fired unused is passed on.
    fn disarm(s: &mut LanesState, t: u8, fired: bool) {
        s.armed.retain(|a| *a != t);
        if fired {
            Self::notify_one(s, false);
        }
    }

    fn apply(&self, s: &mut LanesState, t: u8) {
        let Task::Attempting { waited, fired } = s.tasks[t as usize] else { return };
        s.attempts += 1;
        if s.admits(t, self.limit, self.limit) {
            s.reservations.retain(|(r, _)| *r != t);
            s.cascade_granted |= s.woken_by_cascade[t as usize];
            s.tasks[t as usize] = Task::Holding;
            Self::disarm(s, t, fired);
            let others = s.lanes_used() > 0;
            if self.variant == LanesVariant::Shipped && waited && others {
                Self::notify_one(s, true);
            }
            return;
        }
        if s.place_of(t).is_none() {
            s.reservations.push((t, s.next_place));
            s.next_place += 1;
        }
        s.tasks[t as usize] = if fired { Task::Woken } else { Task::Asleep };
    }
}

impl Model for LanesModel {
    type State = LanesState;
    type Action = LanesAction;

    fn init_states(&self) -> Vec<LanesState> {
        let n = self.tasks as usize;
        vec![LanesState {
            tasks: vec![Task::Queued; n],
            armed: Vec::new(),
            stored: false,
            other_holds: true,
            reservations: Vec::new(),
            next_place: 0,
            attempts: 0,
            woken_by_cascade: vec![false; n],
            cascade_granted: false,
            cancelled: false,
        }]
    }

    fn actions(&self, s: &LanesState, actions: &mut Vec<LanesAction>) {
        let first_queued = s.tasks.iter().position(|t| *t == Task::Queued);
        if let Some(q) = first_queued.filter(|_| s.lanes_used() < self.lanes()) {
            actions.push(LanesAction::Enter(q as u8));
        }
        for t in 0..self.tasks {
            match s.tasks[t as usize] {
                Task::Attempting { .. } => actions.push(LanesAction::Apply(t)),
                Task::Woken => actions.push(LanesAction::Retry(t)),
                Task::Holding => actions.push(LanesAction::Release(t)),
                _ => {}
            }
            if s.tasks[t as usize].in_lane() && !s.cancelled {
                actions.push(LanesAction::Cancel(t));
            }
        }
        if s.other_holds {
            actions.push(LanesAction::OtherRelease);
        }
    }

    fn next_state(&self, s: &LanesState, action: LanesAction) -> Option<LanesState> {
        let mut n = s.clone();
        match action {
            LanesAction::Enter(t) => Self::arm_and_attempt(&mut n, t, false),
            LanesAction::Apply(t) => self.apply(&mut n, t),
            LanesAction::Retry(t) => Self::arm_and_attempt(&mut n, t, true),
            LanesAction::Release(t) => {
                n.tasks[t as usize] = Task::Done;
                Self::notify_one(&mut n, false);
            }
            LanesAction::OtherRelease => {
                n.other_holds = false;
                Self::notify_one(&mut n, false);
            }
            LanesAction::Cancel(t) => {
                let fired = matches!(n.tasks[t as usize], Task::Woken | Task::Attempting { fired: true, .. });
                n.cancelled = true;
                n.tasks[t as usize] = Task::Done;
                n.reservations.retain(|(r, _)| *r != t);
                Self::disarm(&mut n, t, fired);
                // The cleanup's release of the token (a reservation) wakes one.
                Self::notify_one(&mut n, false);
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(WITHIN_LIMIT, |m: &Self, s: &LanesState| s.held(m.limit) <= m.limit),
            Property::always(NO_SLEEP_BESIDE_ROOM, |m: &Self, s: &LanesState| !s.sleeps_beside_room(m.limit, m.limit)),
            Property::eventually(ALL_SERVED, |_, s: &LanesState| s.tasks.iter().all(|t| *t == Task::Done)),
            Property::sometimes(CASCADE_GRANTS, |_, s: &LanesState| s.cascade_granted),
        ]
    }
}
