//! The state of the SQL late-statement model: the key's row and the third
//! party's lock on it, attempt A1's grant statement S and the backend P1
//! serving it, client A's view and fence, client O (an earlier holder) and
//! B's one try.

use std::fmt;

/// Whose token the key's lease row holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    /// Nobody's: the row is a released marker (or absent).
    Free,
    /// Attempt A1's token, under A's live session row.
    A1,
    /// Client O's token: O held the key before A1 was sent, and releases it
    /// at any step.
    Other,
    /// Client B's token.
    B,
}

/// Where A1's grant statement S is (an autocommit statement sent on C1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Statement {
    /// In the network (or the server's socket buffer): P1 has not read it.
    InNetwork,
    /// Read by P1, waiting for the key's row lock.
    WaitingLock,
    /// In P1 with the row lock, its commit not yet visible: what it writes
    /// is decided, and a commit is not interrupted.
    Committing,
    /// Its commit is visible: the key granted to A1's token, or "busy".
    Applied {
        /// Whether it granted the key (the key was free).
        granted: bool,
    },
    /// Rolled back while waiting for the lock, or never read (P1 ended with
    /// it still in the network).
    Aborted,
}

impl Statement {
    /// Whether nothing more can happen to it.
    pub fn resolved(self) -> bool {
        matches!(self, Self::Applied { .. } | Self::Aborted)
    }
}

/// The server backend P1 that serves connection C1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Running.
    Alive,
    /// Told to end while S was committing: it ends once the commit is
    /// visible.
    Exiting,
    /// Gone: the server reports it absent.
    Ended,
}

/// Client A, as far as attempt A1 goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    /// Waits for S's answer on C1.
    Waiting,
    /// Lost C1 with S unanswered: the outcome unknown; A's next statement
    /// about A1 is the cleanup's release or a retry of the `try_acquire`.
    Lost,
    /// Counts itself the holder of the key (S or the retry answered
    /// "granted"); it releases it later.
    Holding,
    /// Released A1's token: the release has completed.
    Released,
    /// Answered "busy" (S on C1, or the retry): the caller does not release.
    Refused,
}

impl Client {
    /// Whether A is done with A1 and tracks nothing of it.
    pub fn done(self) -> bool {
        matches!(self, Self::Released | Self::Refused)
    }
}

/// A's fence of the lost connection C1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fence {
    /// C1 was not lost.
    Unneeded,
    /// C1 was lost: nothing done about P1 yet.
    Needed,
    /// The cancel request or the termination was sent.
    Signalled,
    /// The server reported P1 gone.
    Done,
}

/// What the fence asks the server to do to P1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    /// A cancel request: cancels the statement P1 runs at that moment.
    Cancel,
    /// `pg_terminate_backend` / `KILL CONNECTION`: ends P1.
    Terminate,
}

/// B's one try, once everything else is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BTry {
    /// Not tried yet.
    Waiting,
    /// Granted: the key was free.
    Granted,
    /// Refused: the key was held.
    Refused,
}

/// The interesting paths, recorded when they are taken (for the
/// `sometimes` properties).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Reached {
    /// A's release after the loss found S's grant and deleted it.
    pub deleted_late_grant: bool,
    /// The fence's signal rolled S back while it waited for the row lock.
    pub aborted_waiting: bool,
    /// The fence's termination ended P1 with S still in the network.
    pub never_read: bool,
    /// The fence's termination came while S was committing: P1 ended only
    /// after the commit.
    pub commit_before_exit: bool,
    /// A retry after the loss found S's grant its own.
    pub retry_found_own: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LateStatementState {
    /// The key's lease row.
    pub key: Holder,
    /// A third party's transaction holds the key's row lock (held at the
    /// start, released at any step).
    pub row_locked: bool,
    /// A1's grant statement S.
    pub statement: Statement,
    /// The backend P1 serving C1.
    pub backend: Backend,
    /// A fence signal sent and not yet acted on by the server (only with
    /// signals in flight).
    pub signal: Option<Signal>,
    /// Client A.
    pub client: Client,
    /// A's fence of C1.
    pub fence: Fence,
    /// B's try.
    pub b: BTry,
    /// The paths taken so far.
    pub reached: Reached,
}

impl LateStatementState {
    /// Whether nobody holds the key's row lock: neither the third party
    /// nor P1 committing S.
    pub fn row_free(&self) -> bool {
        !self.row_locked && self.statement != Statement::Committing
    }

    /// Whether A1's token holds the key although A is done with A1: a
    /// grant nobody tracks, held while A's session lives.
    pub fn revived(&self) -> bool {
        self.client.done() && self.key == Holder::A1
    }

    /// Whether every client that counts itself the holder has its token in
    /// the key's row (so at most one does).
    pub fn one_holder(&self) -> bool {
        (self.client != Client::Holding || self.key == Holder::A1) && (self.b != BTry::Granted || self.key == Holder::B)
    }
}

impl fmt::Display for LateStatementState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lock = if self.row_locked { "locked by the third party" } else { "unlocked" };
        write!(f, "key {:?} (row {lock}); S {:?}; P1 {:?}", self.key, self.statement, self.backend)?;
        if let Some(signal) = self.signal {
            write!(f, " ({signal:?} on its way)")?;
        }
        write!(f, "; A {:?}, fence {:?}; B {:?}", self.client, self.fence, self.b)
    }
}
