//! What may happen next in the shared hand-over model, and how a trace
//! names it.

use std::fmt;

use super::state::task_name;

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShareHandOverAction {
    /// A task starts an acquisition (a new token).
    Begin(u8),
    /// A waiting task makes a waiting attempt.
    Attempt(u8),
    /// A holder releases by its token.
    Release(u8),
    /// A holder of process A (first) takes the offer of a waiting task of
    /// A (second) and sends a hand-over.
    HandOver(u8, u8),
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

impl fmt::Display for ShareHandOverAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Begin(t) => write!(f, "{} starts an acquisition", task_name(*t)),
            Self::Attempt(t) => write!(f, "{} attempts", task_name(*t)),
            Self::Release(t) => write!(f, "{} releases", task_name(*t)),
            Self::HandOver(t, w) => write!(f, "{} hands over to {}", task_name(*t), task_name(*w)),
            Self::Apply => write!(f, "the store applies the hand-over"),
            Self::Reply => write!(f, "the hand-over's reply arrives"),
            Self::TimeOut => write!(f, "the hand-over call fails without a reply"),
            Self::Settle => write!(f, "the releaser settles the failed call"),
            Self::Cancel(t) => write!(f, "{} is cancelled", task_name(*t)),
            Self::Tick => write!(f, "time passes"),
        }
    }
}
