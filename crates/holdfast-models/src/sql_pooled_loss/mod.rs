//! Model 19: PostgreSQL and MySQL/MariaDB behind a connection pooler
//! (PgBouncer) or a proxy (ProxySQL): a grant statement of a lost
//! connection made harmless by rotating the client's session, where
//! model 18's fence (end the lost connection's backend) is impossible.
//!
//! Client A's grant statement S (token t, key K, under A's session
//! `s_old`) goes the stages of model 18 (in the network, waiting for K's
//! row lock, which a third party's transaction holds at the start,
//! committing, applied or rolled back) and A loses its connection at any
//! stage before it read the answer. S may apply at any later step. A holds
//! K2 under `s_old` from the start, and its attempt S2 for K3 (free at
//! first) is in flight on a live connection under `s_old`. After the loss
//! A either releases t (the cleanup: one step that sees committed rows
//! only) or retries the acquire with t (it needs K's row lock): granted,
//! or a regrant if the row is t's, released later; or "busy". B takes any
//! key at any step it is free or held under a lapsed session (a takeover),
//! and keeps it.
//!
//! S decides at its commit. On the lean path it writes its row under
//! `s_old` as named; on the full path it reads `s_old`'s row and, if that
//! lapsed, makes a session of its own (the statement's new id, which A
//! never learns), which nobody renews: it lapses at a later step. A
//! regrant (the row is the statement's own token's, under a live session)
//! answers "granted"; whether it moves the row is the design.
//!
//! The rotation ([`PooledLossVariant::Rotate`], to ship): (1) at the loss
//! A marks `s_old` retiring: attempts from then on choose `s_new`,
//! created by one statement if missing; (2) A waits until S2 is answered;
//! (3) one statement moves the rows of the tokens A's book holds under
//! `s_old` to `s_new`; (4) one statement sets `s_old`'s row expired, and A
//! renews it no more. A regrant moves the row to the attempt's session
//! only from a session that was retiring when the attempt was sent (the
//! statement names the client's retiring sessions): the retry moves S's
//! row from `s_old` to `s_new`; S, sent before the loss, never moves a row.
//! The design as first described, where every regrant moves the row to its
//! attempt's session, is [`PooledLossVariant::AnyRegrantMoves`]: rejected.
//!
//! Not modelled: S2 lost as well (a second lost statement under the same
//! retiring session), the retry's own loss, a loss under `s_new` during
//! the rotation, a rotation statement failing, renewals and time (a lapse
//! is a step), B's sessions and releases.

mod state;

pub use state::{Book, FreshRow, Key, PooledLossState, Reached, Row, Session, Stage};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PooledLossVariant {
    /// To ship: the rotation, a regrant moving a row only from a session
    /// retiring when its attempt was sent.
    Rotate,
    /// The code today behind a pooler: the cleanup release only.
    NoRotation,
    /// Rejected: `s_old` ended without the migration.
    EndWithoutMigrating,
    /// Rejected: the migration without waiting for S2's answer.
    MigrateWithoutWaiting,
    /// Rejected: `s_old` ended, then the migration.
    EndBeforeMigrating,
    /// Rejected: a regrant leaves the row under its session (the code
    /// today: the answer names the row's session).
    RegrantKeepsSession,
    /// Rejected (the design as first described): every regrant moves the
    /// row to its attempt's session, a late S's back to `s_old` too.
    AnyRegrantMoves,
}

/// Name of the exclusion property.
pub const NO_DOUBLE_HOLDING: &str =
    "every key A's book holds has A's row under a session A keeps (so B holds none and can take over none)";
/// Name of the property that a grant nobody tracks ends free.
pub const NO_REVIVAL: &str = "once s_old is ended and A is done with t, t's row is under no session A keeps (free to B, at once or within a TTL)";
/// Name of the property checked once everything is done.
pub const ENDS_FREE: &str = "when everything is done, K is free to B and A still holds K2";
/// Reachability: a late S taken over.
pub const LATE_TAKEN_OVER: &str = "S applied after s_old was ended and B took K over";
/// Reachability: the cleanup release deleted S's row.
pub const CLEANUP_DELETED: &str = "S applied before the cleanup release, which deleted it";
/// Reachability: the retry regranted S's row.
pub const RETRY_REGRANTED: &str = "the retry found S's row its own";
/// Reachability: a late S found the retry's row its own.
pub const LATE_REGRANT: &str = "S, applied after the retry, found the retry's row under s_new its own";
/// Reachability: S2 answered during the wait and migrated.
pub const S2_MIGRATED: &str = "S2 answered \"granted\" during the wait and was migrated";

/// The model: one variant.
#[derive(Clone, Debug)]
pub struct PooledLossModel {
    /// Which design.
    pub variant: PooledLossVariant,
}

impl PooledLossModel {
    /// Whether the rotation waits for S2's answer before its next step.
    fn waited(&self, s: &PooledLossState) -> bool {
        self.variant == PooledLossVariant::MigrateWithoutWaiting || s.book_k3 != Book::Waiting
    }

    /// Whether step 3 may run now.
    fn may_migrate(&self, s: &PooledLossState) -> bool {
        use PooledLossVariant as V;
        let after_end = match self.variant {
            V::NoRotation | V::EndWithoutMigrating => return false,
            V::EndBeforeMigrating => s.old_ended,
            _ => true,
        };
        s.retiring && !s.migrated && s.new_live && self.waited(s) && after_end
    }

    /// Whether step 4 may run now.
    fn may_end(&self, s: &PooledLossState) -> bool {
        use PooledLossVariant as V;
        let migrated = matches!(self.variant, V::EndWithoutMigrating | V::EndBeforeMigrating) || s.migrated;
        s.retiring && !s.old_ended && self.waited(s) && migrated
    }

    /// Whether the rotation has nothing left to do (at once without one).
    fn rotation_over(&self, s: &PooledLossState) -> bool {
        use PooledLossVariant as V;
        match self.variant {
            V::NoRotation => true,
            V::EndWithoutMigrating => s.old_ended || !s.retiring,
            _ => (s.old_ended && s.migrated) || !s.retiring,
        }
    }

    /// Whether A's recovery from the loss is over, as far as t goes: `s_old`
    /// ended (at once without a rotation).
    fn recovered(&self, s: &PooledLossState) -> bool {
        self.variant == PooledLossVariant::NoRotation || s.old_ended
    }

    /// Whether everything has finished.
    fn finished(&self, s: &PooledLossState) -> bool {
        s.book_k.done()
            && s.s.resolved()
            && s.book_k3 != Book::Waiting
            && self.rotation_over(s)
            && !s.row_locked
            && !s.orphan_live()
    }

    /// S's commit, decided under K's row lock.
    fn commit_s(&self, n: &mut PooledLossState) -> bool {
        let chosen = if n.s_full && n.old_ended { Session::Fresh } else { Session::Old };
        let write = |n: &mut PooledLossState, session: Session| {
            n.k = Row::A(session);
            if session == Session::Fresh {
                n.fresh = FreshRow::Live;
            }
        };
        match n.k {
            row if n.takeable(row) => {
                write(n, chosen);
                n.reached.s_after_end |= n.old_ended;
                true
            }
            Row::A(session) => {
                n.reached.late_regrant |= session == Session::New;
                if self.variant == PooledLossVariant::AnyRegrantMoves {
                    write(n, chosen);
                }
                true
            }
            Row::Free | Row::B => false,
        }
    }

    /// The retry of S's acquire with t (K's row unlocked), choosing `s_new`
    /// once `s_old` is retiring.
    fn retry(&self, n: &mut PooledLossState) {
        let chosen = if n.retiring { Session::New } else { Session::Old };
        n.book_k = match n.k {
            row if n.takeable(row) => {
                n.k = Row::A(chosen);
                Book::Holding(chosen)
            }
            Row::A(session) => {
                n.reached.retry_regranted = true;
                let moves = match self.variant {
                    PooledLossVariant::RegrantKeepsSession => false,
                    PooledLossVariant::AnyRegrantMoves => true,
                    _ => n.retiring && session == Session::Old,
                };
                let now = if moves { chosen } else { session };
                n.k = Row::A(now);
                Book::Holding(now)
            }
            Row::Free | Row::B => Book::Refused,
        };
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PooledLossAction {
    /// The server reads S.
    Deliver,
    /// S, waiting, gets K's row lock.
    GetLock,
    /// S's commit becomes visible.
    Commit,
    /// A reads S's answer.
    Answer,
    /// S is rolled back (the server or the pooler ends it) after the loss.
    Abort,
    /// The third party's transaction ends: K's row is unlocked.
    ThirdPartyEnds,
    /// A loses S's connection with S unanswered (and, rotating, marks
    /// `s_old` retiring: step 1).
    Lose,
    /// A creates `s_new`'s row.
    CreateNew,
    /// S2 applies under `s_old`.
    S2Applies,
    /// A reads S2's answer.
    S2Answer,
    /// Step 3: A moves its book's rows under `s_old` to `s_new`.
    Migrate,
    /// Step 4: A sets `s_old`'s row expired.
    EndOld,
    /// The fresh session, renewed by nobody, lapses.
    FreshLapses,
    /// The cleanup: A releases t.
    Cleanup,
    /// A retries S's acquire with t.
    Retry,
    /// A releases K, which it holds.
    Release,
    /// B takes a key (free, or a takeover).
    BTakes(Key),
}

impl fmt::Display for PooledLossAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Deliver => write!(f, "the server reads S"),
            Self::GetLock => write!(f, "S gets K's row lock"),
            Self::Commit => write!(f, "S's commit becomes visible"),
            Self::Answer => write!(f, "A reads S's answer"),
            Self::Abort => write!(f, "S is rolled back"),
            Self::ThirdPartyEnds => write!(f, "the third party's transaction ends"),
            Self::Lose => write!(f, "A loses S's connection (S unanswered)"),
            Self::CreateNew => write!(f, "A creates s_new"),
            Self::S2Applies => write!(f, "S2 applies"),
            Self::S2Answer => write!(f, "A reads S2's answer"),
            Self::Migrate => write!(f, "A migrates its rows under s_old to s_new"),
            Self::EndOld => write!(f, "A ends s_old"),
            Self::FreshLapses => write!(f, "S's own session lapses"),
            Self::Cleanup => write!(f, "A's cleanup releases t"),
            Self::Retry => write!(f, "A retries the acquire with t"),
            Self::Release => write!(f, "A releases K"),
            Self::BTakes(key) => write!(f, "B takes {key:?}"),
        }
    }
}

impl Model for PooledLossModel {
    type State = PooledLossState;
    type Action = PooledLossAction;

    fn init_states(&self) -> Vec<PooledLossState> {
        [false, true]
            .into_iter()
            .map(|s_full| PooledLossState {
                s_full,
                old_ended: false,
                new_live: false,
                fresh: FreshRow::Absent,
                k: Row::Free,
                k2: Row::A(Session::Old),
                k3: Row::Free,
                row_locked: true,
                s: Stage::InNetwork,
                s2: None,
                book_k: Book::Waiting,
                book_k2: Book::Holding(Session::Old),
                book_k3: Book::Waiting,
                retiring: false,
                migrated: false,
                reached: Reached::default(),
            })
            .collect()
    }

    fn actions(&self, s: &PooledLossState, actions: &mut Vec<PooledLossAction>) {
        use PooledLossAction as A;
        match s.s {
            Stage::InNetwork => actions.push(A::Deliver),
            Stage::WaitingLock if !s.row_locked => actions.push(A::GetLock),
            Stage::Committing => actions.push(A::Commit),
            Stage::Applied { .. } if s.book_k == Book::Waiting => actions.push(A::Answer),
            _ => {}
        }
        if matches!(s.s, Stage::InNetwork | Stage::WaitingLock) && s.book_k != Book::Waiting {
            actions.push(A::Abort);
        }
        if s.row_locked {
            actions.push(A::ThirdPartyEnds);
        }
        if s.book_k == Book::Waiting {
            actions.push(A::Lose);
        }
        if s.retiring && !s.new_live {
            actions.push(A::CreateNew);
        }
        match (s.s2, s.book_k3) {
            (None, _) => actions.push(A::S2Applies),
            (Some(_), Book::Waiting) => actions.push(A::S2Answer),
            _ => {}
        }
        if self.may_migrate(s) {
            actions.push(A::Migrate);
        }
        if self.may_end(s) {
            actions.push(A::EndOld);
        }
        if s.orphan_live() {
            actions.push(A::FreshLapses);
        }
        if s.book_k == Book::Lost {
            actions.push(A::Cleanup);
            if s.k_unlocked() && (s.new_live || !s.retiring) {
                actions.push(A::Retry);
            }
        }
        if matches!(s.book_k, Book::Holding(_)) {
            actions.push(A::Release);
        }
        for key in [Key::K, Key::K2, Key::K3] {
            if s.takeable(s.row(key)) && (key != Key::K || s.k_unlocked()) {
                actions.push(A::BTakes(key));
            }
        }
    }

    fn next_state(&self, s: &PooledLossState, action: PooledLossAction) -> Option<PooledLossState> {
        use PooledLossAction as A;
        let mut n = s.clone();
        match action {
            A::Deliver => n.s = if n.row_locked { Stage::WaitingLock } else { Stage::Committing },
            A::GetLock => n.s = Stage::Committing,
            A::Commit => n.s = Stage::Applied { granted: self.commit_s(&mut n) },
            A::Answer => {
                let Stage::Applied { granted } = s.s else { return None };
                n.book_k = if granted { Book::Holding(Session::Old) } else { Book::Refused };
            }
            A::Abort => n.s = Stage::Aborted,
            A::ThirdPartyEnds => n.row_locked = false,
            A::Lose => {
                n.book_k = Book::Lost;
                n.retiring = self.variant != PooledLossVariant::NoRotation;
            }
            A::CreateNew => n.new_live = true,
            A::S2Applies => {
                let granted = n.takeable(n.k3);
                if granted {
                    n.k3 = Row::A(Session::Old);
                }
                n.s2 = Some(granted);
            }
            A::S2Answer => {
                let granted = s.s2?;
                n.book_k3 = if granted { Book::Holding(Session::Old) } else { Book::Refused };
                n.reached.s2_in_wait |= granted && n.retiring && !n.migrated;
            }
            A::Migrate => {
                for key in [Key::K, Key::K2, Key::K3] {
                    if n.book(key) != Book::Holding(Session::Old) {
                        continue;
                    }
                    if n.row(key) == Row::A(Session::Old) {
                        *n.row_mut(key) = Row::A(Session::New);
                        n.reached.s2_migrated |= key == Key::K3 && n.reached.s2_in_wait;
                    }
                    match key {
                        Key::K => n.book_k = Book::Holding(Session::New),
                        Key::K2 => n.book_k2 = Book::Holding(Session::New),
                        Key::K3 => n.book_k3 = Book::Holding(Session::New),
                    }
                }
                n.migrated = true;
            }
            A::EndOld => n.old_ended = true,
            A::FreshLapses => n.fresh = FreshRow::Lapsed,
            A::Cleanup | A::Release => {
                if matches!(n.k, Row::A(_)) {
                    n.k = Row::Free;
                    n.reached.cleanup_deleted |= action == A::Cleanup;
                }
                n.book_k = Book::Released;
            }
            A::Retry => self.retry(&mut n),
            A::BTakes(key) => {
                n.reached.late_taken_over |= key == Key::K && matches!(n.k, Row::A(_)) && n.reached.s_after_end;
                *n.row_mut(key) = Row::B;
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_DOUBLE_HOLDING, |_, s: &PooledLossState| s.double_held().is_none()),
            Property::always(NO_REVIVAL, |m: &PooledLossModel, s: &PooledLossState| !(m.recovered(s) && s.revived())),
            Property::always(ENDS_FREE, |m: &PooledLossModel, s: &PooledLossState| {
                !m.finished(s) || (s.k_free_to_b() && s.k2_kept())
            }),
            Property::sometimes(LATE_TAKEN_OVER, |_, s: &PooledLossState| s.reached.late_taken_over),
            Property::sometimes(CLEANUP_DELETED, |_, s: &PooledLossState| s.reached.cleanup_deleted),
            Property::sometimes(RETRY_REGRANTED, |_, s: &PooledLossState| s.reached.retry_regranted),
            Property::sometimes(LATE_REGRANT, |_, s: &PooledLossState| s.reached.late_regrant),
            Property::sometimes(S2_MIGRATED, |_, s: &PooledLossState| s.reached.s2_migrated),
        ]
    }
}
