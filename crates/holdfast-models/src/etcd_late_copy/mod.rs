//! Model 17: etcd: a late copy of an attempt's first write (found on a
//! real server by conformance F6: a key written again after its attempt's
//! release, on the client's live session).
//!
//! The etcd store gives each lock a key prefix; each attempt (a token)
//! writes one key under it, on its client's session lease (one lease for
//! all the client's keys), and the oldest key (lowest create revision)
//! holds the lock. An attempt's first write is a Txn, sent with a per-try
//! timeout and sent again after one, so several copies of it can be out at
//! once; etcd serves a connection's streams side by side, so a copy the
//! client gave up on can be applied later, after the attempt's release
//! deleted its key. The key is then written again on the live session: an
//! orphan nobody tracks, holding the lock (or sitting in the queue) until
//! the session ends. The first writes:
//!
//! - `Try`: `when [no key under the prefix] then [put own] else [read the
//!   first key]`: granted if it put, or if the first key is its own (an
//!   earlier copy landed); "busy" otherwise, and the client forgets it.
//! - `Enqueue`: `when [own key absent] then [put own, read] else [put own
//!   again, read own]`: queued (the re-put is harmless while the attempt
//!   lives); it holds once its key is the oldest.
//!
//! The model: one lock; client A, on one session that never ends (the bad
//! case: a long-lived client), runs two attempts (tokens 1 and 2, their
//! kinds configured) side by side; each call sends at most `copies` copies
//! on timeouts, and the client may give an attempt up at any step and
//! release it in one atomic request. An attempt is uncertain if a copy of
//! its first write was sent and never answered (it timed out, or is out
//! when the release is sent). Copies nobody waits for are applied by the
//! server at any later step, or never. Client B, on its own session, tries
//! once (`Try`, sent once and answered) after all of A's attempts ended:
//! an orphan refuses it.
//!
//! - `Epoch` (to ship): each session has an epoch key on its lease (absent
//!   at first: epoch 0; its value is its mod revision, only ever higher).
//!   Every copy carries the epoch the client knew when it sent it, and its
//!   Txn compares it: `Try`: `when [prefix empty AND epoch == carried] then
//!   [put own] else [read the first key, read the epoch]`; `Enqueue`:
//!   `when [own absent AND epoch == carried] then [put own, read] else
//!   [txn: when [epoch == carried] then [put own again, read own] else
//!   [read the epoch]]`. The release of an uncertain attempt (and the end
//!   of an uncertain `Try` answered "busy") is `Txn [put the epoch key,
//!   delete own]`, so every copy still out carries an epoch that is no
//!   longer the key's; a certain attempt only deletes its key. A copy
//!   answered "epoch moved" (another attempt's release bumped it) wrote
//!   nothing: the client takes the epoch read and sends a new copy, at
//!   most `resends` times.
//!   The code (`ops::in_epoch`) writes the epoch compare as a guard
//!   around the whole first write (`when [epoch == carried] then [txn:
//!   the write as before] else [read the epoch]`): the same outcomes, with
//!   a `Try` whose epoch moved sent again whatever the first key is, as
//!   here.
//! - `PlainDelete` (the design before, rejected): no epoch; the release
//!   deletes the key, "busy" forgets the attempt. A copy applied after the
//!   release writes the key again.
//! - `TimedDeletes` (shipped in 941f6e3, rejected): the same, and an
//!   uncertain attempt's key is deleted again `redeletes` more times after
//!   its end (7 times over about two minutes in the code), each at a step
//!   the checker picks: a copy applied after the last one stays.
//! - `EpochFlatElse` (rejected): `Epoch` with `Enqueue`'s else branch flat
//!   (`else [put own again, read own]`, the obvious edit of the current
//!   Txn): a late copy fails the outer compare on the epoch alone and the
//!   else branch puts the key.
//! - `Tombstone` (rejected): no epoch; the release of an uncertain attempt
//!   writes a tombstone key of the attempt on the session lease, and every
//!   first write compares "my tombstone absent". Safe, but a tombstone can
//!   never be deleted while a copy may be out, so one per uncertain attempt
//!   piles up for the session's life.
//!
//! Not modelled: a lease per attempt, revoked at its release (rejected
//! without a model: a lease grant costs every acquire one more round
//! trip), the session's end (it deletes every key, orphans included), the
//! release's own retries, the waiting itself (a queued attempt holds as
//! soon as its key is the oldest), renewals.

mod state;

pub use state::{Answer, Attempt, BTry, Kind, LateCopy, LateCopyState, Phase};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LateCopyVariant {
    /// To ship: a session epoch compared by every copy, bumped by the
    /// release of an uncertain attempt; `Enqueue`'s else branch nested.
    Epoch,
    /// The design before: the release deletes the key.
    PlainDelete,
    /// Shipped now, rejected: the key deleted again a few times after the release.
    TimedDeletes,
    /// Rejected: `Epoch` with `Enqueue`'s else branch flat.
    EpochFlatElse,
    /// Rejected: a tombstone per uncertain attempt instead of the epoch.
    Tombstone,
}

impl LateCopyVariant {
    /// Whether copies carry and compare the session epoch.
    pub fn has_epoch(self) -> bool {
        matches!(self, Self::Epoch | Self::EpochFlatElse)
    }
}

/// Name of the property that no released key comes back.
pub const NO_REVIVAL: &str = "no key of an ended attempt exists on the store";
/// Name of the property checked once nothing more can happen.
pub const ENDS_FREE: &str = "at rest, no key of A's attempts is left and B was granted";
/// Name of the exclusion property.
pub const ONE_HOLDER: &str = "at most one attempt counts itself the holder, and its key is the oldest";
/// Name of the cost property.
pub const NO_KEY_PILE: &str = "at rest, at most one key of A's session is no attempt's (the epoch key)";
/// Reachability: a late copy lands and is refused.
pub const LATE_COPY_REFUSED: &str = "a copy is applied after its attempt ended and writes nothing";
/// Reachability: an attempt survives another's bump.
pub const RESENT_AFTER_EPOCH_MOVED: &str = "an attempt answered \"epoch moved\" goes on with a new copy";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct LateCopyModel {
    /// Which design.
    pub variant: LateCopyVariant,
    /// The first write of each of A's attempts (token 1 first).
    pub kinds: Vec<Kind>,
    /// Copies a call sends on timeouts before it fails (2: one resend).
    pub copies: u8,
    /// New copies an attempt sends after answers "epoch moved".
    pub resends: u8,
    /// `TimedDeletes`: deletes after the release.
    pub redeletes: u8,
    /// B tries only once every re-delete has run (a client that comes
    /// after the two minutes), not at any step after A's attempts ended.
    pub b_late: bool,
}

impl LateCopyModel {
    /// A `Try` and an `Enqueue`, two copies each, one resend, two re-deletes.
    pub fn new(variant: LateCopyVariant) -> Self {
        LateCopyModel {
            variant,
            kinds: vec![Kind::Try, Kind::Enqueue],
            copies: 2,
            resends: 1,
            redeletes: 2,
            b_late: false,
        }
    }

    /// The server applies a copy of token `t`'s first write carrying
    /// `carried`: its answer, and whether it wrote the key.
    fn first_write(&self, s: &mut LateCopyState, t: u8, carried: u8) -> (Answer, bool) {
        let i = LateCopyState::index(t);
        // The compare that keeps a late copy out, if the design has one.
        let current = match self.variant {
            LateCopyVariant::Epoch | LateCopyVariant::EpochFlatElse => s.epoch == carried,
            LateCopyVariant::Tombstone => !s.tombstones[i],
            LateCopyVariant::PlainDelete | LateCopyVariant::TimedDeletes => true,
        };
        // A tombstone is only written at the end: nobody reads the answer.
        let moved = if self.variant.has_epoch() { Answer::EpochMoved(s.epoch) } else { Answer::Busy };
        match self.kinds[i] {
            Kind::Try if s.keys.is_empty() && current => {
                s.put(t);
                (Answer::Granted, true)
            }
            Kind::Try if !current => (moved, false),
            Kind::Try if s.keys.first() == Some(&t) => (Answer::Granted, false),
            Kind::Try => (Answer::Busy, false),
            Kind::Enqueue => {
                // The nested compare: only `EpochFlatElse`'s else branch
                // (and the designs without a compare) put unconditionally.
                let nested = matches!(self.variant, LateCopyVariant::Epoch | LateCopyVariant::Tombstone);
                if current || !nested {
                    s.put(t);
                    (Answer::Queued, true)
                } else {
                    (moved, false)
                }
            }
        }
    }

    /// The client's release of token `t`'s attempt (or its end after "busy"),
    /// one atomic request at the server.
    fn release(&self, s: &mut LateCopyState, t: u8) {
        let i = LateCopyState::index(t);
        if let Phase::Sent(epoch) = s.attempts[i].phase {
            s.abandon(LateCopy { token: t, epoch });
        }
        let uncertain = s.attempts[i].uncertain();
        s.delete(t);
        if uncertain {
            match self.variant {
                LateCopyVariant::Epoch | LateCopyVariant::EpochFlatElse => {
                    // The same Txn as the delete: no copy can land between.
                    s.epoch += 1;
                    s.known = s.known.max(s.epoch);
                }
                LateCopyVariant::Tombstone => s.tombstones[i] = true,
                LateCopyVariant::TimedDeletes => s.attempts[i].redeletes = self.redeletes,
                LateCopyVariant::PlainDelete => {}
            }
        }
        s.attempts[i].phase = Phase::Ended;
    }

    /// Token `t`'s client reads the answer to the copy it waits for.
    fn answered(&self, s: &mut LateCopyState, t: u8, answer: Answer) {
        let a = &mut s.attempts[LateCopyState::index(t)];
        a.phase = match answer {
            Answer::Granted => Phase::Holding,
            Answer::Queued => Phase::Queued,
            // An uncertain attempt's copies may still land: its end is a
            // release, except in the design before, which forgot it.
            Answer::Busy if a.timeouts > 0 && self.variant != LateCopyVariant::PlainDelete => Phase::Refused,
            Answer::Busy => Phase::Ended,
            Answer::EpochMoved(epoch) => {
                s.known = s.known.max(epoch);
                if a.resends < self.resends {
                    a.resends += 1;
                    s.resent_after_epoch_moved = true;
                    Phase::Sent(s.known)
                } else {
                    Phase::Refused
                }
            }
        };
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LateCopyAction {
    /// A's attempt `t` sends the first copy of its first write.
    Start(u8),
    /// The server applies the copy attempt `t` waits for.
    Apply(u8),
    /// That copy's answer reaches the client.
    Answer(u8),
    /// Attempt `t` gives up waiting for its copy (or its answer) and sends another.
    Timeout(u8),
    /// A's client gives attempt `t` up, or ends it after "busy", and releases it.
    Release(u8),
    /// Queued attempt `t`'s key is the oldest: it holds.
    Holds(u8),
    /// The server applies a copy nobody waits for.
    ApplyLate(LateCopy),
    /// A copy nobody waits for is lost.
    Drop(LateCopy),
    /// `TimedDeletes`: attempt `t`'s key is deleted again.
    Redelete(u8),
    /// B tries the lock once.
    BTries,
}

impl fmt::Display for LateCopyAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Start(t) => write!(f, "A{t} sends its first write"),
            Self::Apply(t) => write!(f, "the server applies the copy A{t} waits for"),
            Self::Answer(t) => write!(f, "A{t} reads the answer"),
            Self::Timeout(t) => write!(f, "A{t} times out and sends its first write again"),
            Self::Release(t) => write!(f, "A{t} is released"),
            Self::Holds(t) => write!(f, "A{t}'s key is the oldest: it holds"),
            Self::ApplyLate(c) => {
                write!(f, "the server applies a late copy of A{} carrying epoch {}", c.token, c.epoch)
            }
            Self::Drop(c) => write!(f, "a late copy of A{} carrying epoch {} is lost", c.token, c.epoch),
            Self::Redelete(t) => write!(f, "A{t}'s key is deleted again"),
            Self::BTries => write!(f, "B tries the lock"),
        }
    }
}

impl Model for LateCopyModel {
    type State = LateCopyState;
    type Action = LateCopyAction;

    fn init_states(&self) -> Vec<LateCopyState> {
        let attempt = Attempt { phase: Phase::Idle, timeouts: 0, resends: 0, redeletes: 0 };
        vec![LateCopyState {
            keys: Vec::new(),
            epoch: 0,
            known: 0,
            tombstones: vec![false; self.kinds.len()],
            attempts: vec![attempt; self.kinds.len()],
            late: Vec::new(),
            b: BTry::Waiting,
            late_copy_refused: false,
            resent_after_epoch_moved: false,
        }]
    }

    fn actions(&self, s: &LateCopyState, actions: &mut Vec<LateCopyAction>) {
        for (i, a) in s.attempts.iter().enumerate() {
            let t = i as u8 + 1;
            match a.phase {
                Phase::Idle => actions.push(LateCopyAction::Start(t)),
                Phase::Sent(_) => actions.extend([LateCopyAction::Apply(t), LateCopyAction::Timeout(t)]),
                Phase::Replied(_) => actions.extend([LateCopyAction::Answer(t), LateCopyAction::Timeout(t)]),
                Phase::Queued if s.keys.first() == Some(&t) => actions.push(LateCopyAction::Holds(t)),
                _ => {}
            }
            if !matches!(a.phase, Phase::Idle | Phase::Ended) {
                actions.push(LateCopyAction::Release(t));
            }
            if a.redeletes > 0 {
                actions.push(LateCopyAction::Redelete(t));
            }
        }
        // Equal copies are one choice (the list is sorted).
        for (k, copy) in s.late.iter().enumerate() {
            if k == 0 || s.late[k - 1] != *copy {
                actions.extend([LateCopyAction::ApplyLate(*copy), LateCopyAction::Drop(*copy)]);
            }
        }
        let ended = |a: &Attempt| a.phase == Phase::Ended && (!self.b_late || a.redeletes == 0);
        if s.b == BTry::Waiting && s.attempts.iter().all(ended) {
            actions.push(LateCopyAction::BTries);
        }
    }

    fn next_state(&self, s: &LateCopyState, action: LateCopyAction) -> Option<LateCopyState> {
        let mut n = s.clone();
        match action {
            LateCopyAction::Start(t) => n.attempts[LateCopyState::index(t)].phase = Phase::Sent(n.known),
            LateCopyAction::Apply(t) => {
                let Phase::Sent(carried) = s.attempts[LateCopyState::index(t)].phase else { return None };
                let (answer, _) = self.first_write(&mut n, t, carried);
                n.attempts[LateCopyState::index(t)].phase = Phase::Replied(answer);
            }
            LateCopyAction::Answer(t) => {
                let Phase::Replied(answer) = s.attempts[LateCopyState::index(t)].phase else { return None };
                self.answered(&mut n, t, answer);
            }
            LateCopyAction::Timeout(t) => {
                let i = LateCopyState::index(t);
                if let Phase::Sent(epoch) = s.attempts[i].phase {
                    n.abandon(LateCopy { token: t, epoch });
                }
                let a = &mut n.attempts[i];
                a.timeouts += 1;
                a.phase = if a.timeouts < self.copies { Phase::Sent(n.known) } else { Phase::Refused };
            }
            LateCopyAction::Release(t) => self.release(&mut n, t),
            LateCopyAction::Holds(t) => n.attempts[LateCopyState::index(t)].phase = Phase::Holding,
            LateCopyAction::ApplyLate(copy) | LateCopyAction::Drop(copy) => {
                let k = n.late.iter().position(|c| *c == copy)?;
                n.late.remove(k);
                if let LateCopyAction::ApplyLate(_) = action {
                    let (_, wrote) = self.first_write(&mut n, copy.token, copy.epoch);
                    let ended = n.attempts[LateCopyState::index(copy.token)].phase == Phase::Ended;
                    n.late_copy_refused |= ended && !wrote;
                }
            }
            LateCopyAction::Redelete(t) => {
                n.delete(t);
                n.attempts[LateCopyState::index(t)].redeletes -= 1;
            }
            LateCopyAction::BTries => {
                let b = n.b_token();
                n.b = if n.keys.is_empty() { BTry::Granted } else { BTry::Refused };
                if n.b == BTry::Granted {
                    n.put(b);
                }
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_REVIVAL, |_, s: &LateCopyState| !s.revived()),
            Property::always(ENDS_FREE, |_, s: &LateCopyState| {
                !s.at_rest() || (s.b == BTry::Granted && s.keys.iter().all(|k| *k == s.b_token()))
            }),
            Property::always(ONE_HOLDER, |_, s: &LateCopyState| s.one_holder()),
            Property::always(NO_KEY_PILE, |_, s: &LateCopyState| !s.at_rest() || s.session_keys() <= 1),
            Property::sometimes(LATE_COPY_REFUSED, |_, s: &LateCopyState| s.late_copy_refused),
            Property::sometimes(RESENT_AFTER_EPOCH_MOVED, |_, s: &LateCopyState| s.resent_after_epoch_moved),
        ]
    }
}
