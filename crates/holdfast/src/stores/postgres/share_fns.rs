//! The two server-side functions of shared leases, created with the
//! namespace (see `ddl`): a shared acquire and the gate's shrink after a
//! share's release, each one statement on any connection where the
//! transactions of `shares` take three round trips or more on the client's
//! one transaction connection, with the key's gate row locked across them.
//!
//! They run the same steps in the same order under the same locks as those
//! transactions (which a namespace without the functions still runs: one
//! opened with `create=false` before an administrator added them): the gate
//! row's lock first, then the shares read in a snapshot of their own (each
//! statement of a `VOLATILE` function takes one, as each statement of a
//! `READ COMMITTED` transaction does), so a share granted meanwhile is
//! seen. One SQL statement could not do this: its snapshot is taken before
//! the lock it waits for, so it counts the shares as they were before the
//! holder it waited for committed (model `pg_share_gate`, with that and the
//! other orders rejected). The acquire decides by the lease model's admission rule
//! (`backend::admission::decide`) written in SQL: the third encoding of the
//! rule, checked against the same table of cases as the Rust and Lua ones
//! (`tests/admission/postgres.rs`, with and without the functions).

use super::config::PostgresConfig;
use super::gate::GATE_LITERAL;
use super::session::held_session_sql;
use crate::backend::admission::MODE_SHARED;

/// The suffix of the shrink function: `<table>_gate(key text, channel text)`.
pub(super) const GATE_FN: &str = "_gate";
/// The suffix of the acquire function: `<table>_share(key text, token
/// bytea, mode smallint, weight bigint, limit bigint, ttl_ms bigint, label
/// text, reserve boolean)`.
pub(super) const SHARE_FN: &str = "_share";

/// What the acquire function answers in its first column.
pub(super) const GRANTED: i16 = 0;
/// See [`GRANTED`]: refused; the second column is the soonest held lease's
/// milliseconds left, if any.
pub(super) const BUSY: i16 = 1;
/// See [`GRANTED`]: another limit holds the key; the second column is it.
pub(super) const CONFLICT: i16 = 2;

/// The calls of the two functions, and their signatures (for `to_regprocedure`).
#[derive(Debug, Clone)]
pub(super) struct Calls {
    pub(super) sigs: [String; 2],
    /// `$1 key, $2 channel` -> whether the gate was wanted.
    pub(super) shrink_gate: String,
    /// `$1 key .. $8 reserve` -> `(GRANTED, fence)`, `(BUSY, ms left)` or `(CONFLICT, limit)`.
    pub(super) share_acquire: String,
}

impl Calls {
    pub(super) fn new(config: &PostgresConfig) -> Self {
        let f = |suffix: &str| format!("\"{}\".\"{}{suffix}\"", config.schema, config.table);
        Calls {
            sigs: [
                format!("{}(text, text)", f(GATE_FN)),
                format!("{}(text, bytea, int2, int8, int8, int8, text, bool)", f(SHARE_FN)),
            ],
            shrink_gate: format!("SELECT {}($1, $2)", f(GATE_FN)),
            share_acquire: format!("SELECT * FROM {}($1, $2, $3, $4, $5, $6, $7, $8)", f(SHARE_FN)),
        }
    }
}

/// The setting both functions run with (as `pg_proc.proconfig` lists it).
/// Their reads of a key's shares must be plain index scans: a plan made
/// before the shares table was first analyzed (a new namespace, its first
/// minute or until autovacuum comes) was a bitmap scan, which never marks
/// the index entries of released shares dead, so every call walked every
/// share the key ever had until a vacuum (1,350 permits a second where the
/// same namespace, analyzed, gave 3,800); a plain index scan marks them as
/// it passes.
pub(super) const PLAN_SETTING: &str = "enable_bitmapscan=off";

/// `CREATE OR REPLACE` of both functions; `q` the quoted schema, `table`
/// the checked table name (at most 57 bytes: the names stay within 63).
pub(super) fn functions_sql(q: &str, table: &str) -> String {
    let t = format!("{q}.\"{table}\"");
    let f = format!("{q}.\"{table}_fence\"");
    let sh = format!("{q}.\"{table}_shares\"");
    let ss = format!("{q}.\"{table}_sess\"");
    let hs = held_session_sql("l");
    let until = "clock_timestamp() + ttl_ms * interval '1 millisecond'";
    let left = "(extract(epoch FROM s.expires_at - clock_timestamp()) * 1000)::int8";
    format!(
        "CREATE OR REPLACE FUNCTION {q}.\"{table}{GATE_FN}\"(k text, channel text) RETURNS boolean
         LANGUAGE plpgsql VOLATILE SET enable_bitmapscan = off AS $fn$
         DECLARE w boolean;
         BEGIN
             PERFORM 1 FROM {t} WHERE key = k FOR UPDATE;
             UPDATE {t} SET expires_at = coalesce(
                     (SELECT max(s.expires_at) FROM {sh} AS s WHERE s.key = k AND s.held), timestamptz 'epoch')
                 WHERE key = k AND token = {GATE_LITERAL} RETURNING wanted INTO w;
             IF w THEN
                 PERFORM pg_notify(channel, k);
             END IF;
             RETURN coalesce(w, false);
         END $fn$;
         CREATE OR REPLACE FUNCTION {q}.\"{table}{SHARE_FN}\"(
             k text, tok bytea, m smallint, wt bigint, lim bigint, ttl_ms bigint, lbl text, reserve boolean,
             OUT o_kind smallint, OUT o_value bigint)
         LANGUAGE plpgsql VOLATILE SET enable_bitmapscan = off AS $fn$
         DECLARE
             g_token bytea; g_fence bigint; g_exp timestamptz; g_session bytea; g_wanted boolean;
             g_live boolean; g_until timestamptz;
             own_fence bigint; own_fence_s bigint; own_place bigint; others_held boolean; other_limit bigint; taken bigint;
             blocked boolean; others_wait boolean; soonest bigint; next_fence bigint;
             shared boolean := m = {MODE_SHARED};
         BEGIN
             -- The gate: the key's lease row, locked to the end (made if
             -- missing, with a fence from the namespace counter). A row held
             -- under a session is held until that session lapses, counted in
             -- the session row under its lock (model pg_session).
             SELECT l.token, l.fence, l.expires_at, {hs}, l.wanted
                 INTO g_token, g_fence, g_exp, g_session, g_wanted
                 FROM {t} AS l WHERE l.key = k FOR UPDATE;
             IF NOT FOUND THEN
                 -- Made expired, or found made since; locked either way,
                 -- then read as above.
                 WITH c AS (UPDATE {f} SET value = value + 1 WHERE id = 1 RETURNING value)
                 INSERT INTO {t} AS l (key, token, fence, label, acquired_at, expires_at, wanted)
                 SELECT k, {GATE_LITERAL}, c.value, '', clock_timestamp(), timestamptz 'epoch', false FROM c
                 ON CONFLICT (key) DO UPDATE SET wanted = l.wanted;
                 SELECT l.token, l.fence, l.expires_at, {hs}, l.wanted
                     INTO g_token, g_fence, g_exp, g_session, g_wanted
                     FROM {t} AS l WHERE l.key = k FOR UPDATE;
             END IF;
             IF g_session IS NULL THEN
                 g_live := g_exp > clock_timestamp();
                 g_until := g_exp;
             ELSE
                 UPDATE {ss} SET removed = removed + 1 WHERE id = g_session AND expires_at <= clock_timestamp();
                 g_live := NOT FOUND;
                 SELECT x.expires_at INTO g_until FROM {ss} AS x WHERE x.id = g_session;
             END IF;
             IF g_live AND g_token <> {GATE_LITERAL} THEN
                 soonest := (extract(epoch FROM coalesce(g_until, timestamptz '-infinity') - clock_timestamp()) * 1000)::int8;
                 IF g_token = tok THEN own_fence := g_fence; END IF;
             END IF;
             -- The key's live shares and reservations, read under the gate's
             -- lock in one snapshot, folded as `admission::decide` reads them.
             WITH s AS (
                 SELECT s.token, s.mode, s.weight, s.limit_n, s.held, s.fence, {left} AS left_ms
                 FROM {sh} AS s WHERE s.key = k AND s.expires_at > clock_timestamp()
             ), o AS (SELECT min(fence) AS place FROM s WHERE token = tok AND NOT held)
             SELECT (SELECT min(fence) FROM s WHERE token = tok AND held), min(o.place),
                    coalesce(bool_or(held) FILTER (WHERE token <> tok), false),
                    (array_agg(limit_n) FILTER (WHERE token <> tok AND mode = {MODE_SHARED} AND limit_n <> lim))[1],
                    coalesce(sum(weight) FILTER (WHERE token <> tok AND mode = {MODE_SHARED}
                        AND (held OR o.place IS NULL OR fence < o.place)), 0),
                    coalesce(bool_or(held AND mode <> {MODE_SHARED}
                        OR NOT held AND mode <> {MODE_SHARED} AND mode <> 0 AND (o.place IS NULL OR fence < o.place))
                        FILTER (WHERE token <> tok), false),
                    coalesce(bool_or(NOT held) FILTER (WHERE token <> tok), false),
                    least(soonest, min(left_ms) FILTER (WHERE held))
                 INTO own_fence_s, own_place, others_held, other_limit, taken, blocked, others_wait, soonest
                 FROM s CROSS JOIN o;
             own_fence := coalesce(own_fence, own_fence_s);
             others_held := others_held OR (g_live AND g_token <> {GATE_LITERAL} AND g_token <> tok);
             IF own_fence IS NOT NULL THEN
                 -- A retry whose reply was lost: the lease counted from now.
                 IF g_token = tok THEN
                     UPDATE {t} SET expires_at = {until} WHERE key = k AND token = tok;
                 ELSE
                     UPDATE {sh} SET expires_at = {until} WHERE key = k AND token = tok AND held;
                     UPDATE {t} SET fence = greatest(fence, own_fence), label = '',
                         expires_at = greatest(CASE WHEN token = {GATE_LITERAL} THEN expires_at
                                                    ELSE timestamptz 'epoch' END, {until}),
                         token = {GATE_LITERAL}, session = NULL
                     WHERE key = k;
                 END IF;
                 o_kind := {GRANTED}; o_value := own_fence;
                 RETURN;
             END IF;
             IF shared AND other_limit IS NOT NULL THEN
                 o_kind := {CONFLICT}; o_value := other_limit;
                 RETURN;
             END IF;
             IF shared AND NOT blocked AND NOT (g_live AND g_token <> {GATE_LITERAL}) AND wt + taken <= lim THEN
                 WITH g AS (
                     UPDATE {t} SET fence = greatest(fence, (SELECT coalesce(max(fence), 0) FROM {sh} WHERE key = k)) + 1,
                         label = '',
                         expires_at = greatest(CASE WHEN token = {GATE_LITERAL} THEN expires_at
                                                    ELSE timestamptz 'epoch' END, {until}),
                         token = {GATE_LITERAL}, session = NULL
                     WHERE key = k RETURNING fence
                 )
                 INSERT INTO {sh} AS s (key, token, mode, weight, limit_n, held, fence, label, acquired_at, expires_at)
                 SELECT k, tok, m, wt, lim, true, g.fence, lbl, clock_timestamp(), {until} FROM g
                 ON CONFLICT (key, token) DO UPDATE SET mode = excluded.mode, weight = excluded.weight,
                     limit_n = excluded.limit_n, held = excluded.held, fence = excluded.fence,
                     label = excluded.label, acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
                 RETURNING s.fence INTO o_value;
                 o_kind := {GRANTED};
                 RETURN;
             END IF;
             IF NOT shared AND NOT others_held THEN
                 UPDATE {t} SET fence = greatest(fence, (SELECT coalesce(max(fence), 0) FROM {sh} WHERE key = k)) + 1
                     WHERE key = k RETURNING fence INTO next_fence;
                 UPDATE {t} SET token = tok, fence = next_fence, label = lbl, acquired_at = clock_timestamp(),
                     expires_at = {until}, wanted = others_wait, session = NULL
                 WHERE key = k;
                 DELETE FROM {sh} WHERE key = k AND token = tok;
                 o_kind := {GRANTED}; o_value := next_fence;
                 RETURN;
             END IF;
             IF reserve THEN
                 IF own_place IS NULL THEN
                     SELECT greatest((SELECT fence FROM {t} WHERE key = k), (SELECT max(fence) FROM {sh} WHERE key = k)) + 1
                         INTO own_place;
                 END IF;
                 INSERT INTO {sh} AS s (key, token, mode, weight, limit_n, held, fence, label, acquired_at, expires_at)
                 VALUES (k, tok, m, wt, lim, false, own_place, lbl, clock_timestamp(), {until})
                 ON CONFLICT (key, token) DO UPDATE SET mode = excluded.mode, weight = excluded.weight,
                     limit_n = excluded.limit_n, held = excluded.held, fence = excluded.fence,
                     label = excluded.label, acquired_at = excluded.acquired_at, expires_at = excluded.expires_at;
                 -- So that the releases that may admit it notify (model pg_wakeup).
                 IF NOT g_wanted THEN
                     UPDATE {t} SET wanted = true WHERE key = k;
                 END IF;
             END IF;
             o_kind := {BUSY}; o_value := soonest;
         END $fn$;"
    )
}
