//! The state of the share lanes model: one process's waiting tasks, their
//! turn and wake-ups, and the store's semaphore with its reservations.

use std::fmt;

/// Where one task of the process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Task {
    /// Waiting for a lane of the turn (first come, first served).
    Queued,
    /// In a lane, its wake-up armed, its attempt on its way to the store;
    /// `waited`: an earlier attempt of this acquisition was refused.
    Attempting {
        /// An earlier attempt was refused.
        waited: bool,
        /// Its wake-up fired while the attempt was on its way.
        fired: bool,
    },
    /// In a lane, refused, its wake-up armed and not yet fired.
    Asleep,
    /// In a lane, its wake-up fired: it attempts again.
    Woken,
    /// Granted: out of the turn, holding a permit.
    Holding,
    /// Released, or cancelled.
    Done,
}

impl Task {
    /// Whether the task holds a lane of the turn.
    pub fn in_lane(self) -> bool {
        matches!(self, Task::Attempting { .. } | Task::Asleep | Task::Woken)
    }
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LanesState {
    /// The process's tasks, in the order they asked.
    pub tasks: Vec<Task>,
    /// Armed wake-ups, oldest first (tokio's `Notify` wakes the oldest).
    pub armed: Vec<u8>,
    /// A wake-up sent while none was armed, kept for the next one.
    pub stored: bool,
    /// Whether the other process still holds its permits.
    pub other_holds: bool,
    /// The store's reservations: task and place, in place order.
    pub reservations: Vec<(u8, u8)>,
    /// The store's next reservation place.
    pub next_place: u8,
    /// Store attempts made, over all tasks.
    pub attempts: u8,
    /// Tasks whose last wake-up was a granted waiter's, passed on.
    pub woken_by_cascade: Vec<bool>,
    /// A task woken by a passed-on wake-up was granted.
    pub cascade_granted: bool,
    /// A task was cancelled (once per run).
    pub cancelled: bool,
}

impl LanesState {
    /// Permits held: the other process's and the tasks'.
    pub fn held(&self, other_weight: u8) -> u8 {
        let own = self.tasks.iter().filter(|t| **t == Task::Holding).count() as u8;
        own + if self.other_holds { other_weight } else { 0 }
    }

    /// Lanes in use.
    pub fn lanes_used(&self) -> u8 {
        self.tasks.iter().filter(|t| t.in_lane()).count() as u8
    }

    /// Task `t`'s reservation place, if it has one.
    pub fn place_of(&self, t: u8) -> Option<u8> {
        self.reservations.iter().find(|(r, _)| *r == t).map(|(_, p)| *p)
    }

    /// The admission rule for task `t` (weight 1): the permits held, plus
    /// the reservations ahead of its own (all of them if it has none), plus
    /// its own, within the limit.
    pub fn admits(&self, t: u8, limit: u8, other_weight: u8) -> bool {
        let own = self.place_of(t);
        let ahead = self.reservations.iter().filter(|(r, p)| *r != t && own.is_none_or(|own| *p < own)).count() as u8;
        self.held(other_weight) + ahead < limit
    }

    /// A lane sleeps while the store would grant it, nothing is on its way
    /// to the store and no wake-up is pending: only a poll, or a release
    /// that has nothing to do with the free room, would wake it.
    pub fn sleeps_beside_room(&self, limit: u8, other_weight: u8) -> bool {
        let quiet = !self.stored && !self.tasks.iter().any(|t| matches!(t, Task::Attempting { .. } | Task::Woken));
        quiet
            && (0..self.tasks.len() as u8)
                .any(|t| self.tasks[t as usize] == Task::Asleep && self.admits(t, limit, other_weight))
    }
}

/// A task's name in a trace.
pub fn task_name(t: u8) -> String {
    format!("T{t}")
}

impl fmt::Display for LanesState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tasks {:?}, armed {:?}", self.tasks, self.armed)?;
        if self.stored {
            write!(f, " (+1 stored)")?;
        }
        write!(f, ", other holds {}, reservations {:?}", self.other_holds, self.reservations)
    }
}
