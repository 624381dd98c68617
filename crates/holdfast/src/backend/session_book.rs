//! What a client of a SQL store remembers of its session rows (issue 33,
//! item 4): the session each lease TTL is granted under, until when it
//! knows each one unexpired (counted from the send of the statement that
//! made or extended it), which of its leases live with which session, and
//! the removals of other clients it accounted for. PostgreSQL (model
//! `pg_session`) and MySQL/MariaDB (model `mysql_session`) keep the same
//! book; only their statements differ.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::backend::RenewRequest;
use crate::vocabulary::key::OwnerToken;

/// A session row's id: 16 random bytes, new for every session.
pub(crate) type SessionId = [u8; 16];

/// The leases of a renewal that live with one session: the session, the
/// longest TTL asked for among them, their indices in the renewal.
pub(crate) type SessionLeases = (SessionId, Duration, Vec<usize>);

/// The session an acquire names (see [`SessionBook::choose`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionChoice {
    /// The current session, known unexpired until `until`.
    Lean { id: SessionId, until: Instant },
    /// The current session, read and extended or replaced by the statement
    /// (`fresh`: the id of a new one).
    Full { current: SessionId, fresh: SessionId },
}

/// What a client remembers of its sessions.
#[derive(Debug, Default)]
pub(crate) struct SessionBook {
    /// The session each lease TTL (ms) is granted under now.
    current: HashMap<i64, SessionId>,
    /// Per session, the `removed` count this client accounted for.
    seen: HashMap<SessionId, i64>,
    /// The session each of this client's session-bound leases lives with.
    leases: HashMap<OwnerToken, SessionId>,
    /// Per session, until when this client knows it is unexpired: counted
    /// from the send of the statement that last made or extended it (the
    /// server set its expiry after that send), so never later than the
    /// server's expiry (model `pg_session`, variant `LeanCountedFromReply`:
    /// counted from the reply it would be).
    known: HashMap<SessionId, Instant>,
    /// `seen` is pruned when it grows past this (then set to twice what
    /// is left): a pass over every lease, so not at every grant.
    seen_limit: usize,
}

impl SessionBook {
    /// The session an acquire of `ttl` sent at `now` names: on the lean
    /// path the current session, known unexpired until a time that leaves
    /// two thirds of the TTL (the acquire reads nothing of the session row,
    /// and the grant is valid until then); else the current session and a
    /// new id to make one under if it lapsed (or is none yet).
    pub(crate) fn choose(&self, ttl: Duration, now: Instant) -> SessionChoice {
        let current = self.current.get(&(ttl.as_millis() as i64)).copied();
        let known = current.and_then(|id| Some((id, *self.known.get(&id)?)));
        match known {
            Some((id, until)) if until.saturating_duration_since(now) * 3 >= ttl * 2 => {
                SessionChoice::Lean { id, until }
            }
            _ => {
                let fresh: SessionId = rand::random();
                SessionChoice::Full { current: current.unwrap_or(fresh), fresh }
            }
        }
    }

    /// `session` is known unexpired until `until` (a statement sent before
    /// then made or extended it).
    pub(crate) fn known_until(&mut self, session: SessionId, until: Instant) {
        let at = self.known.entry(session).or_insert(until);
        *at = (*at).max(until);
    }

    /// After an acquire statement: the session it used is the current one
    /// of its TTL (a new one starts at count 0), and `granted` lives with
    /// it.
    pub(crate) fn used(&mut self, ttl_ms: i64, session: SessionId, granted: Option<OwnerToken>) {
        if self.current.insert(ttl_ms, session) != Some(session) {
            self.seen.entry(session).or_insert(0);
        }
        if let Some(token) = granted {
            self.leases.insert(token, session);
        }
        // Sessions nobody lives with any more are forgotten (a client
        // idle for a TTL starts a new session at its next grant).
        if self.seen.len() > self.seen_limit {
            let live: std::collections::HashSet<SessionId> =
                self.leases.values().chain(self.current.values()).copied().collect();
            self.seen.retain(|id, _| live.contains(id));
            self.known.retain(|id, _| live.contains(id));
            self.seen_limit = 2 * self.seen.len() + 8;
        }
    }

    /// The session `token`'s lease lives with, if it is one of this
    /// client's session-bound leases.
    pub(crate) fn session_of(&self, token: OwnerToken) -> Option<SessionId> {
        self.leases.get(&token).copied()
    }

    /// `leases` of a renewal grouped by the session each lives with (with
    /// the longest TTL asked for among them and their indices), and the
    /// indices of the others (leases of their own expiry: shares, writers,
    /// rows of earlier versions, or lost).
    pub(crate) fn group(&self, leases: &[RenewRequest]) -> (Vec<SessionLeases>, Vec<usize>) {
        let mut by_session: Vec<SessionLeases> = Vec::new();
        let mut own_expiry = Vec::new();
        for (i, lease) in leases.iter().enumerate() {
            match self.session_of(lease.token) {
                // A client has a session per TTL: a handful, so a scan.
                Some(id) => match by_session.iter_mut().find(|(s, _, _)| *s == id) {
                    Some((_, ttl, at)) => {
                        *ttl = (*ttl).max(lease.ttl);
                        at.push(i);
                    }
                    None => by_session.push((id, lease.ttl, vec![i])),
                },
                None => own_expiry.push(i),
            }
        }
        (by_session, own_expiry)
    }

    /// The sessions a release of `token` by this client may find its row
    /// in: its lease's, or for a token the book does not know (an acquire
    /// whose caller gave up before its answer was read) the current ones;
    /// a row of any other session is another client's, and its removal is
    /// counted. Only PostgreSQL's releases ask.
    #[cfg(any(test, feature = "postgres"))]
    pub(crate) fn own_sessions_for(&self, token: OwnerToken) -> Vec<Vec<u8>> {
        match self.leases.get(&token) {
            Some(id) => vec![id.to_vec()],
            None => self.current.values().map(|id| id.to_vec()).collect(),
        }
    }

    /// The `removed` count accounted for in `session`.
    pub(crate) fn seen(&self, session: &SessionId) -> i64 {
        self.seen.get(session).copied().unwrap_or(0)
    }

    /// After a renewal found the count of `session` at `removed` and read
    /// which of its rows are left (`left`): the leases not among them are
    /// forgotten, and the count is accounted for.
    pub(crate) fn settle(&mut self, session: SessionId, removed: i64, left: &[Vec<u8>]) {
        // A set: a session may hold every one of 100,000 leases.
        let left: std::collections::HashSet<&[u8]> = left.iter().map(Vec::as_slice).collect();
        self.leases.retain(|token, id| *id != session || left.contains(token.to_bytes().as_slice()));
        self.seen.insert(session, removed);
    }

    /// Forgets every lease of `session` (it lapsed).
    pub(crate) fn lapsed(&mut self, session: SessionId) {
        self.leases.retain(|_, id| *id != session);
        self.seen.remove(&session);
        self.known.remove(&session);
        self.current.retain(|_, id| *id != session);
    }

    /// Forgets `token`'s lease (released).
    pub(crate) fn released(&mut self, token: OwnerToken) {
        self.leases.remove(&token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(n: u8) -> OwnerToken {
        OwnerToken::from_bytes([n; 16])
    }

    fn full(book: &SessionBook, ttl_ms: u64) -> (SessionId, SessionId) {
        match book.choose(Duration::from_millis(ttl_ms), Instant::now()) {
            SessionChoice::Full { current, fresh } => (current, fresh),
            lean => panic!("lean without a known expiry: {lean:?}"),
        }
    }

    #[test]
    fn the_book_follows_grants_removals_and_lapses() {
        let mut book = SessionBook::default();
        let (first, fresh) = full(&book, 6000);
        assert_eq!(first, fresh, "no session yet: the acquire makes one");
        book.used(6000, fresh, Some(token(1)));
        book.used(6000, fresh, Some(token(2)));
        let (current, other) = full(&book, 6000);
        assert_eq!(current, fresh);
        assert_ne!(other, fresh);
        assert_eq!(book.session_of(token(1)), Some(fresh));
        assert_eq!(book.own_sessions_for(token(1)), vec![fresh.to_vec()]);
        assert_eq!(book.own_sessions_for(token(9)), vec![fresh.to_vec()], "an unknown token: the current sessions");
        // Token 2's row was removed by someone else.
        book.settle(fresh, 1, &[token(1).to_bytes().to_vec()]);
        assert_eq!(book.session_of(token(2)), None);
        assert_eq!(book.seen(&fresh), 1);
        book.lapsed(fresh);
        assert_eq!(book.session_of(token(1)), None);
        assert_ne!(full(&book, 6000).0, fresh, "a lapsed session is never used again");
    }

    #[test]
    fn a_renewal_is_grouped_by_session_with_the_longest_ttl() {
        let mut book = SessionBook::default();
        let (_, a) = full(&book, 6000);
        book.used(6000, a, Some(token(1)));
        book.used(6000, a, Some(token(2)));
        let (_, b) = full(&book, 3000);
        book.used(3000, b, Some(token(3)));
        let key = crate::vocabulary::key::LockKey::new("k").expect("key");
        let lease = |n: u8, ms: u64| RenewRequest { key: key.clone(), token: token(n), ttl: Duration::from_millis(ms) };
        let leases = [lease(1, 6000), lease(4, 6000), lease(3, 3000), lease(2, 7000)];
        let (by_session, own_expiry) = book.group(&leases);
        assert_eq!(
            by_session,
            vec![(a, Duration::from_millis(7000), vec![0, 3]), (b, Duration::from_millis(3000), vec![2])]
        );
        assert_eq!(own_expiry, vec![1], "a token the book does not know keeps its own expiry");
    }

    #[test]
    fn the_lean_path_needs_two_thirds_of_the_ttl_on_the_clients_own_count() {
        let ttl = Duration::from_secs(6);
        let sent = Instant::now();
        let lean = |book: &SessionBook, ttl: Duration, now: Instant| match book.choose(ttl, now) {
            SessionChoice::Lean { id, until } => Some((id, until)),
            SessionChoice::Full { .. } => None,
        };
        let mut book = SessionBook::default();
        assert_eq!(lean(&book, ttl, sent), None, "no session yet");
        let (_, id) = full(&book, 6000);
        book.used(6000, id, Some(token(1)));
        assert_eq!(lean(&book, ttl, sent), None, "a session whose time left is not known");
        book.known_until(id, sent + ttl);
        assert_eq!(lean(&book, ttl, sent + Duration::from_secs(2)), Some((id, sent + ttl)), "4 s of 6 left");
        assert_eq!(lean(&book, ttl, sent + Duration::from_millis(2001)), None, "less than 4 s left");
        assert_eq!(lean(&book, Duration::from_secs(3), sent), None, "another TTL has its own session");
        book.known_until(id, sent + Duration::from_secs(1));
        assert_eq!(lean(&book, ttl, sent), Some((id, sent + ttl)), "an earlier count never shortens a later one");
        book.lapsed(id);
        assert_eq!(lean(&book, ttl, sent), None, "a lapsed session is never used again");
    }
}
