//! Leases that live with their client's session row, so that renewal writes
//! one row per client and period instead of one per lease.
//!
//! Each client (one [`SqliteBackend`](super::SqliteBackend) and its clones)
//! keeps a session row per lease TTL in `holdfast_sessions`. A held grant
//! row names the session it lives with (`session`), and is held while that
//! row's `expires_at_ms` is ahead of the host clock (`live_until!`);
//! reservations and rows written before this layout have no session and
//! keep their own expiry (`until_ms`). Renewal extends the session rows of
//! the TTLs it renews, one statement each, whatever the number of leases.
//!
//! The rules, each one a counterexample in `holdfast-models`' model 9
//! (`sql_session`) when left out:
//!
//! - A lapsed session is never extended again (every extension requires
//!   `expires_at_ms` ahead of the clock): the client's next grant starts a
//!   new session under a new id, and the client remembers which session
//!   each of its grants lives with ([`SessionBook`]), so a lease of the old
//!   one is reported lost even while the new one lives.
//! - Whoever removes another client's held row counts it in that row's
//!   session (`removed`): a forced release, a release by another client
//!   that knows the token, and a grant that passes over a row whose session
//!   lapsed (which it deletes). A host clock stepped back
//!   can make a lapsed session look live again, and the count is then what
//!   tells its client that the row was taken.
//! - A renewal that finds the count moved reads which rows of the session
//!   are left and forgets every lease of the session that is gone, not only
//!   the ones it renews.

use std::collections::{HashMap, HashSet};

use rusqlite::{Connection, OptionalExtension, params};

use crate::vocabulary::key::OwnerToken;

/// A session row's id: 16 random bytes, new for every session.
pub(super) type SessionId = [u8; 16];

/// When a row is held until, in host-clock milliseconds: its session row's
/// expiry (0 once that row is gone), or its own `until_ms` without a
/// session. An SQL expression over `holdfast_grants`, as a literal for
/// `concat!`.
macro_rules! live_until {
    () => {
        "(CASE WHEN holdfast_grants.session IS NULL THEN holdfast_grants.until_ms \
          ELSE COALESCE((SELECT s.expires_at_ms FROM holdfast_sessions s \
                          WHERE s.id = holdfast_grants.session), 0) END)"
    };
}
pub(super) use live_until;

/// What a client remembers of its sessions.
#[derive(Debug, Default)]
pub(super) struct SessionBook {
    /// The session of each lease TTL (ms) this client grants under.
    current: HashMap<i64, Current>,
    /// The session each lease this client was granted lives with.
    leases: HashMap<OwnerToken, SessionId>,
}

/// A client's session for one TTL, as far as it has committed it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Current {
    id: SessionId,
    /// The session row's `removed` count this client has accounted for.
    seen_removed: i64,
    /// The session row's expiry as this client last committed it: only its
    /// client moves it (others count removals or delete a row that lapsed
    /// a minute before on the same host clock), so it is the row's.
    expires: i64,
}

impl SessionBook {
    /// After the grant's transaction committed: the session as [`bind`]
    /// left it, and `token`'s grant living with it.
    pub(super) fn granted(&mut self, ttl_ms: i64, session: Current, token: OwnerToken) {
        self.current.insert(ttl_ms, session);
        self.leases.insert(token, session.id);
    }

    /// Whether `token`'s grant in session `id` is one of this client's.
    pub(super) fn owns(&self, token: OwnerToken, id: &[u8]) -> bool {
        self.leases.get(&token).is_some_and(|mine| mine.as_slice() == id)
    }

    /// When this client's session `id` ends, if it is a current one.
    pub(super) fn expiry_of(&self, id: &[u8]) -> Option<i64> {
        self.current.values().find(|c| c.id.as_slice() == id).map(|c| c.expires)
    }

    /// Forgets `token`'s grant (released).
    pub(super) fn released(&mut self, token: OwnerToken) {
        self.leases.remove(&token);
    }
}

impl Current {
    /// The session's id.
    pub(super) fn id(&self) -> SessionId {
        self.id
    }

    /// The session's expiry (host-clock ms).
    pub(super) fn expires(&self) -> i64 {
        self.expires
    }
}

/// The client's session for leases of `ttl_ms`, live for at least two
/// thirds of the TTL from `now`: the current one, extended to `ttl_ms` from
/// now if less is left, or a new one. Runs inside the caller's write
/// transaction, and returns the session as it will stand once that
/// commits, for [`SessionBook::granted`] (never before: a rolled-back
/// extension must not be remembered).
///
/// Extending only below two thirds keeps the session row out of most
/// grants' transactions (renewal extends it every third of the TTL); the
/// grant is then valid until the session's expiry, which the caller reports
/// as the grant's validity.
pub(super) fn bind(tx: &Connection, book: &SessionBook, ttl_ms: i64, now: i64) -> rusqlite::Result<Current> {
    if let Some(cur) = book.current.get(&ttl_ms).copied() {
        if cur.expires > now + ttl_ms * 2 / 3 {
            return Ok(cur);
        }
        if cur.expires > now {
            let extended = tx
                .prepare_cached("UPDATE holdfast_sessions SET expires_at_ms = ?2 WHERE id = ?1 AND expires_at_ms > ?3")?
                .execute(params![cur.id, now + ttl_ms, now])?;
            if extended == 1 {
                return Ok(Current { expires: now + ttl_ms, ..cur });
            }
        }
        // Lapsed (or its row is gone): never extended again.
    }
    let id: SessionId = rand::random();
    tx.prepare_cached("INSERT INTO holdfast_sessions (id, expires_at_ms, removed) VALUES (?1, ?2, 0)")?
        .execute(params![id, now + ttl_ms])?;
    Ok(Current { id, seen_removed: 0, expires: now + ttl_ms })
}

/// Counts the removal of a held row of session `id` by someone other than
/// its client (see the module docs).
pub(super) fn count_removal(tx: &Connection, id: &[u8]) -> rusqlite::Result<()> {
    tx.prepare_cached("UPDATE holdfast_sessions SET removed = removed + 1 WHERE id = ?1")?.execute(params![id])?;
    Ok(())
}

/// Extends the sessions of the listed leases' TTLs (one statement per TTL)
/// and says per lease whether it is still held: its session is the live
/// current one of its TTL and no one removed its row.
pub(super) fn renew(
    conn: &mut Connection,
    book: &mut SessionBook,
    leases: &[(OwnerToken, i64)],
    now: i64,
) -> rusqlite::Result<Vec<bool>> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let mut ttls: Vec<i64> = leases.iter().map(|(_, ttl)| *ttl).collect();
    ttls.sort_unstable();
    ttls.dedup();
    let mut live: HashMap<i64, Current> = HashMap::with_capacity(ttls.len());
    for ttl in ttls {
        let Some(cur) = book.current.get(&ttl).copied() else { continue };
        let removed: Option<i64> = tx
            .prepare_cached(
                "UPDATE holdfast_sessions SET expires_at_ms = max(expires_at_ms, ?2)
                  WHERE id = ?1 AND expires_at_ms > ?3 RETURNING removed",
            )?
            .query_row(params![cur.id, now + ttl, now], |r| r.get(0))
            .optional()?;
        // Lapsed: every lease of it is lost.
        let Some(removed) = removed else { continue };
        let mut cur = Current { expires: cur.expires.max(now + ttl), ..cur };
        if removed != cur.seen_removed {
            let mut left = HashSet::new();
            {
                let mut stmt =
                    tx.prepare_cached("SELECT token FROM holdfast_grants WHERE session = ?1 AND held = 1")?;
                let mut q = stmt.query(params![cur.id])?;
                while let Some(r) = q.next()? {
                    left.insert(r.get::<_, Vec<u8>>(0)?);
                }
            }
            // Forgetting leases that are gone is right whether or not this
            // transaction commits.
            book.leases.retain(|token, id| *id != cur.id || left.contains(token.to_bytes().as_slice()));
            cur.seen_removed = removed;
        }
        live.insert(ttl, cur);
    }
    tx.commit()?;
    book.current.extend(live.iter().map(|(ttl, cur)| (*ttl, *cur)));
    Ok(leases
        .iter()
        .map(|(token, ttl)| live.get(ttl).is_some_and(|cur| book.leases.get(token) == Some(&cur.id)))
        .collect())
}

/// Part of a release's sweep: deletes up to `limit` of the sessions that
/// lapsed before `cut` and hold no rows (clients that released everything
/// and went: one CLI run leaves one), and up to `limit` rows of one that
/// lapsed holding some (a client that crashed), whose session row goes at a
/// later sweep.
pub(super) fn sweep(tx: &Connection, cut: i64, limit: i64) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "DELETE FROM holdfast_sessions WHERE id IN
           (SELECT s.id FROM holdfast_sessions s WHERE s.expires_at_ms < ?1
               AND NOT EXISTS (SELECT 1 FROM holdfast_grants g WHERE g.session = s.id) LIMIT ?2)",
    )?
    .execute(params![cut, limit])?;
    // Read as bytes of any length: a row some other tool wrote must not
    // stop every release's sweep.
    let holding: Option<Vec<u8>> = tx
        .prepare_cached("SELECT id FROM holdfast_sessions WHERE expires_at_ms < ?1 LIMIT 1")?
        .query_row(params![cut], |r| r.get(0))
        .optional()?;
    let Some(id) = holding else { return Ok(()) };
    tx.prepare_cached(
        "DELETE FROM holdfast_grants WHERE (key, token) IN
           (SELECT key, token FROM holdfast_grants WHERE session = ?1 LIMIT ?2)",
    )?
    .execute(params![id, limit])?;
    count_removal(tx, &id)
}
