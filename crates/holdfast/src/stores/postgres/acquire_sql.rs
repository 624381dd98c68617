//! The text of the mutex acquire statements of a namespace (put together
//! in `statements`, whose `acquire` comment says what each CTE does):
//! their CTEs, which read and write the key's lease row, its session row
//! and the counter, and the columns they answer. Schema and table are
//! interpolated as in `statements`; everything else is a bind parameter.

use super::session::{held_session_sql, until_sql};

/// The columns both acquire statements return: the granted fence, the
/// holder's own fence on a retry, and the holder's time left.
pub(super) const GRANT_COLUMNS: &str = "SELECT coalesce((SELECT fence FROM ins), (SELECT fence FROM up)),
        (SELECT fence FROM mine),
        (SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::int8 FROM cur
         WHERE expires_at > clock_timestamp())";

/// The last column of both acquire statements: the snapshot saw a row that
/// was free, and nothing was granted: the row changed or went (a sweep)
/// since the snapshot, and the statement changed nothing; the client runs
/// it again at once rather than insert with the snapshot's fence.
pub(super) const RUN_AGAIN: &str = "EXISTS (SELECT 1 FROM cur WHERE expires_at <= clock_timestamp())
        AND NOT EXISTS (SELECT 1 FROM up) AND NOT EXISTS (SELECT 1 FROM mine)";

/// `acquire` (or its lean form) from its CTEs and session columns: `w`
/// added (see `acquire` in [`Statements::new`]); registered if `w` marked
/// the row or the snapshot shows another live holder's row marked.
pub(super) fn acquire_sql(t: &str, grant: &str, session_columns: &str) -> String {
    format!(
        "{grant}), w AS (
             UPDATE {t} SET wanted = true
             WHERE key = $1 AND $5 AND token <> $2 AND expires_at > clock_timestamp() AND NOT wanted
               AND EXISTS (SELECT 1 FROM cur WHERE token <> $2 AND expires_at > clock_timestamp() AND NOT wanted)
             RETURNING 1
         )
         {GRANT_COLUMNS},
         EXISTS (SELECT 1 FROM w)
           OR ($5 AND EXISTS (SELECT 1 FROM cur WHERE token <> $2 AND expires_at > clock_timestamp() AND wanted)),
         {RUN_AGAIN}, {session_columns}"
    )
}

/// The CTEs `cur`, `own`, `ext`, `sess`, `new`, `lapse`, `f`, `ins`, `up`
/// and `mine` of the acquire statements (see `acquire` in
/// [`Statements::new`]), up to and without the closing parenthesis of
/// `mine`, on lease table `t`, fence table `f` and session table `ss`.
/// `params` are the parameters of: the value a new row's `wanted` starts
/// from; the request's fence floor (0: none; the fence is at least it, and
/// the counter with it when the counter is drawn from); the client's
/// current session; a new session id, or `""` for the lean path, whose
/// `sess` is the client's session as named (no `own`, `ext`, `new`).
pub(super) fn grant_ctes(t: &str, f: &str, ss: &str, params: [&str; 4]) -> String {
    let [wanted, floor, sid, nid] = params;
    let ttl = "$3::int8 * interval '1 millisecond'";
    let u = until_sql("l", ss);
    let hs = held_session_sql("l");
    let session_ctes = if nid.is_empty() {
        format!("sess AS (SELECT {sid}::bytea AS id)")
    } else {
        format!(
            "own AS (
                     SELECT expires_at FROM {ss} WHERE id = {sid}::bytea AND expires_at > clock_timestamp()
                 ), ext AS (
                     UPDATE {ss} SET expires_at = greatest(expires_at, clock_timestamp() + {ttl})
                     WHERE id = {sid}::bytea AND expires_at > clock_timestamp()
                       AND EXISTS (SELECT 1 FROM own WHERE expires_at < clock_timestamp() + {ttl} * 2 / 3)
                     RETURNING expires_at
                 ), sess AS (
                     SELECT CASE WHEN EXISTS (SELECT 1 FROM own WHERE expires_at >= clock_timestamp() + {ttl} * 2 / 3)
                                   OR EXISTS (SELECT 1 FROM ext)
                                 THEN {sid}::bytea ELSE {nid}::bytea END AS id
                 ), new AS (
                     INSERT INTO {ss} (id, expires_at, removed)
                     SELECT {nid}::bytea, clock_timestamp() + {ttl}, 0 WHERE (SELECT id FROM sess) = {nid}::bytea
                     RETURNING expires_at
                 )"
        )
    };
    format!(
        "WITH cur AS (
                     SELECT token, fence, {u} AS expires_at, wanted, {hs} AS session FROM {t} AS l WHERE key = $1
                 ), {session_ctes}, lapse AS (
                     UPDATE {ss} SET removed = removed + 1
                     WHERE id = (SELECT session FROM cur WHERE expires_at <= clock_timestamp())
                       AND expires_at <= clock_timestamp()
                     RETURNING id
                 ), f AS (
                     UPDATE {f} SET value = greatest(value + 1, {floor}::int8)
                     WHERE id = 1 AND NOT EXISTS (SELECT 1 FROM cur)
                     RETURNING value
                 ), ins AS (
                     INSERT INTO {t} AS l (key, token, fence, label, acquired_at, expires_at, wanted, session)
                     SELECT $1, $2, f.value, $4, clock_timestamp(), timestamptz 'infinity', {wanted},
                            (SELECT id FROM sess)
                     FROM f
                     ON CONFLICT (key) DO UPDATE
                         SET token = excluded.token, fence = greatest(l.fence + 1, excluded.fence),
                             label = excluded.label, acquired_at = excluded.acquired_at,
                             expires_at = excluded.expires_at, wanted = excluded.wanted, session = excluded.session
                         WHERE {hs} IS NULL AND l.expires_at <= clock_timestamp()
                     RETURNING l.fence
                 ), up AS (
                     -- `x` carries what the CTEs that write decided (a join:
                     -- a recheck of the row after a concurrent update keeps
                     -- it, where a subquery of a writing CTE may not be run
                     -- again).
                     UPDATE {t} AS l SET token = $2, fence = greatest(l.fence + 1, {floor}::int8), label = $4,
                         acquired_at = clock_timestamp(), expires_at = timestamptz 'infinity', wanted = {wanted},
                         session = x.sid
                     FROM (SELECT (SELECT id FROM sess) AS sid, (SELECT session FROM cur) AS seen,
                                  (SELECT id FROM lapse) AS lapsed) AS x
                     WHERE key = $1 AND EXISTS (SELECT 1 FROM cur)
                       AND CASE WHEN {hs} IS NULL THEN l.expires_at <= clock_timestamp()
                                ELSE l.session = x.seen
                                     AND (l.session = x.lapsed OR NOT EXISTS (SELECT 1 FROM {ss} WHERE id = l.session))
                           END
                     RETURNING l.fence
                 ), mine AS (
                     UPDATE {t} AS l SET expires_at = CASE WHEN session IS NULL THEN clock_timestamp() + {ttl}
                                                           ELSE expires_at END
                     WHERE key = $1 AND token = $2 AND {u} > clock_timestamp()
                     RETURNING fence, {u} AS until, session"
    )
}

/// The last two columns of both acquire statements: how long the grant
/// is valid for in ms (a retry's row until its session's or its own
/// expiry; a new grant until its session's), and the session the grant
/// lives with (a retry's: its row's, NULL for a row without one; else the
/// session the statement chose, granted or not).
pub(super) const SESSION_COLUMNS: &str =
    "(extract(epoch FROM coalesce((SELECT until FROM mine), (SELECT expires_at FROM ext),
            (SELECT expires_at FROM new), (SELECT expires_at FROM own)) - clock_timestamp()) * 1000)::int8,
        CASE WHEN EXISTS (SELECT 1 FROM mine) THEN (SELECT session FROM mine) ELSE (SELECT id FROM sess) END";

/// [`SESSION_COLUMNS`] of the lean path: the validity of a retry only (a
/// new grant's is the client's own count of its session).
pub(super) const LEAN_SESSION_COLUMNS: &str =
    "(extract(epoch FROM (SELECT until FROM mine) - clock_timestamp()) * 1000)::int8,
        CASE WHEN EXISTS (SELECT 1 FROM mine) THEN (SELECT session FROM mine) ELSE (SELECT id FROM sess) END";
