//! Exclusive leases that live with their client's session row, so that
//! renewal writes one row per client and TTL instead of one per lease
//! (issue 33; model `pg_session` in holdfast-models, under `READ
//! COMMITTED`).
//!
//! A client keeps a session row per lease TTL in `<table>_sess`. A mutex
//! grant names it in the lease row's `session` and sets the row's
//! `expires_at` to infinity: the row is held while the session row is
//! unexpired ([`until_sql`]), and a client of an earlier version, which
//! reads `expires_at` alone, sees it held and never takes it. Shares,
//! writers and rows of earlier versions have no session and keep their own
//! expiry.
//!
//! The rules, each one a counterexample in model `pg_session` (or model 9,
//! `sql_session`) when left out:
//!
//! - A row whose session lapsed is taken over only after an `UPDATE` of that
//!   session row counts the removal under the row's lock and re-checks that
//!   it lapsed on its latest version: a renewal in flight commits first,
//!   and the takeover then finds it renewed. The statement snapshot alone
//!   would take a session a renewal had just extended.
//! - A lapsed session is never extended again (every extension requires
//!   `expires_at > now()`): the client's next grant makes a new session
//!   under a new id.
//! - Whoever removes another client's held row counts it in the row's
//!   session (`removed`): a takeover, a forced release, a release by a
//!   client that does not own the session, the sweep.
//! - A renewal that finds the count moved reads which rows of the session
//!   are left in a second statement, whose snapshot is taken after the
//!   renewal's commit: the count is read on the session row's latest
//!   version, and rows read in the renewal's own snapshot can predate the
//!   removal it counted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::vocabulary::key::OwnerToken;

/// The token of the released marker: a released lease row stays, so that
/// the key's fence stays with it. It keeps the session it was held under:
/// the session index's column then does not change when the same session
/// takes the key again, so the grant and the release are HOT updates (they
/// were not, and each cost three times the server time: an index entry a
/// statement; docs/performance.md). A released row is read by its own
/// expiry, whatever its session.
pub(super) const RELEASED: &str = "'\\x'::bytea";

/// The session lease row `alias` is held under: none for a released row
/// (its `session` is only left in place, see [`RELEASED`]).
pub(super) fn held_session_sql(alias: &str) -> String {
    format!("(CASE WHEN {alias}.token = {RELEASED} THEN NULL ELSE {alias}.session END)")
}

/// A session row's id: 16 random bytes, new for every session.
pub(super) type SessionId = [u8; 16];

/// When the lease row `alias` of lease table `t`'s namespace is held until:
/// its session row's expiry (`-infinity` once that row is gone), or its own
/// `expires_at` without a session or once released. `ss` is the quoted
/// session table.
pub(super) fn until_sql(alias: &str, ss: &str) -> String {
    format!(
        "(CASE WHEN {alias}.session IS NULL OR {alias}.token = {RELEASED} THEN {alias}.expires_at
               ELSE coalesce((SELECT x.expires_at FROM {ss} x WHERE x.id = {alias}.session), timestamptz '-infinity')
          END)"
    )
}

/// The session an acquire names (see [`SessionBook::choose`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SessionChoice {
    /// The current session, known unexpired until `until`.
    Lean { id: SessionId, until: Instant },
    /// The current session, read and extended or replaced by the statement
    /// (`fresh`: the id of a new one).
    Full { current: SessionId, fresh: SessionId },
}

/// What a client remembers of its sessions.
#[derive(Debug, Default)]
pub(super) struct SessionBook {
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
    pub(super) fn choose(&self, ttl: Duration, now: Instant) -> SessionChoice {
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
    pub(super) fn known_until(&mut self, session: SessionId, until: Instant) {
        let at = self.known.entry(session).or_insert(until);
        *at = (*at).max(until);
    }

    /// After an acquire statement: the session it used is the current one
    /// of its TTL (a new one starts at count 0), and `granted` lives with
    /// it.
    pub(super) fn used(&mut self, ttl_ms: i64, session: SessionId, granted: Option<OwnerToken>) {
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
    pub(super) fn session_of(&self, token: OwnerToken) -> Option<SessionId> {
        self.leases.get(&token).copied()
    }

    /// The sessions a release of `token` by this client may find its row
    /// in: its lease's, or for a token the book does not know (an acquire
    /// whose caller gave up before its answer was read) the current ones;
    /// a row of any other session is another client's, and its removal is
    /// counted.
    pub(super) fn own_sessions_for(&self, token: OwnerToken) -> Vec<Vec<u8>> {
        match self.leases.get(&token) {
            Some(id) => vec![id.to_vec()],
            None => self.current.values().map(|id| id.to_vec()).collect(),
        }
    }

    /// The `removed` count accounted for in `session`.
    pub(super) fn seen(&self, session: &SessionId) -> i64 {
        self.seen.get(session).copied().unwrap_or(0)
    }

    /// After a renewal found the count of `session` at `removed` and read
    /// which of its rows are left (`left`): the leases not among them are
    /// forgotten, and the count is accounted for.
    pub(super) fn settle(&mut self, session: SessionId, removed: i64, left: &[Vec<u8>]) {
        // A set: a session may hold every one of 100,000 leases.
        let left: std::collections::HashSet<&[u8]> = left.iter().map(Vec::as_slice).collect();
        self.leases.retain(|token, id| *id != session || left.contains(token.to_bytes().as_slice()));
        self.seen.insert(session, removed);
    }

    /// Forgets every lease of `session` (it lapsed).
    pub(super) fn lapsed(&mut self, session: SessionId) {
        self.leases.retain(|_, id| *id != session);
        self.seen.remove(&session);
        self.known.remove(&session);
        self.current.retain(|_, id| *id != session);
    }

    /// Forgets `token`'s lease (released).
    pub(super) fn released(&mut self, token: OwnerToken) {
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
