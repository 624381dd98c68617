//! The state of the pooled-loss model: the session rows of client A (its
//! old session, the new one the rotation starts, the one a late statement
//! may make for itself), the lease rows of keys K, K2 and K3, A's lost
//! statement S and its second attempt S2, A's book and rotation, and what
//! B took.

use std::fmt;

/// A session row of client A.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Session {
    /// `s_old`: A's session before the loss, live until the rotation ends it.
    Old,
    /// `s_new`: the session the rotation starts, live once created.
    New,
    /// The session a late S on the full path makes for itself when it finds
    /// `s_old` lapsed (the statement's own new id, which A never learns
    /// unless a retry's answer names it): nobody renews it, so it lapses
    /// within a TTL.
    Fresh,
}

/// The fresh session's row (see [`Session::Fresh`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FreshRow {
    /// Not made.
    Absent,
    /// Made by S and unexpired.
    Live,
    /// Expired: nobody renewed it.
    Lapsed,
}

/// A key's lease row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Row {
    /// Free: no row, or a released one.
    Free,
    /// Held by A's token for the key (t for K, t2 for K2, t3 for K3) under
    /// one of A's sessions.
    A(Session),
    /// Held by B (under B's live session).
    B,
}

/// One of the keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// The key of the lost statement S (token t).
    K,
    /// Held by A under `s_old` before the loss (token t2).
    K2,
    /// The key of S2, A's attempt in flight on a live connection (token t3).
    K3,
}

/// Where the lost statement S is: model 18's stages (in the network, or
/// here the pooler; waiting for K's row lock; committing; applied, granted
/// or regranted or not; rolled back or never read).
pub use crate::sql_late_statement::Statement as Stage;

/// What A's book says of one of its attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Book {
    /// The statement is in flight, its answer not read.
    Waiting,
    /// The statement's connection was lost: the outcome unknown.
    Lost,
    /// A holds the key, under this session (the one the answer named).
    Holding(Session),
    /// A released the token.
    Released,
    /// Answered "busy": A tracks nothing.
    Refused,
}

impl Book {
    /// Whether A is done with the attempt and tracks nothing of it.
    pub fn done(self) -> bool {
        matches!(self, Self::Released | Self::Refused)
    }
}

/// The interesting paths, recorded when taken (for the `sometimes`
/// properties).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Reached {
    /// S granted K after `s_old` was ended.
    pub s_after_end: bool,
    /// B took K over from the row S wrote after `s_old` was ended.
    pub late_taken_over: bool,
    /// The cleanup release deleted the row S wrote.
    pub cleanup_deleted: bool,
    /// The retry found S's row its own (a regrant).
    pub retry_regranted: bool,
    /// S, applied late, found the retry's row under `s_new` its own.
    pub late_regrant: bool,
    /// S2 was answered "granted" during the rotation's wait.
    pub s2_in_wait: bool,
    /// ... and the migration then moved K3.
    pub s2_migrated: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PooledLossState {
    /// S takes the full path (it reads `s_old`'s row and makes its own
    /// session if that lapsed) rather than the lean one (it names `s_old`
    /// as it is).
    pub s_full: bool,
    /// `s_old`'s row was set expired (step 4).
    pub old_ended: bool,
    /// `s_new`'s row exists.
    pub new_live: bool,
    /// The row S may make for itself.
    pub fresh: FreshRow,
    /// K's lease row.
    pub k: Row,
    /// K2's lease row.
    pub k2: Row,
    /// K3's lease row.
    pub k3: Row,
    /// A third party's transaction holds K's row lock (from the start until
    /// any step).
    pub row_locked: bool,
    /// The lost statement S.
    pub s: Stage,
    /// S2 has applied: `Some(granted)`.
    pub s2: Option<bool>,
    /// A's book of S's attempt (token t).
    pub book_k: Book,
    /// A's book of K2 (token t2).
    pub book_k2: Book,
    /// A's book of S2 (token t3).
    pub book_k3: Book,
    /// `s_old` is retiring (step 1): attempts from now choose `s_new`.
    pub retiring: bool,
    /// The migration ran (step 3).
    pub migrated: bool,
    /// The paths taken so far.
    pub reached: Reached,
}

impl PooledLossState {
    /// Whether `session`'s row is unexpired now.
    pub fn live(&self, session: Session) -> bool {
        match session {
            Session::Old => !self.old_ended,
            Session::New => self.new_live,
            Session::Fresh => self.fresh == FreshRow::Live,
        }
    }

    /// Whether A keeps `session` unexpired: `s_old` until it is ended,
    /// `s_new`, and the fresh session only while A's book holds a lease
    /// under it (else nobody renews it and it lapses within a TTL).
    pub fn kept(&self, session: Session) -> bool {
        self.live(session) && (session != Session::Fresh || self.books().contains(&Book::Holding(Session::Fresh)))
    }

    /// Whether S's own session is live and nobody renews it (it lapses at a
    /// later step).
    pub fn orphan_live(&self) -> bool {
        self.fresh == FreshRow::Live && !self.kept(Session::Fresh)
    }

    /// A's three books.
    pub fn books(&self) -> [Book; 3] {
        [self.book_k, self.book_k2, self.book_k3]
    }

    /// A key's row.
    pub fn row(&self, key: Key) -> Row {
        match key {
            Key::K => self.k,
            Key::K2 => self.k2,
            Key::K3 => self.k3,
        }
    }

    /// A key's row, to write.
    pub fn row_mut(&mut self, key: Key) -> &mut Row {
        match key {
            Key::K => &mut self.k,
            Key::K2 => &mut self.k2,
            Key::K3 => &mut self.k3,
        }
    }

    /// A's book of a key.
    pub fn book(&self, key: Key) -> Book {
        match key {
            Key::K => self.book_k,
            Key::K2 => self.book_k2,
            Key::K3 => self.book_k3,
        }
    }

    /// Whether any client may take the row: free, or held under a lapsed
    /// session (a takeover).
    pub fn takeable(&self, row: Row) -> bool {
        match row {
            Row::Free => true,
            Row::A(session) => !self.live(session),
            Row::B => false,
        }
    }

    /// Nobody holds K's row lock: neither the third party nor S committing.
    pub fn k_unlocked(&self) -> bool {
        !self.row_locked && self.s != Stage::Committing
    }

    /// The first key A's book says A holds whose row is not A's under a
    /// session A keeps (so another client may hold it or take it over).
    pub fn double_held(&self) -> Option<Key> {
        [Key::K, Key::K2, Key::K3].into_iter().find(|&key| {
            matches!(self.book(key), Book::Holding(_)) && !matches!(self.row(key), Row::A(s) if self.kept(s))
        })
    }

    /// Whether K's row is held by t under a session A keeps although A is
    /// done with t: a grant nobody tracks, held for as long as A lives.
    pub fn revived(&self) -> bool {
        self.book_k.done() && matches!(self.k, Row::A(s) if self.kept(s))
    }

    /// Whether B can have K: it is free, taken over, or B's already.
    pub fn k_free_to_b(&self) -> bool {
        self.k == Row::B || self.takeable(self.k)
    }

    /// Whether A still holds K2 under a session it keeps.
    pub fn k2_kept(&self) -> bool {
        matches!(self.book_k2, Book::Holding(_)) && matches!(self.k2, Row::A(s) if self.kept(s))
    }
}

impl fmt::Display for PooledLossState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let old = if self.old_ended { "ended" } else { "live" };
        let new = if self.new_live { "live" } else { "absent" };
        let lock = if self.row_locked { " (row locked by a third party)" } else { "" };
        write!(
            f,
            "s_old {old}, s_new {new}, fresh {:?}; K {:?}{lock}, K2 {:?}, K3 {:?}; ",
            self.fresh, self.k, self.k2, self.k3
        )?;
        let path = if self.s_full { "full" } else { "lean" };
        write!(
            f,
            "S {:?} ({path}), S2 {:?}; A: K {:?}, K2 {:?}, K3 {:?}",
            self.s, self.s2, self.book_k, self.book_k2, self.book_k3
        )?;
        let step = match (self.retiring, self.migrated, self.old_ended) {
            (false, _, _) => "none",
            (true, false, false) => "s_old retiring",
            (true, true, false) => "migrated",
            (true, false, true) => "s_old ended, unmigrated",
            (true, true, true) => "migrated, s_old ended",
        };
        write!(f, "; rotation: {step}")
    }
}
