//! Model 20: a PostgreSQL share's release and the gate's shrink in one
//! statement, against the two transactions shipped
//! (`stores/postgres/mod.rs` `release()`, then `share_fns.rs`'s
//! `<table>_gate`).
//!
//! The key's lease row is the **gate** of its shares: an exclusive acquire
//! reads only it, so its expiry must cover every held share whenever an
//! exclusive acquire can read it. One key, two to four sharing clients and
//! an exclusive acquirer X. Row locks are held to their transaction's
//! commit, and a statement that needs one another transaction holds waits
//! (its step is not enabled); a deleted share row is held for every other
//! transaction until the delete commits. Each client alternates:
//!
//! - a shared acquire (the shipped `<table>_share`): the gate's lock; the
//!   gate and the shares read under it, and, unless the exclusive acquirer
//!   holds the key (refused: it tries again later), its share row inserted
//!   and the gate raised; the commit;
//! - holding, while its renewal (on the renewal connection) may run: the
//!   share row's lock (`renew`'s `s`), then the gate's (`g`, which reads
//!   all of `s`: every share row lock of a renewal is taken before any
//!   gate lock) and the gate raised, then the commit. A renewal can be in
//!   flight when the release starts, or start while its delete is
//!   uncommitted (it waits for the row, then finds it gone); an acquire
//!   never runs beside its client's renewal or release (they share the
//!   key's connection);
//! - a release, by the variant.
//!
//! The exclusive acquirer X locks the gate row (it waits while another
//! transaction holds it) and takes the key only if the row's latest
//! version is down or released, then commits; it holds, and releases (the
//! gate's lock, the row written released, which a shared acquire takes
//! over; the commit).
//!
//! - `TwoStep` (shipped): the release statement deletes and commits; a
//!   second call locks the gate, reads the shares in a fresh snapshot,
//!   writes the gate, commits.
//! - `Fused` (proposed): one statement that calls the gate function: the
//!   delete (its row's lock held), the gate's lock (waited for while the
//!   row's is held), the fresh read (its own delete seen), the write, one
//!   commit.
//! - `FusedSkipLocked` (proposed): as `Fused`, but the gate's lock taken
//!   with `SKIP LOCKED`; if taken, the delete commits alone and the
//!   shrink is `TwoStep`'s second call.
//! - `InlineSnapshot` (rejected): one SQL statement whose shrink reads the
//!   shares in the statement's snapshot, taken at its start.
//! - `GateFirst` (rejected): one function that locks the gate, then
//!   deletes: the reverse of a renewal's order.

mod state;

pub use state::{AcquireStep, Client, Exclusive, Gate, Phase, ReleaseStep, Renewal, Row, ShareReleaseState, Txn};

use std::fmt;

use stateright::{Model, Property};

use crate::sql_session::client_name;

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShareReleaseVariant {
    /// Shipped: delete and commit, then the shrink in a call of its own.
    TwoStep,
    /// Proposed: delete, the gate's lock, a fresh read, write, one commit.
    Fused,
    /// Proposed: `Fused` when the gate's lock is free, else `TwoStep`.
    FusedSkipLocked,
    /// Rejected: the shares read in the statement's snapshot from its start.
    InlineSnapshot,
    /// Rejected: the gate's lock before the delete.
    GateFirst,
}

/// The steps of the shrink as a call of its own.
pub const SECOND_CALL: [ReleaseStep; 4] =
    [ReleaseStep::LockGate, ReleaseStep::ReadFresh, ReleaseStep::WriteGate, ReleaseStep::Commit];

impl ShareReleaseVariant {
    /// The steps of the release's first call, in order (`TwoStep`'s, and
    /// `FusedSkipLocked`'s when the gate is taken, go on to
    /// [`SECOND_CALL`]).
    pub fn first_call(self) -> &'static [ReleaseStep] {
        use ReleaseStep::*;
        match self {
            Self::TwoStep => &[DeleteCommit],
            Self::Fused => &[Delete, LockGate, ReadFresh, WriteGate, Commit],
            Self::FusedSkipLocked => &[Delete, TryGate, ReadFresh, WriteGate, Commit],
            Self::InlineSnapshot => &[Snapshot, Delete, LockGate, ReadInSnapshot, WriteGate, Commit],
            Self::GateFirst => &[LockGate, Delete, ReadFresh, WriteGate, Commit],
        }
    }
}

/// Safety: never an exclusive holder and a held share at once.
pub const EXCLUSION: &str = "never an exclusive holder and a held share at once";
/// Safety: no cycle in the wait-for graph.
pub const NO_DEADLOCK: &str = "no set of transactions each waiting for a lock another of them holds";
/// Safety: the gate covers the shares whenever its lock is free.
pub const GATE_COVERS: &str = "the gate is up whenever a share is held and no transaction holds the gate's lock";
/// Reachability: X is granted.
pub const EXCLUSIVE_GRANTED: &str = "the exclusive acquirer is granted";
/// Reachability: two shares held at once.
pub const TWO_SHARES: &str = "two shares are held at once";
/// Reachability: a release holding its row's lock waits for the gate's.
pub const RELEASE_WAITS_ON_GATE: &str = "a release waits for the gate's lock while holding its share row's lock";
/// Reachability: a renewal holding its row's lock waits for the gate's.
pub const RENEWAL_WAITS_ON_GATE: &str = "a renewal waits for the gate's lock while holding its share row's lock";
/// Reachability: a renewal waits for a release's share row.
pub const RENEWAL_WAITS_ON_RELEASE: &str = "a renewal waits for its release's share row";
/// Reachability: a release's delete waits for its renewal's share row.
pub const RELEASE_WAITS_ON_RENEWAL: &str = "a release's delete waits for its renewal's share row";
/// Reachability: the shrink runs as a second call.
pub const SHRINK_SECOND_CALL: &str = "the gate's shrink runs as a call of its own after the delete committed";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct ShareReleaseModel {
    /// Which design.
    pub variant: ShareReleaseVariant,
    /// Sharing clients (the exclusive acquirer besides).
    pub clients: u8,
}

impl ShareReleaseModel {
    /// Two sharing clients and the exclusive acquirer.
    pub fn new(variant: ShareReleaseVariant) -> Self {
        ShareReleaseModel { variant, clients: 2 }
    }

    /// The next step of `client`'s release, if it holds or releases: while
    /// it holds, its first (the release statement may be sent at any step:
    /// sent and waiting for a lock is the same state as not sent yet).
    pub fn next_release_step(&self, client: &Client) -> Option<ReleaseStep> {
        match client.phase {
            Phase::Holding => Some(self.variant.first_call()[0]),
            Phase::Releasing { next, .. } => Some(next),
            Phase::Idle | Phase::Acquiring { .. } => None,
        }
    }

    /// The phase after `step` of a release, in the call it belongs to.
    fn after(&self, step: ReleaseStep, second_call: bool) -> Phase {
        let steps: &[ReleaseStep] = if second_call { &SECOND_CALL } else { self.variant.first_call() };
        let at = steps.iter().position(|s| *s == step).map_or(steps.len(), |at| at + 1);
        match steps.get(at) {
            Some(&next) => Phase::Releasing { next, second_call },
            None if step == ReleaseStep::DeleteCommit => Phase::Releasing { next: SECOND_CALL[0], second_call: true },
            None => Phase::Idle,
        }
    }

    /// Runs client `c`'s release step `step` on `s`; `None` if it waits.
    fn release_step(&self, s: &mut ShareReleaseState, c: u8, step: ReleaseStep, second_call: bool) -> Option<()> {
        let me = Txn::Release(c);
        let held = s.held();
        let i = usize::from(c);
        let row_locked_by_renewal = s.clients[i].renewal == Renewal::Locked;
        let client = &mut s.clients[i];
        match step {
            ReleaseStep::Snapshot => client.snapshot = Some(held),
            ReleaseStep::DeleteCommit | ReleaseStep::Delete if row_locked_by_renewal => return None,
            // Committed at once: no renewal can be waiting for the row (it
            // could only wait for this release's lock, held within the step).
            ReleaseStep::DeleteCommit => client.row = Row::Absent,
            ReleaseStep::Delete => client.row = Row::Deleting,
            ReleaseStep::LockGate => {
                if s.gate_lock.is_some() {
                    return None;
                }
                s.gate_lock = Some(me);
            }
            ReleaseStep::TryGate if s.gate_lock.is_some() => {
                // The gate is taken: the statement commits the delete alone
                // (a renewal waiting for the row finds it gone) and the
                // client makes the shrink's call.
                client.row = Row::Absent;
                client.renewal = Renewal::Idle;
                client.phase = Phase::Releasing { next: SECOND_CALL[0], second_call: true };
                return Some(());
            }
            ReleaseStep::TryGate => s.gate_lock = Some(me),
            // Its own delete is visible to it, so its own row never counts.
            ReleaseStep::ReadFresh => client.seen = Some(held & !(1 << c) != 0),
            ReleaseStep::ReadInSnapshot => client.seen = client.snapshot.take().map(|bits| bits & !(1 << c) != 0),
            ReleaseStep::WriteGate => {
                let up = client.seen.take()?;
                if matches!(s.gate, Gate::Up | Gate::Down) {
                    s.gate = if up { Gate::Up } else { Gate::Down };
                }
            }
            ReleaseStep::Commit => {
                if s.gate_lock == Some(me) {
                    s.gate_lock = None;
                }
                // The delete becomes visible; a renewal waiting for the row
                // finds it gone, renews nothing, takes no gate lock, ends.
                if client.row == Row::Deleting {
                    client.row = Row::Absent;
                    client.renewal = Renewal::Idle;
                }
            }
        }
        s.clients[i].phase = self.after(step, second_call);
        Some(())
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShareReleaseAction {
    /// Client `c`'s shared acquire takes its next step.
    Acquire(u8, AcquireStep),
    /// Client `c`'s release takes its next step.
    Release(u8, ReleaseStep),
    /// Client `c`'s renewal starts: it updates the share row, taking its
    /// lock, or waits for it.
    RenewRow(u8),
    /// Client `c`'s renewal locks the gate and raises it.
    RenewGate(u8),
    /// Client `c`'s renewal commits.
    RenewCommit(u8),
    /// X's acquire or release locks the gate row and writes it.
    ExclusiveLock,
    /// X's acquire or release commits.
    ExclusiveCommit,
}

impl fmt::Display for ShareReleaseAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Acquire(c, step) => write!(f, "{}'s share acquire {step}", client_name(*c)),
            Self::Release(c, step) => write!(f, "{}'s release {step}", client_name(*c)),
            Self::RenewRow(c) => write!(f, "{}'s renewal updates its share row (or waits for it)", client_name(*c)),
            Self::RenewGate(c) => write!(f, "{}'s renewal locks the gate and raises it", client_name(*c)),
            Self::RenewCommit(c) => write!(f, "{}'s renewal commits", client_name(*c)),
            Self::ExclusiveLock => write!(f, "X locks the gate row and writes it"),
            Self::ExclusiveCommit => write!(f, "X commits"),
        }
    }
}

impl Model for ShareReleaseModel {
    type State = ShareReleaseState;
    type Action = ShareReleaseAction;

    fn init_states(&self) -> Vec<ShareReleaseState> {
        let client =
            Client { phase: Phase::Idle, row: Row::Absent, renewal: Renewal::Idle, snapshot: None, seen: None };
        vec![ShareReleaseState {
            gate: Gate::Down,
            gate_lock: None,
            exclusive: Exclusive::Idle,
            clients: vec![client; usize::from(self.clients)],
        }]
    }

    fn actions(&self, s: &ShareReleaseState, actions: &mut Vec<ShareReleaseAction>) {
        let gate_free = s.gate_lock.is_none();
        for (i, client) in s.clients.iter().enumerate() {
            let c = i as u8;
            match client.phase {
                Phase::Idle if gate_free => actions.push(ShareReleaseAction::Acquire(c, AcquireStep::LockGate)),
                Phase::Idle => {}
                Phase::Acquiring { next } => actions.push(ShareReleaseAction::Acquire(c, next)),
                Phase::Holding | Phase::Releasing { .. } => {
                    actions.extend(self.next_release_step(client).map(|step| ShareReleaseAction::Release(c, step)))
                }
            }
            match client.renewal {
                Renewal::Idle if matches!(client.row, Row::Held | Row::Deleting) => {
                    actions.push(ShareReleaseAction::RenewRow(c))
                }
                Renewal::Locked if gate_free => actions.push(ShareReleaseAction::RenewGate(c)),
                Renewal::Raised => actions.push(ShareReleaseAction::RenewCommit(c)),
                _ => {}
            }
        }
        match s.exclusive {
            Exclusive::Idle | Exclusive::Holding if gate_free => actions.push(ShareReleaseAction::ExclusiveLock),
            Exclusive::Acquiring { .. } | Exclusive::Releasing => actions.push(ShareReleaseAction::ExclusiveCommit),
            _ => {}
        }
    }

    fn next_state(&self, s: &ShareReleaseState, action: ShareReleaseAction) -> Option<ShareReleaseState> {
        let mut n = s.clone();
        match action {
            ShareReleaseAction::Acquire(c, step) => {
                let client = &mut n.clients[usize::from(c)];
                match (client.phase, step) {
                    (Phase::Idle, AcquireStep::LockGate) => {
                        n.gate_lock = Some(Txn::Acquire(c));
                        client.phase = Phase::Acquiring { next: AcquireStep::Grant };
                    }
                    (Phase::Acquiring { next: AcquireStep::Grant }, AcquireStep::Grant) => {
                        if n.gate != Gate::Exclusive {
                            client.row = Row::Inserted;
                            n.gate = Gate::Up;
                        }
                        client.phase = Phase::Acquiring { next: AcquireStep::Commit };
                    }
                    (Phase::Acquiring { next: AcquireStep::Commit }, AcquireStep::Commit) => {
                        n.gate_lock = None;
                        let granted = client.row == Row::Inserted;
                        client.row = if granted { Row::Held } else { Row::Absent };
                        client.phase = if granted { Phase::Holding } else { Phase::Idle };
                    }
                    _ => return None,
                }
            }
            ShareReleaseAction::Release(c, step) => {
                let client = &s.clients[usize::from(c)];
                if self.next_release_step(client) != Some(step) {
                    return None;
                }
                let second_call = matches!(client.phase, Phase::Releasing { second_call: true, .. });
                self.release_step(&mut n, c, step, second_call)?;
            }
            ShareReleaseAction::RenewRow(c) => {
                let client = &mut n.clients[usize::from(c)];
                client.renewal = if client.row == Row::Deleting { Renewal::Waiting } else { Renewal::Locked };
            }
            ShareReleaseAction::RenewGate(c) => {
                // `g` writes only the gate (`WHERE token = GATE`).
                if n.gate == Gate::Down {
                    n.gate = Gate::Up;
                }
                n.gate_lock = Some(Txn::Renewal(c));
                n.clients[usize::from(c)].renewal = Renewal::Raised;
            }
            ShareReleaseAction::RenewCommit(c) => {
                n.gate_lock = None;
                n.clients[usize::from(c)].renewal = Renewal::Idle;
            }
            ShareReleaseAction::ExclusiveLock => {
                n.gate_lock = Some(Txn::Exclusive);
                n.exclusive = if n.exclusive == Exclusive::Holding {
                    n.gate = Gate::Released;
                    Exclusive::Releasing
                } else {
                    let granted = matches!(n.gate, Gate::Down | Gate::Released);
                    if granted {
                        n.gate = Gate::Exclusive;
                    }
                    Exclusive::Acquiring { granted }
                };
            }
            ShareReleaseAction::ExclusiveCommit => {
                n.gate_lock = None;
                n.exclusive = match n.exclusive {
                    Exclusive::Acquiring { granted: true } => Exclusive::Holding,
                    _ => Exclusive::Idle,
                };
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(EXCLUSION, |_, s: &ShareReleaseState| !(s.exclusive_holds() && s.held() != 0)),
            Property::always(NO_DEADLOCK, |_, s: &ShareReleaseState| s.deadlock().is_none()),
            Property::always(GATE_COVERS, |_, s: &ShareReleaseState| s.gate_covers()),
            Property::sometimes(EXCLUSIVE_GRANTED, |_, s: &ShareReleaseState| s.exclusive == Exclusive::Holding),
            Property::sometimes(TWO_SHARES, |_, s: &ShareReleaseState| s.held().count_ones() >= 2),
            Property::sometimes(RELEASE_WAITS_ON_GATE, |m: &Self, s: &ShareReleaseState| {
                s.clients.iter().enumerate().any(|(i, c)| {
                    m.next_release_step(c) == Some(ReleaseStep::LockGate)
                        && c.row == Row::Deleting
                        && s.gate_lock.is_some_and(|h| h != Txn::Release(i as u8))
                })
            }),
            Property::sometimes(RENEWAL_WAITS_ON_GATE, |_, s: &ShareReleaseState| {
                s.gate_lock.is_some() && s.clients.iter().any(|c| c.renewal == Renewal::Locked)
            }),
            Property::sometimes(RENEWAL_WAITS_ON_RELEASE, |_, s: &ShareReleaseState| {
                s.clients.iter().any(|c| c.renewal == Renewal::Waiting)
            }),
            Property::sometimes(RELEASE_WAITS_ON_RENEWAL, |m: &Self, s: &ShareReleaseState| {
                s.clients.iter().any(|c| {
                    matches!(m.next_release_step(c), Some(ReleaseStep::Delete | ReleaseStep::DeleteCommit))
                        && c.renewal == Renewal::Locked
                })
            }),
            Property::sometimes(SHRINK_SECOND_CALL, |_, s: &ShareReleaseState| {
                s.clients.iter().any(|c| matches!(c.phase, Phase::Releasing { second_call: true, .. }))
            }),
        ]
    }
}
