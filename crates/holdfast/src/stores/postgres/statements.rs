//! The text of the PostgreSQL statements of one namespace, and which of
//! them a connection prepares ([`Stmt`]). The calls that send them are in
//! `sql.rs`.
//!
//! Only two identifiers are ever interpolated: the schema and the table name,
//! checked by [`check_ident`](super::config::check_ident) (`[a-z_][a-z0-9_]*`)
//! and double-quoted. Keys, tokens, labels, TTLs and the channel name are
//! always bind parameters.

use super::acquire_sql::{GRANT_COLUMNS, LEAN_SESSION_COLUMNS, RUN_AGAIN, SESSION_COLUMNS, acquire_sql, grant_ctes};
use super::config::PostgresConfig;
use super::release_sql::release_sql;
pub(super) use super::session::RELEASED;
use super::session::until_sql;

/// The SQL of one namespace (schema + table).
#[derive(Debug, Clone)]
pub(super) struct Statements {
    /// `"schema"."table"` as text, for `to_regclass`.
    pub lease_regclass: String,
    /// `"schema"."table_fence"` as text, for `to_regclass`.
    pub fence_regclass: String,
    /// `"schema"."table_shares"` as text, for `to_regclass`.
    pub shares_regclass: String,
    /// `"schema"."table_records"` as text, for `to_regclass`.
    pub records_regclass: String,
    /// `"schema"."table_sess"` as text, for `to_regclass`.
    pub sessions_regclass: String,
    /// The calls of the functions of shared leases (see `share_fns`).
    pub fns: super::share_fns::Calls,
    /// The namespace's DDL: the whole (creates, or migrates a namespace of
    /// an earlier version), and the additions that take no table lock.
    pub create: super::ddl::Ddl,
    /// `$1 key, $2 token, $3 ttl_ms, $4 label, $5 register (bool), $6 others wait (bool),
    /// $7 fence floor, $8 the client's session, $9 a new session id` ->
    /// `(granted fence, own fence, holder ms left, registered, run again,
    /// ms the grant is valid for, the session used)`.
    pub acquire: String,
    /// The first attempt of a task not registered as a waiter: `$1 key, $2
    /// token, $3 ttl_ms, $4 label, $5 the row starts wanted (bool), $6 floor,
    /// $7 session, $8 new session id` -> the columns of `acquire` (never
    /// registered): `acquire` without `w` (the caller registers and attempts
    /// again with `acquire`), the statement most acquisitions run.
    pub acquire_free: String,
    /// `acquire` on the lean path: the client's own count shows its
    /// session with two thirds of the TTL left, so `$8` names it and the
    /// statement reads and writes nothing of it (no `$9`); the validity
    /// column is a retry's only (a new grant's is the client's count).
    pub acquire_lean: String,
    /// `acquire_free` on the lean path (`$7` the session, no `$8`).
    pub acquire_free_lean: String,
    /// `$1 key, $2 token, $3 channel, $4 the sessions the releasing client
    /// owns the token's row in (a row of any other counts a removal)` ->
    /// one row `(was unexpired, _, the gate is to shrink)` if the token held
    /// the key, a share or a reservation (to shrink after a held share), or
    /// `(false, _, true)` if it held nothing on a key whose row is a gate.
    pub release: String,
    /// `release` with the gate's shrink in the same statement, where the
    /// namespace has its functions: the third column is then never true
    /// (see `release_sql`).
    pub release_shrinking: String,
    /// `$1 keys[], $2 tokens[], $3 ttl_ms[]` -> the 1-based positions renewed,
    /// of rows without a session (shares, writers, earlier versions' rows).
    pub renew: String,
    /// `$1 session, $2 ttl_ms` -> `(removed)` if the session was unexpired
    /// and is extended to the TTL from now.
    pub renew_session: String,
    /// `$1 session` -> `(token)` of each lease row that lives with it.
    pub session_rows: String,
    /// `$1 key` -> `(label, fence, ms left)` of the unexpired exclusive holder.
    pub status: String,
    /// Locks the counter (row 1) for the sweep: a sweep takes the counter
    /// before any lease row, as a grant of a key without a row does.
    pub sweep_lock: String,
    /// Deletes up to 16 rows released or expired more than a minute ago (the
    /// delete trigger raises the counter to each deleted fence); run after
    /// `sweep_lock` in one transaction.
    pub sweep: String,
    /// Releases the rows of up to 16 sessions that lapsed over a minute
    /// ago (a client that crashed), counting each in its session, with the
    /// session's expiry as the rows' (so `sweep`, after it, deletes them);
    /// then deletes up to 64 such sessions that hold no rows.
    pub sweep_sessions: [String; 2],
    /// `$1 key, $2 token, $3 floor` -> `(held)`: the key's fence (in its
    /// lease row) raised to the floor if lower; whether the token holds an
    /// unexpired lease of the key.
    pub raise_fence: String,
    /// `$1 key` -> `(value)` of the record kept with the key, if any.
    pub read_record: String,
    /// `$1 key, $2 token, $3 value` -> `(held)`: the record set to the value
    /// if the token holds an unexpired exclusive lease of the key.
    pub write_record: String,
}

impl Statements {
    /// The SQL of `stmt`.
    pub(super) fn get(&self, stmt: Stmt) -> &str {
        match stmt {
            Stmt::Acquire => &self.acquire,
            Stmt::AcquireFree => &self.acquire_free,
            Stmt::AcquireLean => &self.acquire_lean,
            Stmt::AcquireFreeLean => &self.acquire_free_lean,
            Stmt::Release => &self.release,
            Stmt::ReleaseShrinking => &self.release_shrinking,
            Stmt::Renew => &self.renew,
            Stmt::Status => &self.status,
            Stmt::RaiseFence => &self.raise_fence,
            Stmt::ReadRecord => &self.read_record,
            Stmt::WriteRecord => &self.write_record,
            Stmt::RenewSession => &self.renew_session,
            Stmt::SessionRows => &self.session_rows,
            Stmt::ShrinkGate => &self.fns.shrink_gate,
            Stmt::ShareAcquire => &self.fns.share_acquire,
        }
    }

    pub(super) fn new(config: &PostgresConfig) -> Self {
        // Both names are checked identifiers ([a-z_][a-z0-9_]*), quoted anyway.
        let schema = format!("\"{}\"", config.schema);
        let t = format!("{schema}.\"{}\"", config.table);
        let f = format!("{schema}.\"{}_fence\"", config.table);
        let sh = format!("{schema}.\"{}_shares\"", config.table);
        let r = format!("{schema}.\"{}_records\"", config.table);
        let ss = format!("{schema}.\"{}_sess\"", config.table);
        let until = |alias: &str| until_sql(alias, &ss);
        // The advisory lock only serialises concurrent first-use DDL of this namespace.
        let lock_id = config.namespace_hash() as i64;
        Statements {
            lease_regclass: t.clone(),
            fence_regclass: f.clone(),
            shares_regclass: sh.clone(),
            records_regclass: r.clone(),
            sessions_regclass: ss.clone(),
            fns: super::share_fns::Calls::new(config),
            create: super::ddl::Ddl::new(&config.schema, &config.table, lock_id),
            // cur: the key's lease row, if any, live or not (the statement's
            //    snapshot), its `expires_at` the time it is held until (its
            //    session's expiry, see `session`): a released row stays,
            //    holding the key's fence.
            // own, ext, sess, new: the client's session (`session`): the
            //    current one as the snapshot shows it while two thirds of the
            //    TTL are left; below that extended under its lock, if still
            //    unexpired on its latest version; else a new one. On the
            //    lean path (`acquire_lean`, `acquire_free_lean`) the client's
            //    own count, from the send of what last made or extended the
            //    session, shows two thirds of the TTL left: `sess` is the
            //    session as named, and none of the three runs (model
            //    pg_session: the count is a lower bound of the row's expiry).
            // lapse: if cur's session lapsed, the removal counted in that
            //    session row, under its lock and re-checked on its latest
            //    version: a renewal of it in flight commits first, and then
            //    nothing is taken (model pg_session).
            // f: the namespace counter (row 1), bumped only when cur saw no
            //    row (a key never used, or swept); its row lock is held to
            //    commit, so fences are handed out in commit order.
            // ins: insert with the counter's fence, or, against a row made
            //    since the snapshot, take it over if it is not live (ON
            //    CONFLICT re-checks on the latest row version under its row
            //    lock) with max(its fence + 1, the counter's).
            // up: when cur saw a row, take it over if it is not live, with
            //    its fence + 1 (or the floor), both read on the latest row
            //    version under its row lock (a row with a session only if
            //    `lapse` counted it, or its session row was gone before the
            //    snapshot): the counter is not touched, so
            //    grants of different keys never wait for each other. If the
            //    row went since the snapshot (a sweep), nothing happens and
            //    the last column asks the client to run the statement again
            //    (never an insert with the snapshot's fence: model pg_fence).
            // mine: a retry by the holding token (its first reply was lost):
            //    the same grant, its lease counted from now, as the client
            //    counts it from the retry.
            // w: a waiting attempt that finds the key busy marks the row
            //    `wanted`, so that its release sends a NOTIFY (a release of an
            //    unwanted row sends none: NOTIFY is most of a release's cost).
            //    Runs only when cur found a holder and no mark, re-checked on
            //    the latest row version; 0 rows = the row changed (run again).
            //    A holder's row seen marked is not written: the mark stays
            //    until a grant, which needs this holder's release (it then
            //    notifies, model pg_wakeup) or expiry (the waiter's timer).
            acquire: acquire_sql(&t, &grant_ctes(&t, &f, &ss, ["$6", "$7", "$8", "$9"]), SESSION_COLUMNS),
            acquire_lean: acquire_sql(&t, &grant_ctes(&t, &f, &ss, ["$6", "$7", "$8", ""]), LEAN_SESSION_COLUMNS),
            // `acquire` without `w`.
            acquire_free: format!(
                "{grant}) {GRANT_COLUMNS}, false, {RUN_AGAIN}, {SESSION_COLUMNS}",
                grant = grant_ctes(&t, &f, &ss, ["$5", "$6", "$7", "$8"])
            ),
            acquire_free_lean: format!(
                "{grant}) {GRANT_COLUMNS}, false, {RUN_AGAIN}, {LEAN_SESSION_COLUMNS}",
                grant = grant_ctes(&t, &f, &ss, ["$5", "$6", "$7", ""])
            ),
            // The release, and the same with the gate's shrink: `release_sql`.
            release: release_sql(&t, &sh, &ss, None),
            release_shrinking: release_sql(
                &t,
                &sh,
                &ss,
                Some(&format!("{schema}.\"{}{}\"", config.table, super::share_fns::GATE_FN)),
            ),
            // Shares renew like grants, and move their key's gate row up
            // (the lease row is the gate only while shares hold the key).
            //
            // Every scan of a table is bounded by an index condition on the
            // batch's keys (`key = ANY`), redundant with the join but what
            // keeps the plan from reading the whole table: on statistics
            // taken while the table was churned almost empty (autovacuum
            // after other lock work: 1 live row in thousands of pages), the
            // planner takes a 100k-row table for a one-row table, and a full
            // index scan for the cheapest path (issue 34: every renewal read
            // every row, and every lease was lost). `g` only looks at the
            // keys of the shares `s` renewed, usually none.
            renew: format!(
                "WITH r AS (
                     SELECT * FROM unnest($1::text[], $2::bytea[], $3::int8[]) WITH ORDINALITY AS r(key, token, ttl_ms, i)
                 ), l AS (
                     UPDATE {t} AS l SET expires_at = clock_timestamp() + r.ttl_ms * interval '1 millisecond'
                     FROM r WHERE l.key = ANY($1::text[]) AND l.key = r.key AND l.token = r.token
                       AND l.session IS NULL AND l.expires_at > clock_timestamp()
                     RETURNING r.i
                 ), s AS (
                     UPDATE {sh} AS x SET expires_at = clock_timestamp() + r.ttl_ms * interval '1 millisecond'
                     FROM r WHERE x.key = ANY($1::text[]) AND x.key = r.key AND x.token = r.token AND x.held
                       AND x.expires_at > clock_timestamp()
                     RETURNING r.i, x.key, x.expires_at
                 ), g AS (
                     UPDATE {t} AS gt SET expires_at = greatest(gt.expires_at, m.e)
                     FROM (SELECT key, max(expires_at) AS e FROM s GROUP BY key) m
                     WHERE gt.key = ANY(ARRAY(SELECT key FROM s)) AND gt.key = m.key AND {is_gate}
                     RETURNING 1
                 )
                 SELECT i FROM l UNION ALL SELECT i FROM s",
                is_gate = super::gate::gate_sql("gt.token", true)
            ),
            renew_session: format!(
                "UPDATE {ss} SET expires_at = greatest(expires_at, clock_timestamp() + $2::int8 * interval '1 millisecond')
                 WHERE id = $1 AND expires_at > clock_timestamp()
                 RETURNING removed"
            ),
            session_rows: format!("SELECT token FROM {t} WHERE session = $1 AND token <> {RELEASED}"),
            status: format!(
                "SELECT label, fence, (extract(epoch FROM u - clock_timestamp()) * 1000)::int8
                 FROM (SELECT label, fence, token, {u} AS u FROM {t} AS l WHERE key = $1) l
                 WHERE u > clock_timestamp() AND {not_gate}",
                u = until("l"),
                not_gate = super::gate::gate_sql("token", false)
            ),
            sweep_lock: format!("SELECT value FROM {f} WHERE id = 1 FOR UPDATE"),
            // The counter is raised to each deleted fence by the delete
            // trigger (`ddl`), in this statement: an UPDATE of the counter
            // here too would meet the row the trigger already changed.
            sweep: format!(
                "DELETE FROM {t} WHERE expires_at < clock_timestamp() - interval '60 seconds' AND key IN (
                     SELECT key FROM {t} WHERE expires_at < clock_timestamp() - interval '60 seconds'
                     LIMIT 16 FOR UPDATE SKIP LOCKED)"
            ),
            // The session rows first, as an acquire's `lapse` takes them
            // before the lease row; SKIP LOCKED: a session a renewal or a
            // takeover holds is left for a later sweep.
            sweep_sessions: [
                format!(
                    "WITH gone AS (
                         UPDATE {ss} SET removed = removed + 1
                         WHERE expires_at < clock_timestamp() - interval '60 seconds' AND id IN (
                             SELECT id FROM {ss} x WHERE expires_at < clock_timestamp() - interval '60 seconds'
                               AND EXISTS (SELECT 1 FROM {t} WHERE session = x.id AND token <> {RELEASED})
                             LIMIT 16 FOR UPDATE SKIP LOCKED)
                         RETURNING id, expires_at
                     )
                     UPDATE {t} AS l SET token = {RELEASED}, label = '', session = NULL, expires_at = gone.expires_at
                     FROM gone WHERE l.session = gone.id AND l.token <> {RELEASED}"
                ),
                format!(
                    "DELETE FROM {ss} WHERE id IN (
                         SELECT id FROM {ss} x WHERE expires_at < clock_timestamp() - interval '60 seconds'
                           AND NOT EXISTS (SELECT 1 FROM {t} WHERE session = x.id AND token <> {RELEASED})
                         LIMIT 64 FOR UPDATE SKIP LOCKED)
                       AND expires_at < clock_timestamp() - interval '60 seconds'"
                ),
            ],
            // h: the holder check (the exclusive lease row, not the shares'
            //    gate token, or a held share), on the statement's snapshot.
            // r: only if it held, the key's fence (in its lease row: the
            //    holder's, or the gate of its share) raised to max(fence,
            //    floor), never lower: every later grant of the key takes the
            //    row's fence + 1. A data-modifying CTE runs whether or not
            //    the query reads it.
            raise_fence: format!(
                "WITH h AS (
                     SELECT EXISTS (SELECT 1 FROM {t} AS l
                                    WHERE key = $1 AND token = $2 AND {u} > clock_timestamp())
                         OR EXISTS (SELECT 1 FROM {sh}
                                    WHERE key = $1 AND token = $2 AND held AND expires_at > clock_timestamp())
                         AS held
                 ),
                 r AS (
                     UPDATE {t} SET fence = $3
                     WHERE key = $1 AND fence < $3 AND (token = $2 OR {is_gate}) AND (SELECT held FROM h)
                     RETURNING 1
                 )
                 SELECT held FROM h",
                u = until("l"),
                is_gate = super::gate::gate_sql("token", true)
            ),
            read_record: format!("SELECT value FROM {r} WHERE key = $1"),
            // h: first the lock of the key's lease row (the exclusive
            //    lease, or the gate every shared transaction locks first),
            //    so no grant commits between the check and the write; then
            //    the check (the exclusive lease, not the gate token, or a
            //    held writer) at the clock after the lock was taken: a
            //    grant that committed meanwhile found the lease expired
            //    earlier still. CASE evaluates the lock before the check.
            //    w: only if it held, the upsert.
            write_record: format!(
                "WITH h AS (
                     SELECT CASE WHEN (SELECT count(*) FROM (SELECT 1 FROM {t} WHERE key = $1 FOR UPDATE) g) >= 0
                            THEN EXISTS (SELECT 1 FROM {t} AS l
                                         WHERE key = $1 AND token = $2 AND {u} > clock_timestamp())
                              OR EXISTS (SELECT 1 FROM {sh}
                                         WHERE key = $1 AND token = $2 AND held AND mode <> {shared}
                                           AND expires_at > clock_timestamp())
                            END AS held
                 ),
                 w AS (
                     INSERT INTO {r} (key, value) SELECT $1, $3 WHERE (SELECT held FROM h)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value
                     RETURNING 1
                 )
                 SELECT held FROM h",
                u = until("l"),
                shared = crate::backend::admission::MODE_SHARED
            ),
        }
    }
}

/// The statements a connection may prepare once and reuse.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stmt {
    Acquire = 0,
    Release = 1,
    Renew = 2,
    Status = 3,
    RaiseFence = 4,
    AcquireFree = 5,
    ReadRecord = 6,
    WriteRecord = 7,
    RenewSession = 8,
    SessionRows = 9,
    AcquireLean = 10,
    AcquireFreeLean = 11,
    ShrinkGate = 12,
    ShareAcquire = 13,
    ReleaseShrinking = 14,
}

impl Stmt {
    /// How many there are (the size of a connection's prepared set).
    pub(super) const COUNT: usize = 15;
}
