//! The DDL of one namespace: its tables, and the migration to per-key
//! fences (a namespace made by an earlier version is brought forward by the
//! same text, run once under the namespace's advisory lock).
//!
//! A key's fence lives in its lease row, which a release keeps (the released
//! marker: an empty token, expired at the release); only a key without a row
//! draws from the namespace counter, row 1 of `<table>_fence`. Row 0 is the
//! counter of the earlier layout: its clients would keep drawing from it and
//! deleting rows whose fences ran ahead of it, so after the migration every
//! write to row 0 fails (trigger `holdfast_refuse_old`, naming the upgrade),
//! and every delete of a lease row, by any client, raises row 1 to the
//! deleted fence (trigger `holdfast_keep_fence`; it also counts the delete
//! of a row that lives with a session in that session, see `session`). The model `pg_fence` in
//! holdfast-models checks this design and the variants weighed against it.
//!
//! The same text adds the session table `<table>_sess` and the lease rows'
//! `session` column (model `pg_session`; see `session.rs`).

/// The name of the trigger that raises the counter on a lease row's delete.
pub(super) const KEEP_TRIGGER: &str = "holdfast_keep_fence";
/// The name of the trigger that refuses writes to the old counter row.
pub(super) const REFUSE_TRIGGER: &str = "holdfast_refuse_old";

/// The namespace's DDL texts, each one transaction under
/// `pg_advisory_xact_lock(lock_id)` (the lock serialises concurrent
/// first-use DDL of the namespace).
#[derive(Debug, Clone)]
pub(super) struct Ddl {
    /// Creates the schema, the tables, the counter rows and the triggers of
    /// per-key fences, or migrates a namespace of an earlier version.
    pub(super) whole: String,
    /// What a namespace that has per-key fences and session rows may lack
    /// (the records table, the functions of shared leases), added without a
    /// lock on a table in use: the whole text's `ALTER TABLE` and triggers
    /// wait for every open transaction on the lease table, every other
    /// client's statement queues behind them, and with live traffic they
    /// deadlocked with other clients' statements (SQLSTATE 40P01).
    pub(super) additions: String,
}

impl Ddl {
    /// `schema` and `table` are checked identifiers.
    pub(super) fn new(schema: &str, table: &str, lock_id: i64) -> Self {
        let q = format!("\"{schema}\"");
        let additions = format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock({lock_id});
             {records}
             {functions}
             COMMIT;",
            records = records_sql(&format!("{q}.\"{table}_records\"")),
            functions = super::share_fns::functions_sql(&q, table)
        );
        Ddl { whole: create_sql(schema, table, lock_id), additions }
    }
}

/// The records table `r` (quoted), if it does not exist.
fn records_sql(r: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {r} (
             key   text   PRIMARY KEY,
             value bigint NOT NULL
         );"
    )
}

/// The text that creates (or migrates) the namespace. `schema` and `table`
/// are checked identifiers; `t`, `f`, `sh`, `r` their quoted tables.
fn create_sql(schema: &str, table: &str, lock_id: i64) -> String {
    let q = format!("\"{schema}\"");
    let t = format!("{q}.\"{table}\"");
    let f = format!("{q}.\"{table}_fence\"");
    let sh = format!("{q}.\"{table}_shares\"");
    let r = format!("{q}.\"{table}_records\"");
    let ss = format!("{q}.\"{table}_sess\"");
    let by_session = format!("\"{table}_sidx\"");
    // Function names stay within 63 bytes: the table name has at most 57.
    let keep_fn = format!("{q}.\"{table}_keep\"");
    let refuse_fn = format!("{q}.\"{table}_old\"");
    let functions = super::share_fns::functions_sql(&q, table);
    let records = records_sql(&r);
    format!(
        "BEGIN;
         SELECT pg_advisory_xact_lock({lock_id});
         CREATE SCHEMA IF NOT EXISTS {q};
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
         -- Session rows (see `session`): a lease row that names one is held
         -- while that row is unexpired, and keeps `expires_at` at infinity,
         -- so a client of an earlier version sees it held and never takes it.
         CREATE TABLE IF NOT EXISTS {ss} (
             id         bytea       PRIMARY KEY,
             expires_at timestamptz NOT NULL,
             removed    bigint      NOT NULL DEFAULT 0
         );
         ALTER TABLE {t} ADD COLUMN IF NOT EXISTS session bytea;
         CREATE INDEX IF NOT EXISTS {by_session} ON {t} (session) WHERE session IS NOT NULL;
         CREATE TABLE IF NOT EXISTS {f} (
             id    integer PRIMARY KEY,
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
         {records}
         -- Per-key fences. The old counter row is locked first, so that no
         -- client of the old layout draws from it while row 1 is made.
         SELECT value FROM {f} WHERE id = 0 FOR UPDATE;
         DO $do$ DECLARE c text; BEGIN
             FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = '{f}'::regclass AND contype = 'c' LOOP
                 EXECUTE format('ALTER TABLE {f} DROP CONSTRAINT %I', c);
             END LOOP;
         END $do$;
         INSERT INTO {f} (id, value)
         SELECT 1, greatest((SELECT value FROM {f} WHERE id = 0),
                            (SELECT coalesce(max(fence), 0) FROM {t}),
                            (SELECT coalesce(max(fence), 0) FROM {sh}))
         ON CONFLICT (id) DO NOTHING;
         CREATE OR REPLACE FUNCTION {keep_fn}() RETURNS trigger LANGUAGE plpgsql AS $fn$
         BEGIN
             UPDATE {f} SET value = OLD.fence WHERE id = 1 AND value < OLD.fence;
             -- A held row deleted by hand: its client hears it at its next renewal.
             IF OLD.session IS NOT NULL AND OLD.token <> '\\x'::bytea THEN
                 UPDATE {ss} SET removed = removed + 1 WHERE id = OLD.session;
             END IF;
             RETURN OLD;
         END $fn$;
         DROP TRIGGER IF EXISTS {KEEP_TRIGGER} ON {t};
         CREATE TRIGGER {KEEP_TRIGGER} BEFORE DELETE ON {t}
             FOR EACH ROW EXECUTE FUNCTION {keep_fn}();
         CREATE OR REPLACE FUNCTION {refuse_fn}() RETURNS trigger LANGUAGE plpgsql AS $fn$
         BEGIN
             RAISE EXCEPTION 'holdfast: namespace {schema}.{table} keeps per-key fences; this client is of an \
                 earlier version, which draws fences from a counter the namespace no longer uses: upgrade it'
                 USING ERRCODE = 'object_not_in_prerequisite_state';
         END $fn$;
         DROP TRIGGER IF EXISTS {REFUSE_TRIGGER} ON {f};
         CREATE TRIGGER {REFUSE_TRIGGER} BEFORE UPDATE ON {f}
             FOR EACH ROW WHEN (OLD.id = 0) EXECUTE FUNCTION {refuse_fn}();
         {functions}
         COMMIT;"
    )
}
