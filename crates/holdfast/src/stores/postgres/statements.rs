//! The text of the PostgreSQL statements of one namespace, and which of
//! them a connection prepares ([`Stmt`]). The calls that send them are in
//! `sql.rs`.
//!
//! Only two identifiers are ever interpolated: the schema and the table name,
//! checked by [`check_ident`](super::config::check_ident) (`[a-z_][a-z0-9_]*`)
//! and double-quoted. Keys, tokens, labels, TTLs and the channel name are
//! always bind parameters.

use super::config::PostgresConfig;

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
    /// Creates the schema, the tables and the counter row; run in one
    /// transaction under a transaction-scoped advisory lock.
    pub create: String,
    /// `$1 key, $2 token, $3 ttl_ms, $4 label, $5 register (bool), $6 others wait (bool)` ->
    /// `(granted fence, own fence, holder ms left, registered)`.
    pub acquire: String,
    /// The first attempt of a task not registered as a waiter: `$1 key,
    /// $2 token, $3 ttl_ms, $4 label, $5 the row starts wanted (bool)` ->
    /// the same columns as `acquire` (registered always false). `acquire`
    /// without `w`: nothing is marked wanted when the key is busy (the
    /// caller registers and attempts again with `acquire`). Most
    /// acquisitions find their key free, so this is the statement most of
    /// them run; it plans and executes four CTEs instead of five, and no
    /// index scan for `w`.
    pub acquire_free: String,
    /// `$1 key, $2 token, $3 channel` -> one row `(was unexpired, _, a
    /// held share)` if the token held the key, a share or a reservation.
    pub release: String,
    /// `$1 keys[], $2 tokens[], $3 ttl_ms[]` -> the 1-based positions renewed.
    pub renew: String,
    /// `$1 key` -> `(label, fence, ms left)` of the unexpired exclusive holder.
    pub status: String,
    /// Deletes up to 16 rows whose lease ran out more than a minute ago.
    pub sweep: String,
    /// `$1 key, $2 token, $3 floor` -> `(held)`: the counter raised to the
    /// floor if lower; whether the token holds an unexpired lease of the key.
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
            Stmt::Release => &self.release,
            Stmt::Renew => &self.renew,
            Stmt::Status => &self.status,
            Stmt::Sweep => &self.sweep,
            Stmt::RaiseFence => &self.raise_fence,
            Stmt::ReadRecord => &self.read_record,
            Stmt::WriteRecord => &self.write_record,
        }
    }

    pub(super) fn new(config: &PostgresConfig) -> Self {
        // Both names are checked identifiers ([a-z_][a-z0-9_]*), quoted anyway.
        let schema = format!("\"{}\"", config.schema);
        let t = format!("{schema}.\"{}\"", config.table);
        let f = format!("{schema}.\"{}_fence\"", config.table);
        let sh = format!("{schema}.\"{}_shares\"", config.table);
        let r = format!("{schema}.\"{}_records\"", config.table);
        // The advisory lock only serialises concurrent first-use DDL of this namespace.
        let lock_id = config.namespace_hash() as i64;
        Statements {
            lease_regclass: t.clone(),
            fence_regclass: f.clone(),
            shares_regclass: sh.clone(),
            records_regclass: r.clone(),
            create: format!(
                "BEGIN;
                 SELECT pg_advisory_xact_lock({lock_id});
                 CREATE SCHEMA IF NOT EXISTS {schema};
                 CREATE TABLE IF NOT EXISTS {t} (
                     key         text        PRIMARY KEY,
                     token       bytea       NOT NULL,
                     fence       bigint      NOT NULL,
                     label       text        NOT NULL,
                     acquired_at timestamptz NOT NULL,
                     expires_at  timestamptz NOT NULL,
                     wanted      boolean     NOT NULL DEFAULT false
                 ) WITH (fillfactor = 80);
                 ALTER TABLE {t} ADD COLUMN IF NOT EXISTS wanted boolean NOT NULL DEFAULT false;
                 CREATE TABLE IF NOT EXISTS {f} (
                     id    integer PRIMARY KEY CHECK (id = 0),
                     value bigint  NOT NULL
                 );
                 INSERT INTO {f} (id, value) VALUES (0, 0) ON CONFLICT (id) DO NOTHING;
                 CREATE TABLE IF NOT EXISTS {sh} (
                     key         text        NOT NULL,
                     token       bytea       NOT NULL,
                     mode        smallint    NOT NULL,
                     weight      bigint      NOT NULL,
                     limit_n     bigint      NOT NULL,
                     held        boolean     NOT NULL,
                     fence       bigint      NOT NULL,
                     label       text        NOT NULL,
                     acquired_at timestamptz NOT NULL,
                     expires_at  timestamptz NOT NULL,
                     PRIMARY KEY (key, token)
                 );
                 CREATE TABLE IF NOT EXISTS {r} (
                     key   text   PRIMARY KEY,
                     value bigint NOT NULL
                 );
                 COMMIT;"
            ),
            // cur: the unexpired holder, if any (statement snapshot).
            // f: the namespace counter, bumped only when the key looked free;
            //    its row lock is held to commit, so fences are handed out in
            //    commit order (a SEQUENCE is not: nextval runs before the
            //    insert and a slow inserter could commit a smaller fence after
            //    a faster one was granted and released).
            // ins: insert, or take over an expired row; ON CONFLICT re-checks
            //    the expiry on the latest row version under its row lock.
            //    `wanted` starts true if other waiters of this client wait.
            // mine: a retry by the holding token (its first reply was lost):
            //    the same grant, its lease counted from now, as the client
            //    counts it from the retry.
            // w: a waiting attempt that finds the key busy marks the row
            //    `wanted`, so that its release sends a NOTIFY (a release of an
            //    unwanted row sends none: NOTIFY is most of a release's cost).
            //    Runs only when cur found a holder, re-checked on the latest
            //    row version; 0 rows = the row changed since the snapshot.
            acquire: format!(
                "{grant}), w AS (
                     UPDATE {t} SET wanted = true
                     WHERE key = $1 AND $5 AND token <> $2 AND expires_at > clock_timestamp()
                       AND EXISTS (SELECT 1 FROM cur WHERE token <> $2)
                     RETURNING 1
                 )
                 {GRANT_COLUMNS}, EXISTS (SELECT 1 FROM w)",
                grant = grant_ctes(&t, &f, "$6", "$7"),
            ),
            // `acquire` without `w`.
            acquire_free: format!("{grant}) {GRANT_COLUMNS}, false", grant = grant_ctes(&t, &f, "$5", "$6")),
            // The notification (only if a waiter marked the row `wanted`) is
            // queued in the same transaction as the delete and delivered at
            // its commit; payload = the key.
            // A share or a reservation released: the waiters are told (a
            // freed share, or a writer that stopped waiting, may admit them);
            // the caller then shrinks the key's gate row (see `shares`).
            release: format!(
                "WITH d AS (
                     DELETE FROM {t} WHERE key = $1 AND token = $2
                     RETURNING expires_at > clock_timestamp() AS live, wanted
                 ), s AS (
                     DELETE FROM {sh} WHERE key = $1 AND token = $2
                     RETURNING held AND expires_at > clock_timestamp() AS live, held
                 )
                 SELECT d.live, CASE WHEN d.wanted THEN pg_notify($3, $1)::text END, false FROM d
                 UNION ALL
                 SELECT s.live, pg_notify($3, $1)::text, s.held FROM s"
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
                       AND l.expires_at > clock_timestamp()
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
            status: format!(
                "SELECT label, fence, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::int8
                 FROM {t} WHERE key = $1 AND expires_at > clock_timestamp() AND {not_gate}",
                not_gate = super::gate::gate_sql("token", false)
            ),
            sweep: format!(
                "DELETE FROM {t} WHERE expires_at < clock_timestamp() - interval '60 seconds' AND key IN (
                     SELECT key FROM {t} WHERE expires_at < clock_timestamp() - interval '60 seconds'
                     LIMIT 16 FOR UPDATE SKIP LOCKED)"
            ),
            // h: the holder check (the exclusive lease row, not the shares'
            //    gate token, or a held share), on the statement's snapshot.
            // f: only if it held, the namespace counter to max(value,
            //    floor), never lower; a no-op writes nothing. A
            //    data-modifying CTE runs whether or not the query reads it.
            //    When it writes, it waits for the row lock of a grant in
            //    flight, which then has its fence.
            raise_fence: format!(
                "WITH h AS (
                     SELECT EXISTS (SELECT 1 FROM {t}
                                    WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp())
                         OR EXISTS (SELECT 1 FROM {sh}
                                    WHERE key = $1 AND token = $2 AND held AND expires_at > clock_timestamp())
                         AS held
                 ),
                 f AS (
                     UPDATE {f} SET value = $3 WHERE id = 0 AND value < $3 AND (SELECT held FROM h)
                     RETURNING 1
                 )
                 SELECT held FROM h"
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
                            THEN EXISTS (SELECT 1 FROM {t}
                                         WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp())
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
    Sweep = 4,
    RaiseFence = 5,
    AcquireFree = 6,
    ReadRecord = 7,
    WriteRecord = 8,
}

impl Stmt {
    /// How many there are (the size of a connection's prepared set).
    pub(super) const COUNT: usize = 9;
}

/// The columns both acquire statements return: the granted fence, the
/// holder's own fence on a retry, and the holder's time left.
const GRANT_COLUMNS: &str = "SELECT (SELECT fence FROM ins), (SELECT fence FROM mine),
        (SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::int8 FROM cur)";

/// The CTEs `cur`, `f`, `ins` and `mine` of the acquire statements (see
/// `acquire` in [`Statements::new`]), up to and without the closing
/// parenthesis of `mine`, on lease table `t` and fence table `f`; `wanted`
/// is the parameter a new row's `wanted` starts from, `floor` the request's
/// fence floor (0: none; the fence is at least it, and the counter with it).
fn grant_ctes(t: &str, f: &str, wanted: &str, floor: &str) -> String {
    format!(
        "WITH cur AS (
                     SELECT token, fence, expires_at, wanted FROM {t}
                     WHERE key = $1 AND expires_at > clock_timestamp()
                 ), f AS (
                     UPDATE {f} SET value = greatest(value + 1, {floor}::int8)
                     WHERE id = 0 AND NOT EXISTS (SELECT 1 FROM cur)
                     RETURNING value
                 ), ins AS (
                     INSERT INTO {t} AS l (key, token, fence, label, acquired_at, expires_at, wanted)
                     SELECT $1, $2, f.value, $4, clock_timestamp(),
                            clock_timestamp() + $3::int8 * interval '1 millisecond', {wanted}
                     FROM f
                     ON CONFLICT (key) DO UPDATE
                         SET token = excluded.token, fence = excluded.fence, label = excluded.label,
                             acquired_at = excluded.acquired_at, expires_at = excluded.expires_at,
                             wanted = excluded.wanted
                         WHERE l.expires_at <= clock_timestamp()
                     RETURNING l.fence
                 ), mine AS (
                     UPDATE {t} SET expires_at = clock_timestamp() + $3::int8 * interval '1 millisecond'
                     WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()
                     RETURNING fence"
    )
}
