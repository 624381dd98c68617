//! Model 18: PostgreSQL and MySQL/MariaDB: a grant statement of a lost
//! connection, applied after its attempt's release (shown on real servers by
//! `crates/holdfast/tests/late_acquire_sql.rs`).
//!
//! A mutex grant of the SQL stores is one autocommit statement sent on a
//! connection; the lease row it writes lives with its client's session row,
//! which the client renews for as long as it holds any lease, so a grant
//! nobody tracks stays held while the client lives and every other client
//! is refused. Attempt A1 of client A sends its grant statement S on
//! connection C1 (served by backend P1) and loses C1 before S is answered
//! (a reset by a middlebox, its own timeout). P1 does not notice at once: S
//! may still be in the network, wait in P1 for the key's row lock, or be
//! committing. The cleanup releases A1's token on a new connection, finds
//! nothing and is done; then S is applied and grants the key to A1's token.
//!
//! The model: one key, whose row a third party's transaction locks at the
//! start and unlocks at any step; client O holds the key at the start (one
//! initial state) or nobody does (the other), and O releases it at any step
//! the row is unlocked. S starts in the network; P1 reads it (it then waits
//! for the row lock, or takes it), commits it (granted if the key is free,
//! else "busy"), and its answer reaches A, each a step. A may lose C1 at any
//! step before it read the answer; from then P1 may notice and end on its
//! own at any step. After the loss A either releases A1's token (the
//! cleanup) or sends the `try_acquire` again (same token): granted, or
//! "granted" because S's grant is its own, and released later; or "busy",
//! and the caller does not release. Both go on a new connection on slot 1
//! (C1's slot, the key's) or, with [`Routing::AnySlot`], slot 2. A release
//! is one step that sees committed rows only (PostgreSQL's `DELETE ...
//! WHERE token = $1` skips a row whose visible version has another token,
//! without waiting for its lock); a retry and O's release need the row
//! unlocked. Client B tries once (answered) when everything else is done:
//! A done with A1, S applied or aborted, the row unlocked, O released.
//!
//! A backend that is ended: a statement still in the network is never read;
//! one waiting for a lock is rolled back; one committing commits first, and
//! only then does the backend end. A cancel request cancels the statement
//! waiting at the moment it arrives and nothing else.
//!
//! - `EndThenWait` (to ship): before any further statement (on any slot),
//!   A ends P1 (`pg_terminate_backend(pid, timeout)`; `KILL CONNECTION`) and
//!   waits until the server reports it gone (the call returns true; the id
//!   is absent from the processlist). S then committed already (the release
//!   deletes its grant; the retry finds it its own) or never will.
//! - `PlainRelease` (the code before, rejected): the release or the retry
//!   at once.
//! - `CancelRequest` (rejected): a cancel request for P1, then at once.
//! - `TerminateNoWait` (rejected): the termination, then at once.
//! - `FenceOwnSlot`: `EndThenWait`'s fence only before the next statement on
//!   C1's slot. Rejected with [`Routing::AnySlot`] (MySQL's pool hands out
//!   any connection); shipped for PostgreSQL with [`Routing::KeySlot`]
//!   (a key's statements always use its slot).
//! - `RetryUnfenced` (rejected): the fence before the release, not before
//!   the retry.
//!
//! Time is abstracted away: the row lock, the network, the signals and P1
//! noticing are steps the checker picks. By default a signal acts when it
//! is sent (the most the rejected designs could hope for); with
//! `signals_in_flight` it is a message the server acts on at a later step.
//!
//! Not modelled: several keys (the MySQL fence holds every slot, also
//! other keys' statements), a second attempt of A, the fence failing (the
//! server unreachable: A must not go on, and its session should end), a
//! pid or connection id reused after P1 ended, the release's own loss.

mod state;

pub use state::{BTry, Backend, Client, Fence, Holder, LateStatementState, Reached, Signal, Statement};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LateStatementVariant {
    /// To ship: end P1 and wait until it is gone, before any statement.
    EndThenWait,
    /// The code before: release (or retry) at once.
    PlainRelease,
    /// Rejected: a cancel request for P1, then release at once.
    CancelRequest,
    /// Rejected: end P1, release without waiting until it is gone.
    TerminateNoWait,
    /// `EndThenWait` only before a statement on the lost connection's slot:
    /// rejected with any slot's release, shipped with the key's slot.
    FenceOwnSlot,
    /// Rejected: the fence before the release, not before the retry.
    RetryUnfenced,
}

impl LateStatementVariant {
    /// The signal the fence sends, if any.
    pub fn signal(self) -> Option<Signal> {
        match self {
            Self::PlainRelease => None,
            Self::CancelRequest => Some(Signal::Cancel),
            _ => Some(Signal::Terminate),
        }
    }

    /// Whether the fence waits until P1 is reported gone.
    pub fn waits(self) -> bool {
        matches!(self, Self::EndThenWait | Self::FenceOwnSlot | Self::RetryUnfenced)
    }
}

/// Which connection slot A's statements about the key may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Routing {
    /// Any pooled connection (MySQL/MariaDB's pool): slot 1 or slot 2.
    AnySlot,
    /// The key's slot only, C1's (PostgreSQL).
    KeySlot,
}

/// A's statements about A1 after the loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Followup {
    /// The release of A1's token.
    Release,
    /// The `try_acquire` sent again with A1's token.
    Retry,
}

/// Name of the property that a released (or refused) token never holds.
pub const NO_REVIVAL: &str = "once A is done with A1 (released, or answered busy), A1's token never holds the key";
/// Name of the property checked once everything is done.
pub const ENDS_FREE: &str = "when everything is done, B's try is granted";
/// Name of the exclusion property.
pub const ONE_HOLDER: &str = "every client that counts itself the holder has its token in the key's row";
/// Reachability: the release deleted S's grant.
pub const DELETED_LATE_GRANT: &str = "S committed before the fence and the release deleted it";
/// Reachability: the fence rolled S back.
pub const ABORTED_WAITING: &str = "S aborted by the fence while waiting for the row lock";
/// Reachability: S never read.
pub const NEVER_READ: &str = "S still in the network when P1 ended";
/// Reachability: the termination waited for the commit.
pub const COMMIT_BEFORE_EXIT: &str = "P1 told to end while S was committing ended after the commit";
/// Reachability: the retry found S's grant.
pub const RETRY_FOUND_OWN: &str = "a retry after the fence found S's grant its own";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct LateStatementModel {
    /// Which design.
    pub variant: LateStatementVariant,
    /// Which slots A's statements may take.
    pub routing: Routing,
    /// A signal is a message the server acts on at a later step, not when
    /// it is sent.
    pub signals_in_flight: bool,
}

impl LateStatementModel {
    /// Any slot (MySQL's pool), signals acting when sent.
    pub fn new(variant: LateStatementVariant) -> Self {
        LateStatementModel { variant, routing: Routing::AnySlot, signals_in_flight: false }
    }

    /// Whether A may send `send` on `slot` now.
    fn may_send(&self, s: &LateStatementState, send: Followup, slot: u8) -> bool {
        if s.fence == Fence::Unneeded {
            return true;
        }
        match self.variant {
            LateStatementVariant::EndThenWait => s.fence == Fence::Done,
            LateStatementVariant::PlainRelease => true,
            LateStatementVariant::CancelRequest | LateStatementVariant::TerminateNoWait => s.fence != Fence::Needed,
            LateStatementVariant::FenceOwnSlot => slot != 1 || s.fence == Fence::Done,
            LateStatementVariant::RetryUnfenced => send == Followup::Retry || s.fence == Fence::Done,
        }
    }

    /// The slots A's statements may take.
    fn slots(&self) -> &'static [u8] {
        match self.routing {
            Routing::AnySlot => &[1, 2],
            Routing::KeySlot => &[1],
        }
    }
}

/// P1 ends (told to by the fence, or noticing the lost connection): S, if
/// unread or waiting, never applies; a commit completes first.
fn end_backend(n: &mut LateStatementState, by_fence: bool) {
    if n.backend != Backend::Alive {
        return;
    }
    n.backend = Backend::Ended;
    match n.statement {
        Statement::InNetwork => {
            n.statement = Statement::Aborted;
            n.reached.never_read |= by_fence;
        }
        Statement::WaitingLock => {
            n.statement = Statement::Aborted;
            n.reached.aborted_waiting |= by_fence;
        }
        Statement::Committing => {
            n.backend = Backend::Exiting;
            n.reached.commit_before_exit |= by_fence;
        }
        Statement::Applied { .. } | Statement::Aborted => {}
    }
}

/// The server acts on a fence signal.
fn act_on(n: &mut LateStatementState, signal: Signal) {
    match signal {
        Signal::Terminate => end_backend(n, true),
        Signal::Cancel if n.backend == Backend::Alive && n.statement == Statement::WaitingLock => {
            n.statement = Statement::Aborted;
            n.reached.aborted_waiting = true;
        }
        Signal::Cancel => {}
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LateStatementAction {
    /// P1 reads S.
    Deliver,
    /// S, waiting, gets the key's row lock.
    GetLock,
    /// S's commit becomes visible (and P1 ends if it was told to).
    Commit,
    /// S's answer reaches A on C1.
    Answer,
    /// The third party's transaction ends: the row is unlocked.
    ThirdPartyEnds,
    /// O releases the key.
    OtherReleases,
    /// A loses C1 with S unanswered.
    Lose,
    /// P1 notices C1 is gone and ends on its own.
    Notices,
    /// A's fence sends its signal.
    SendSignal,
    /// The server acts on the signal in flight.
    DeliverSignal,
    /// A's fence: the server reports P1 gone.
    SeesGone,
    /// A releases A1's token on a new connection on slot `n`.
    Release(u8),
    /// A sends the `try_acquire` again on a new connection on slot `n`.
    Retry(u8),
    /// B tries the key once.
    BTries,
}

impl fmt::Display for LateStatementAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Deliver => write!(f, "P1 reads S"),
            Self::GetLock => write!(f, "S gets the row lock"),
            Self::Commit => write!(f, "S's commit becomes visible"),
            Self::Answer => write!(f, "A reads S's answer on C1"),
            Self::ThirdPartyEnds => write!(f, "the third party's transaction ends"),
            Self::OtherReleases => write!(f, "O releases the key"),
            Self::Lose => write!(f, "A loses C1 (S unanswered)"),
            Self::Notices => write!(f, "P1 notices C1 is gone and ends"),
            Self::SendSignal => write!(f, "A's fence signals P1"),
            Self::DeliverSignal => write!(f, "the server acts on the signal"),
            Self::SeesGone => write!(f, "the server reports P1 gone"),
            Self::Release(slot) => write!(f, "A releases A1's token on slot {slot}"),
            Self::Retry(slot) => write!(f, "A retries the try_acquire on slot {slot}"),
            Self::BTries => write!(f, "B tries the key"),
        }
    }
}

impl Model for LateStatementModel {
    type State = LateStatementState;
    type Action = LateStatementAction;

    fn init_states(&self) -> Vec<LateStatementState> {
        [Holder::Free, Holder::Other]
            .into_iter()
            .map(|key| LateStatementState {
                key,
                row_locked: true,
                statement: Statement::InNetwork,
                backend: Backend::Alive,
                signal: None,
                client: Client::Waiting,
                fence: Fence::Unneeded,
                b: BTry::Waiting,
                reached: Reached::default(),
            })
            .collect()
    }

    fn actions(&self, s: &LateStatementState, actions: &mut Vec<LateStatementAction>) {
        use LateStatementAction as A;
        let alive = s.backend == Backend::Alive;
        match s.statement {
            Statement::InNetwork if alive => actions.push(A::Deliver),
            Statement::WaitingLock if alive && !s.row_locked => actions.push(A::GetLock),
            Statement::Committing => actions.push(A::Commit),
            Statement::Applied { .. } if s.client == Client::Waiting => actions.push(A::Answer),
            _ => {}
        }
        if s.row_locked {
            actions.push(A::ThirdPartyEnds);
        }
        if s.key == Holder::Other && s.row_free() {
            actions.push(A::OtherReleases);
        }
        if s.client == Client::Waiting {
            actions.push(A::Lose);
        }
        if s.fence != Fence::Unneeded && alive {
            actions.push(A::Notices);
        }
        if s.fence == Fence::Needed && self.variant.signal().is_some() {
            actions.push(A::SendSignal);
        }
        if s.signal.is_some() {
            actions.push(A::DeliverSignal);
        }
        if s.fence == Fence::Signalled && self.variant.waits() && s.backend == Backend::Ended {
            actions.push(A::SeesGone);
        }
        for &slot in self.slots() {
            if matches!(s.client, Client::Lost | Client::Holding) && self.may_send(s, Followup::Release, slot) {
                actions.push(A::Release(slot));
            }
            if s.client == Client::Lost && s.row_free() && self.may_send(s, Followup::Retry, slot) {
                actions.push(A::Retry(slot));
            }
        }
        let rest = s.client.done() && s.statement.resolved() && !s.row_locked && s.key != Holder::Other;
        if s.b == BTry::Waiting && rest {
            actions.push(A::BTries);
        }
    }

    fn next_state(&self, s: &LateStatementState, action: LateStatementAction) -> Option<LateStatementState> {
        use LateStatementAction as A;
        let mut n = s.clone();
        match action {
            A::Deliver => {
                n.statement = if n.row_locked { Statement::WaitingLock } else { Statement::Committing };
            }
            A::GetLock => n.statement = Statement::Committing,
            A::Commit => {
                let granted = n.key == Holder::Free;
                if granted {
                    n.key = Holder::A1;
                }
                n.statement = Statement::Applied { granted };
                if n.backend == Backend::Exiting {
                    n.backend = Backend::Ended;
                }
            }
            A::Answer => {
                let Statement::Applied { granted } = s.statement else { return None };
                n.client = if granted { Client::Holding } else { Client::Refused };
            }
            A::ThirdPartyEnds => n.row_locked = false,
            A::OtherReleases => n.key = Holder::Free,
            A::Lose => {
                n.client = Client::Lost;
                n.fence = Fence::Needed;
            }
            A::Notices => end_backend(&mut n, false),
            A::SendSignal => {
                let signal = self.variant.signal()?;
                n.fence = Fence::Signalled;
                if self.signals_in_flight {
                    n.signal = Some(signal);
                } else {
                    act_on(&mut n, signal);
                }
            }
            A::DeliverSignal => {
                let signal = n.signal.take()?;
                act_on(&mut n, signal);
            }
            A::SeesGone => n.fence = Fence::Done,
            A::Release(_) => {
                if n.key == Holder::A1 {
                    n.key = Holder::Free;
                    n.reached.deleted_late_grant |= s.client == Client::Lost;
                }
                n.client = Client::Released;
            }
            A::Retry(_) => match n.key {
                Holder::Free => {
                    n.key = Holder::A1;
                    n.client = Client::Holding;
                }
                Holder::A1 => {
                    n.client = Client::Holding;
                    n.reached.retry_found_own = true;
                }
                Holder::Other | Holder::B => n.client = Client::Refused,
            },
            A::BTries => {
                n.b = if n.key == Holder::Free { BTry::Granted } else { BTry::Refused };
                if n.b == BTry::Granted {
                    n.key = Holder::B;
                }
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_REVIVAL, |_, s: &LateStatementState| !s.revived()),
            Property::always(ENDS_FREE, |_, s: &LateStatementState| s.b != BTry::Refused),
            Property::always(ONE_HOLDER, |_, s: &LateStatementState| s.one_holder()),
            Property::sometimes(DELETED_LATE_GRANT, |_, s: &LateStatementState| s.reached.deleted_late_grant),
            Property::sometimes(ABORTED_WAITING, |_, s: &LateStatementState| s.reached.aborted_waiting),
            Property::sometimes(NEVER_READ, |_, s: &LateStatementState| s.reached.never_read),
            Property::sometimes(COMMIT_BEFORE_EXIT, |_, s: &LateStatementState| s.reached.commit_before_exit),
            Property::sometimes(RETRY_FOUND_OWN, |_, s: &LateStatementState| s.reached.retry_found_own),
        ]
    }
}
