//! Model 16: the Redis store's local hand-over of a shared lease (a
//! semaphore's permit): a release of a permit that passes it straight to a
//! waiting task of the same process, in one store call, without passing
//! over a reserved waiter of another process.
//!
//! One semaphore of `limit` permits, every request of weight 1. The store
//! keeps the share hash `S`: token -> a permit (fence, lease end) or a
//! reservation (place, end), places and fences drawn from one counter `f`;
//! expired entries count for nothing. Process A runs tasks A0, A1 and A2
//! (two permits held while a third task waits), process B task B0. A task
//! begins an acquisition (a new token) and waits; a waiting attempt is
//! admitted if 1 + the others' permits + the others' reservations placed
//! before its own (all of them if it has none) fit the limit: it holds a
//! permit with the next fence and a lease of `ttl`; a retry of a token that
//! holds a permit gets the same grant; a refused attempt leaves a
//! reservation (keeping its place). A holder releases by token. A holder of
//! A may instead hand its permit to a waiting task of A: it takes the
//! waiter's offer and sends one call, which the store applies when it likes
//! (or never): if the releaser's token holds a live permit, it is released
//! and the waiter's token is admitted by the same rule (a non-reserving
//! attempt): handed, with the next fence (or, if the waiter's own attempt
//! was granted meanwhile, that grant with its lease counted from now), or
//! refused (the permit stays released); if not, and the waiter's token
//! holds a permit and the key's last release was the releaser's, the call
//! is a copy of one applied before: that grant, its lease counted from now;
//! else nothing changes (`share_hand_over.lua`). The reply comes
//! back (a handed lease is counted by the waiter from the releaser's send;
//! "released": the waiter waits on; "nothing": the releaser releases its
//! token, then the waiter waits on), or the call fails without one: the
//! releaser then releases its own token, and only once that is confirmed
//! tells the waiter, which waits on (a hand-over applied meanwhile is found
//! as a retry by the holder), or releases the waiter's token if the waiter
//! is gone. A waiter may be cancelled at any moment; its client then
//! releases its token (C9). While its offer is taken, the waiter does not
//! return a grant of its own attempts before the call's outcome is known.
//!
//! A hand-over that finds the key's stamp unmoved (see [`Store::stamp`]:
//! no reservation, the entries' weight bounded) grants without reading the
//! entries: the releaser's live permit goes, the waiter's token, which must
//! have no entry, gets the next fence, and the stamp moves to that fence.
//! Scripts of this version write the stamp after a grant that read every
//! entry and left no reservation; process B runs an older version, which
//! never writes it (a rolling upgrade), but draws its places and fences
//! from `f` as every version does.
//!
//! The store clock is real time here, as in the `handover` model.

mod action;
mod state;
mod steps;

pub use action::ShareHandOverAction;
pub use state::{Admission, Entry, Flight, Outcome, ShareHandOverState, Stage, Store, Task, Token, task_name};

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShareHandOverVariant {
    /// Shipped: as described in the module docs.
    Shipped,
    /// Rejected: the release and admission run whether or not the
    /// releaser's token holds a live permit.
    NoLeaseCheck,
    /// Rejected: the waiter takes the releaser's live permit without the
    /// admission rule (a straight swap).
    SwapIgnoringReservations,
    /// Rejected: the handed permit keeps the releaser's fence.
    KeepFence,
    /// Rejected: the waiter counts the handed lease from the reply.
    LeaseFromReply,
    /// Rejected: after a call without a reply, the releaser tells the
    /// waiter (or releases the gone waiter's token) before its own release.
    TellBeforeRelease,
    /// Rejected: a hand-over that grants tells no one (only a release, a
    /// refused hand-over or a poll wakes a reserved waiter).
    SilentGrant,
    /// Rejected: the stamp is a flag that this version's scripts clear
    /// when they leave a reservation (a count of reservations kept by them),
    /// not tied to the fence counter: an older client's reservation goes
    /// unseen.
    StampClearedByNewClients,
    /// Built for MySQL/MariaDB (`NAME_share_pass1`) and withdrawn for its
    /// speed, not its safety (permits 14-22% slower across four processes,
    /// docs/performance.md 2026-12-03 (evening)): no stamp and no
    /// copies (a statement is never sent twice; a lost connection is ended
    /// before the next lock statement), and a narrower admission, as its
    /// grant procedure's: the waiter is handed a permit only when no other
    /// token's reservation is live (its own aside) and its token holds none;
    /// else the call is the release and the waiter waits on (its own grant,
    /// if it had one, is what it returns).
    MysqlPass,
}

/// Name of the client-side limit property.
pub const PERMIT_LIMIT: &str = "at most `limit` tasks count themselves holders of a permit";
/// Name of the store-side limit property.
pub const STORE_LIMIT: &str = "at most `limit` live permits in the share hash";
/// Name of the fence-order property.
pub const FENCES_INCREASE: &str = "each grant's fence is above every earlier grant's";
/// Name of the no-leak property.
pub const NO_LEAKED_GRANT: &str = "no live permit is left to a token no task will use or release";
/// Name of the no-bypass property.
pub const NO_BYPASS: &str = "a hand-over never takes a permit owed to a reserved waiter of another process";
/// Name of the wake-up property.
pub const NO_UNTOLD_PERMIT: &str = "a reserved waiter whose attempt would be admitted has been told";
/// Reachability: a task holds a handed grant.
pub const HAND_OVER_HAPPENS: &str = "a task holds a permit handed over by its process";
/// Reachability: a hand-over releases a live permit and the admission
/// refuses the waiter.
pub const HAND_OVER_REFUSED_FOR_RESERVATION: &str = "a hand-over releases a permit, a reservation refuses the waiter";
/// Reachability: a hand-over grants beside an earlier reservation of
/// process B, with a permit left for it.
pub const HAND_OVER_BESIDE_RESERVATION: &str = "a hand-over grants beside an earlier reservation of another process";
/// Reachability: a hand-over grants and tells the lock's channel.
pub const HAND_OVER_TELLS: &str = "a hand-over grants and tells the channel";
/// Reachability: a hand-over grants by the stamp, reading no entry.
pub const HAND_OVER_BY_STAMP: &str = "a hand-over grants by the stamp";

/// The task of process B.
const B0: u8 = 3;

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct ShareHandOverModel {
    /// Which design.
    pub variant: ShareHandOverVariant,
    /// Acquisitions per task: A0, A1, A2, B0.
    pub acquisitions: [u8; 4],
    /// Permits of the semaphore.
    pub limit: u8,
    /// Lease (and reservation) TTL, in ticks.
    pub ttl: u8,
    /// Real time stops here.
    pub horizon: u8,
}

impl ShareHandOverModel {
    /// One acquisition per task; limit 2, TTL 2, time 1..5.
    pub fn new(variant: ShareHandOverVariant) -> Self {
        ShareHandOverModel { variant, acquisitions: [1; 4], limit: 2, ttl: 2, horizon: 5 }
    }
}

impl Model for ShareHandOverModel {
    type State = ShareHandOverState;
    type Action = ShareHandOverAction;

    fn init_states(&self) -> Vec<ShareHandOverState> {
        vec![ShareHandOverState {
            now: 1,
            limit: self.limit,
            store: Store { entries: Vec::new(), f: 0, r: None, stamp: None },
            tasks: vec![Task::Idle; 4],
            used: vec![0; 4],
            flight: None,
            top_fence: 0,
            fence_went_back: false,
            bypassed: false,
            handed_reached: false,
            refused_reached: false,
            beside_reached: false,
            woken: false,
            wake_reached: false,
            stamped_reached: false,
        }]
    }

    fn actions(&self, s: &ShareHandOverState, actions: &mut Vec<ShareHandOverAction>) {
        for t in 0..4u8 {
            match s.tasks[usize::from(t)] {
                Task::Idle if s.used[usize::from(t)] < self.acquisitions[usize::from(t)] => {
                    actions.push(ShareHandOverAction::Begin(t))
                }
                Task::Waiting { token, .. } => {
                    // A reserved B0 sleeps until told.
                    if t != B0 || s.woken || s.store.entry(token).is_none_or(|e| e.held) {
                        actions.push(ShareHandOverAction::Attempt(t));
                    }
                    actions.push(ShareHandOverAction::Cancel(t));
                }
                Task::Holding { .. } => {
                    actions.push(ShareHandOverAction::Release(t));
                    if t == B0 || s.flight.is_some() {
                        continue;
                    }
                    let free = |w: &u8| matches!(s.tasks[usize::from(*w)], Task::Waiting { taken: false, .. });
                    actions.extend((0..B0).filter(free).map(|w| ShareHandOverAction::HandOver(t, w)));
                }
                _ => {}
            }
        }
        if let Some(fl) = s.flight {
            if fl.outcome == Outcome::Pending {
                actions.push(ShareHandOverAction::Apply);
            }
            match fl.stage {
                Stage::Sent if fl.outcome != Outcome::Pending => {
                    actions.extend([ShareHandOverAction::Reply, ShareHandOverAction::TimeOut])
                }
                Stage::Sent => actions.push(ShareHandOverAction::TimeOut),
                Stage::TimedOut | Stage::Settling => actions.push(ShareHandOverAction::Settle),
                Stage::Settled => {}
            }
        }
        if s.now < self.horizon {
            actions.push(ShareHandOverAction::Tick);
        }
    }

    fn next_state(&self, s: &ShareHandOverState, action: ShareHandOverAction) -> Option<ShareHandOverState> {
        let mut n = s.clone();
        match action {
            ShareHandOverAction::Begin(t) => {
                let i = usize::from(t);
                n.used[i] += 1;
                n.tasks[i] = Task::Waiting { token: (t, n.used[i]), taken: false, own: None };
            }
            ShareHandOverAction::Attempt(t) => self.attempt(&mut n, t),
            ShareHandOverAction::Release(t) => {
                if let Task::Holding { token, .. } = n.tasks[usize::from(t)] {
                    Self::store_release(&mut n, token);
                    n.tasks[usize::from(t)] = Task::Idle;
                }
            }
            ShareHandOverAction::HandOver(t, w) => {
                let Task::Holding { token: from, .. } = n.tasks[usize::from(t)] else { return None };
                let Task::Waiting { token: to, own, .. } = n.tasks[usize::from(w)] else { return None };
                n.tasks[usize::from(w)] = Task::Waiting { token: to, taken: true, own };
                n.tasks[usize::from(t)] = Task::Idle;
                n.flight =
                    Some(Flight { from, to, waiter: w, sent: n.now, outcome: Outcome::Pending, stage: Stage::Sent });
            }
            ShareHandOverAction::Apply => self.apply(&mut n),
            ShareHandOverAction::Reply => self.reply(&mut n),
            ShareHandOverAction::TimeOut => {
                if let Some(fl) = n.flight.as_mut() {
                    fl.stage = Stage::TimedOut;
                }
            }
            ShareHandOverAction::Settle => self.settle(&mut n),
            ShareHandOverAction::Cancel(t) => {
                if let Task::Waiting { token, .. } = n.tasks[usize::from(t)] {
                    // The client's cleanup releases the attempt's token (C9).
                    Self::store_release(&mut n, token);
                    n.tasks[usize::from(t)] = Task::Gone;
                }
            }
            ShareHandOverAction::Tick => {
                n.now += 1;
                let now = n.now;
                let before = n.store.entries.len();
                n.store.entries.retain(|e| e.x > now);
                // An expiry is what the waiter's poll backs messages up for.
                n.woken |= n.store.entries.len() < before;
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(PERMIT_LIMIT, |m, s: &ShareHandOverState| s.holders() <= usize::from(m.limit)),
            Property::always(STORE_LIMIT, |m, s: &ShareHandOverState| s.store.held() <= usize::from(m.limit)),
            Property::always(FENCES_INCREASE, |_, s: &ShareHandOverState| !s.fence_went_back),
            Property::always(NO_LEAKED_GRANT, |_, s: &ShareHandOverState| !s.leaked()),
            Property::always(NO_BYPASS, |_, s: &ShareHandOverState| !s.bypassed),
            Property::always(NO_UNTOLD_PERMIT, |_, s: &ShareHandOverState| !s.starved()),
            Property::sometimes(HAND_OVER_HAPPENS, |_, s: &ShareHandOverState| s.handed_reached),
            Property::sometimes(HAND_OVER_REFUSED_FOR_RESERVATION, |_, s: &ShareHandOverState| s.refused_reached),
            Property::sometimes(HAND_OVER_BESIDE_RESERVATION, |_, s: &ShareHandOverState| s.beside_reached),
            Property::sometimes(HAND_OVER_TELLS, |_, s: &ShareHandOverState| s.wake_reached),
            Property::sometimes(HAND_OVER_BY_STAMP, |_, s: &ShareHandOverState| s.stamped_reached),
        ]
    }
}
