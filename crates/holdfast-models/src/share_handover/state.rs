//! What the shared hand-over model remembers: the key's share hash, each
//! task's view, the one hand-over call that may be in flight, and what the
//! properties check.

use std::fmt;

// The task view and the releaser's stages are the mutex hand-over's (model 6).
use crate::handover::write_tasks;
pub use crate::handover::{Stage, Task, Token};

/// One entry of the share hash `S`: a permit (held) or a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// Whose entry.
    pub token: Token,
    /// A permit; otherwise a waiting request's reservation.
    pub held: bool,
    /// The permit's fence or the reservation's place (one counter).
    pub ord: u8,
    /// The entry's end on the store clock.
    pub x: u8,
}

/// The store's side of the key: the share hash and the key's fields the
/// hand-over reads and writes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Store {
    /// `S`, ordered by token, live entries only (an expired entry counts
    /// for nothing, so it is dropped when time passes its end).
    pub entries: Vec<Entry>,
    /// `f`: the key's counter, for fences and places alike.
    pub f: u8,
    /// `r`: the token of the last release of a permit.
    pub r: Option<Token>,
    /// `zf`, `zw`: a stamp that a script of this version wrote after it
    /// read every entry: while `f` is still `zf`, `S` holds no reservation
    /// and its entries weigh at most `zw`. Every new reservation draws a
    /// place from `f` and every grant a fence, in every version's scripts,
    /// so any entry written since moved `f` past the stamp; removals and
    /// expiries only lower the weight.
    pub stamp: Option<(u8, u8)>,
}

/// The store's admission rule's answer for a request of weight 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The token holds a live permit (a retry): the same grant, this fence.
    Held(u8),
    /// Admitted: a new permit.
    Grant,
    /// Refused; the token's own reservation place, if it has one.
    Refuse(Option<u8>),
}

impl Store {
    /// The token's entry.
    pub fn entry(&self, token: Token) -> Option<Entry> {
        self.entries.iter().copied().find(|e| e.token == token)
    }

    /// Removes and returns the token's entry.
    pub fn remove(&mut self, token: Token) -> Option<Entry> {
        let at = self.entries.iter().position(|e| e.token == token)?;
        Some(self.entries.remove(at))
    }

    /// Writes an entry in its token's place.
    pub fn put(&mut self, entry: Entry) {
        self.remove(entry.token);
        let at = self.entries.iter().position(|e| e.token > entry.token).unwrap_or(self.entries.len());
        self.entries.insert(at, entry);
    }

    /// The stamp's weight bound, if the stamp still holds (`f` unmoved).
    pub fn stamped(&self) -> Option<u8> {
        self.stamp.filter(|&(zf, _)| zf == self.f).map(|(_, zw)| zw)
    }

    /// What a script of this version writes after a grant that read every
    /// entry: the stamp, when no reservation is left.
    pub fn restamp(&mut self) {
        if self.entries.iter().all(|e| e.held) {
            self.stamp = Some((self.f, self.entries.len() as u8));
        }
    }

    /// The live permits.
    pub fn held(&self) -> usize {
        self.entries.iter().filter(|e| e.held).count()
    }

    /// Other tokens' reservations placed before `token`'s own (all of them
    /// if it has none).
    pub fn ahead_of(&self, token: Token) -> impl Iterator<Item = &Entry> {
        let place = self.entry(token).filter(|e| !e.held).map(|e| e.ord);
        self.entries.iter().filter(move |e| e.token != token && !e.held && place.is_none_or(|p| e.ord < p))
    }

    /// The admission rule for `token`, weight 1, under `limit`: admitted
    /// if 1, the others' permits and the reservations ahead of it fit.
    pub fn admission(&self, token: Token, limit: u8) -> Admission {
        match self.entry(token) {
            Some(e) if e.held => Admission::Held(e.ord),
            own => {
                let others = self.entries.iter().filter(|e| e.held && e.token != token).count();
                if 1 + others + self.ahead_of(token).count() <= usize::from(limit) {
                    Admission::Grant
                } else {
                    Admission::Refuse(own.map(|e| e.ord))
                }
            }
        }
    }
}

/// What the store did with the hand-over call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Not applied yet (it may never be).
    Pending,
    /// The releaser's permit released and the waiter's token holds one
    /// with this fence (or a copy found that grant already made).
    Handed(u8),
    /// The releaser's permit released; the admission refused the waiter.
    Released,
    /// Nothing changed: the releaser held no live permit.
    Nothing,
}

/// The hand-over call in flight (one at most).
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
pub struct ShareHandOverState {
    /// Real time, which the store clock follows here.
    pub now: u8,
    /// The semaphore's permits (the model's, kept here for `starved`).
    pub limit: u8,
    /// The key at the store.
    pub store: Store,
    /// Each task's phase (tasks 0 to 2 in process A, task 3 in process B).
    pub tasks: Vec<Task>,
    /// Acquisitions each task started.
    pub used: Vec<u8>,
    /// The hand-over call in flight.
    pub flight: Option<Flight>,
    /// The highest fence the store granted.
    pub top_fence: u8,
    /// A new grant's fence was not above every earlier one.
    pub fence_went_back: bool,
    /// A hand-over granted a permit that a reserved waiter of process B,
    /// placed ahead, was owed.
    pub bypassed: bool,
    /// A task ever held a handed grant (reachability).
    pub handed_reached: bool,
    /// A hand-over ever released the releaser's permit and was refused by
    /// the admission (reachability).
    pub refused_reached: bool,
    /// A hand-over ever granted beside an earlier reservation of process B
    /// with a permit left for it (reachability).
    pub beside_reached: bool,
    /// B0 was told since its last attempt: a message on the lock's channel
    /// (a release, a refused hand-over, a hand-over that left a permit for
    /// the first reservation in line) or its poll (an entry expired). A
    /// reserved B0 attempts only when told.
    pub woken: bool,
    /// A hand-over granted and told the channel (reachability).
    pub wake_reached: bool,
    /// A hand-over granted by the stamp, without reading the entries
    /// (reachability).
    pub stamped_reached: bool,
}

impl ShareHandOverState {
    /// Whether B0 sleeps on its reservation, untold, while its own attempt
    /// would be admitted: a permit it could hold stays unused until some
    /// later release happens to tell it.
    pub fn starved(&self) -> bool {
        let Task::Waiting { token, .. } = self.tasks[3] else { return false };
        !self.woken
            && self.store.entry(token).is_some_and(|e| !e.held)
            && self.store.admission(token, self.limit) == Admission::Grant
    }

    /// How many tasks count themselves holders of a permit now.
    pub fn holders(&self) -> usize {
        self.tasks.iter().filter(|t| matches!(t, Task::Holding { until, .. } if *until > self.now)).count()
    }

    /// Whether the store keeps a live permit for a token no task will ever
    /// use or release (a leaked grant), with no call under way that could
    /// still change it.
    pub fn leaked(&self) -> bool {
        self.flight.is_none()
            && self.store.entries.iter().any(|e| {
                e.held
                    && !matches!(self.tasks[usize::from(e.token.0)],
                        Task::Holding { token, .. } | Task::Waiting { token, .. } if token == e.token)
            })
    }
}

/// A task's name in traces: A0, A1 and A2 (process A), B0 (process B).
pub fn task_name(t: u8) -> &'static str {
    ["A0", "A1", "A2", "B0"][usize::from(t)]
}

fn tok(t: Token) -> String {
    format!("{}#{}", task_name(t.0), t.1)
}

impl fmt::Display for ShareHandOverState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.store;
        write!(f, "t={} S{{", self.now)?;
        for (i, e) in s.entries.iter().enumerate() {
            let (sep, kind) = (if i == 0 { "" } else { ", " }, if e.held { "fence" } else { "place" });
            write!(f, "{sep}{} {kind} {} x={}", tok(e.token), e.ord, e.x)?;
        }
        write!(f, "}} f={} r={}", s.f, s.r.map_or("-".into(), tok))?;
        if let Some((zf, zw)) = s.stamp {
            write!(f, " stamp f={zf} weight<={zw}")?;
        }
        write_tasks(f, &self.tasks, task_name)?;
        if let Some(fl) = &self.flight {
            write!(f, "; hand-over {}->{} sent {} {:?} {:?}", tok(fl.from), tok(fl.to), fl.sent, fl.outcome, fl.stage)?;
        }
        if self.fence_went_back {
            write!(f, " (a fence did not increase)")?;
        }
        if self.bypassed {
            write!(f, " (B0 passed over)")?;
        }
        Ok(())
    }
}
