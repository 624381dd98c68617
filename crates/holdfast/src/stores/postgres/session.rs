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
//! What the client remembers of its sessions is the SQL stores' shared
//! [`SessionBook`](crate::backend::session_book::SessionBook).
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
