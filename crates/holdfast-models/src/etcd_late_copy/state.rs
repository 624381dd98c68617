//! The state of the etcd late-copy model: the store (the lock's prefix,
//! client A's session epoch key and tombstones), each of A's attempts, the
//! copies of first writes A gave up waiting for, and B's one try.

use std::fmt;

/// Which first write an attempt sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `try_acquire`: put the own key if the prefix is empty, else read the
    /// first key.
    Try,
    /// A waiting acquire: put the own key, queued behind the older keys.
    Enqueue,
}

/// What the server answered a copy of a first write (what the client
/// makes of the Txn's response).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// A `Try` put its key, or found its own key first (an earlier copy landed).
    Granted,
    /// A `Try` found another key first.
    Busy,
    /// An `Enqueue` put its key (or put it again).
    Queued,
    /// The session's epoch had moved past the one the copy carried, which
    /// wrote nothing: the epoch read.
    EpochMoved(u8),
}

/// Where one of A's attempts is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not started.
    Idle,
    /// The copy the client waits for is on its way to the server,
    /// carrying the epoch the client knew when it sent it.
    Sent(u8),
    /// That copy was applied; its answer is on its way back.
    Replied(Answer),
    /// In the lock's queue (an `Enqueue` answered); holds once its key is
    /// the oldest.
    Queued,
    /// Holds the lock, as the client believes.
    Holding,
    /// Must be released before it ends: a `Try` answered "busy" whose
    /// earlier copies may still land, or a call out of copies or resends.
    Refused,
    /// Released, or answered "busy" with no copy left anywhere: the client
    /// forgot it.
    Ended,
}

/// One of A's attempts (token `index + 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Attempt {
    /// Where it is.
    pub phase: Phase,
    /// Copies the client gave up waiting for (timed out): any makes the
    /// attempt uncertain for good, as that copy may land at any time.
    pub timeouts: u8,
    /// New copies sent after an answer "epoch moved".
    pub resends: u8,
    /// `TimedDeletes`: deletes of the key still to come after the release.
    pub redeletes: u8,
}

impl Attempt {
    /// Whether a copy of its first write was sent and never answered: one
    /// timed out, or the one awaited is still out (the release is sent
    /// while it is).
    pub fn uncertain(&self) -> bool {
        self.timeouts > 0 || matches!(self.phase, Phase::Sent(_) | Phase::Replied(_))
    }
}

/// A copy of a first write nobody waits for any more: the server may apply
/// it at any time, or never.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LateCopy {
    /// The attempt's token.
    pub token: u8,
    /// The epoch it carries.
    pub epoch: u8,
}

/// B's one try, on its own session, once all of A's attempts ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BTry {
    /// Not tried yet.
    Waiting,
    /// Granted: the lock was free.
    Granted,
    /// Refused: a key was left under the prefix.
    Refused,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LateCopyState {
    /// The keys under the lock's prefix, oldest (lowest create revision)
    /// first: A's tokens 1.., B's token after them. A put of a key that
    /// exists keeps its place; one of a deleted key goes last.
    pub keys: Vec<u8>,
    /// A's session epoch key: 0 while absent, else its value (its mod
    /// revision in the code: only ever higher).
    pub epoch: u8,
    /// The epoch A's client knows: it learns one from each bump it writes
    /// and each answer that reads one.
    pub known: u8,
    /// `Tombstone`: a tombstone key on A's session for each attempt, by
    /// index.
    pub tombstones: Vec<bool>,
    /// A's attempts, token 1 first.
    pub attempts: Vec<Attempt>,
    /// Copies nobody waits for, sorted (a multiset).
    pub late: Vec<LateCopy>,
    /// B's try.
    pub b: BTry,
    /// A copy was applied after its attempt ended and wrote nothing.
    pub late_copy_refused: bool,
    /// An attempt answered "epoch moved" went on with a new copy.
    pub resent_after_epoch_moved: bool,
}

impl LateCopyState {
    /// The index of A's token `t`.
    pub fn index(t: u8) -> usize {
        usize::from(t) - 1
    }

    /// B's token: the one after A's.
    pub fn b_token(&self) -> u8 {
        self.attempts.len() as u8 + 1
    }

    /// Whether token `t`'s key is under the prefix.
    pub fn has_key(&self, t: u8) -> bool {
        self.keys.contains(&t)
    }

    /// Puts token `t`'s key (on its session's lease): a new key goes last.
    pub fn put(&mut self, t: u8) {
        if !self.has_key(t) {
            self.keys.push(t);
        }
    }

    /// Deletes token `t`'s key, if it is there.
    pub fn delete(&mut self, t: u8) {
        self.keys.retain(|k| *k != t);
    }

    /// A copy nobody waits for any more joins the network.
    pub fn abandon(&mut self, copy: LateCopy) {
        self.late.push(copy);
        self.late.sort();
    }

    /// Keys of A's session that are no attempt's: the epoch key and the
    /// tombstones.
    pub fn session_keys(&self) -> usize {
        usize::from(self.epoch > 0) + self.tombstones.iter().filter(|t| **t).count()
    }

    /// Nothing more can happen: every attempt ended with no delete still to
    /// come, no copy is in flight, and B has tried.
    pub fn at_rest(&self) -> bool {
        self.late.is_empty()
            && self.attempts.iter().all(|a| a.phase == Phase::Ended && a.redeletes == 0)
            && self.b != BTry::Waiting
    }

    /// Whether at most one attempt counts itself the holder, and each one
    /// that does has the oldest key.
    pub fn one_holder(&self) -> bool {
        let a = (1..=self.attempts.len() as u8).filter(|t| self.attempts[Self::index(*t)].phase == Phase::Holding);
        let holders: Vec<u8> = a.chain((self.b == BTry::Granted).then(|| self.b_token())).collect();
        holders.len() <= 1 && holders.iter().all(|t| self.keys.first() == Some(t))
    }

    /// Whether an ended attempt's key is under the prefix.
    pub fn revived(&self) -> bool {
        (1..=self.attempts.len() as u8).any(|t| self.attempts[Self::index(t)].phase == Phase::Ended && self.has_key(t))
    }
}

impl fmt::Display for LateCopyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.b_token();
        let keys: Vec<String> =
            self.keys.iter().map(|k| if *k == b { "B".to_string() } else { format!("A{k}") }).collect();
        write!(f, "keys [{}], epoch {} (A knows {})", keys.join(", "), self.epoch, self.known)?;
        if self.tombstones.iter().any(|t| *t) {
            write!(f, ", tombstones {:?}", self.tombstones)?;
        }
        for (i, a) in self.attempts.iter().enumerate() {
            write!(f, "; A{}: {:?}", i + 1, a.phase)?;
            if a.timeouts + a.resends + a.redeletes > 0 {
                write!(f, " (timeouts {}, resends {}, re-deletes {})", a.timeouts, a.resends, a.redeletes)?;
            }
        }
        let late: Vec<String> = self.late.iter().map(|c| format!("A{}@{}", c.token, c.epoch)).collect();
        write!(f, "; late copies [{}]; B {:?}", late.join(", "), self.b)
    }
}
