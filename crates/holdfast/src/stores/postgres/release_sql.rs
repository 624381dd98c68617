//! The text of a namespace's release statement (put together in
//! `statements`), in its two forms: the shrink of a key's gate after a held
//! share left to a second call of the gate function, or made in the same
//! statement. Schema and table are interpolated as in `statements`;
//! everything else is a bind parameter.

use super::session::{RELEASED, until_sql};

/// `$1 key, $2 token, $3 channel, $4 the sessions the releasing client owns
/// the token's row in` -> one row `(was unexpired, _, the gate is to
/// shrink)` if the token held the key, a share or a reservation, or
/// `(false, _, true)` if it held nothing on a key whose row is a gate.
/// `t`, `sh`, `ss`: the quoted lease, shares and session tables.
///
/// With `gate` (the quoted gate function, `<table>_gate`), the statement
/// calls it where the caller would have, after a held share released or
/// on a gated key where nothing was found, and the third column is never
/// true: one statement and one commit instead of two. The function is
/// `VOLATILE`, so its reads see the share row this statement deleted (a
/// volatile function sees the changes of the command that calls it), and
/// it takes the gate's lock before it reads the shares left, in a snapshot
/// taken under that lock, as its separate call does. The release then
/// waits for the gate's lock while it holds its deleted share row's lock:
/// no holder of a gate lock ever waits for a share row's lock (a share's
/// acquire writes only its own row, never beside its own release or
/// renewal; the gate function reads shares without locks; a renewal takes
/// all its share rows before any gate), so no cycle of waits can form
/// (model 20, `pg_share_release`).
///
/// The CTEs:
/// - `c`: a row of a session that is not the releasing client's counts a
///   removal in it (first: `d` waits for it), so that its client hears of
///   it (model 9).
/// - `d`: the token's lease row becomes the released marker; the
///   notification (only if a waiter marked the row `wanted`) is queued in
///   the same transaction and delivered at its commit; payload = the key.
/// - `s`: a share or a reservation released, and the key's gate shrinks
///   after a held share. The waiters are told (a freed share, or a writer
///   that stopped waiting, may admit them): after a reservation, always;
///   after a held share, with `gate`, only by the gate function, and only
///   if the gate is marked `wanted` (every waiter that sleeps has marked
///   it, under the gate's lock or re-checked on its latest version, and
///   the function reads the mark under that lock after this delete). A
///   NOTIFY signals every listening backend of the database, so one per
///   read cycle cost a third of the readers' throughput. Without `gate`
///   the release still tells them unconditionally: the gate's shrink comes
///   in a second call, and a client that ends between the two would leave
///   a waiter that marked the gate asleep beside a share gone (model 21,
///   `pg_share_wakeup`, `TwoStep` with `stops`).
/// - Nothing found on a gated key: the gate shrinks too (the retry of a
///   release applied whose reply was lost).
pub(super) fn release_sql(t: &str, sh: &str, ss: &str, gate: Option<&str>) -> String {
    let notify = "pg_notify($3, $1)::text";
    let (share_notify, after_share, on_gate) = match gate {
        // `CASE`: the function runs only after a held share (SQL does not
        // promise to stop at the first false operand of `AND`).
        Some(g) => (
            format!("CASE WHEN NOT s.held THEN {notify} END"),
            format!("CASE WHEN s.held THEN {g}($1, $3) IS NULL ELSE false END"),
            format!("{g}($1, $3) IS NULL"),
        ),
        None => (notify.to_owned(), "s.held".to_owned(), "true".to_owned()),
    };
    format!(
        "WITH o AS (
             SELECT {u} AS until, session FROM {t} AS l WHERE key = $1 AND token = $2
         ), c AS (
             UPDATE {ss} SET removed = removed + 1
             WHERE id = (SELECT session FROM o) AND NOT (id = ANY($4::bytea[]))
             RETURNING 1
         ), d AS (
             UPDATE {t} SET token = {RELEASED}, label = '', expires_at = least(o.until, clock_timestamp())
             FROM o, (SELECT count(*) FROM c) AS counted WHERE key = $1 AND token = $2
             RETURNING o.until > clock_timestamp() AS live, wanted
         ), s AS (
             DELETE FROM {sh} WHERE key = $1 AND token = $2
             RETURNING held AND expires_at > clock_timestamp() AS live, held
         )
         SELECT d.live, CASE WHEN d.wanted THEN pg_notify($3, $1)::text END, false FROM d
         UNION ALL
         SELECT s.live, {share_notify}, {after_share} FROM s
         UNION ALL
         SELECT false, NULL, {on_gate} FROM {t}
         WHERE key = $1 AND {is_gate} AND NOT EXISTS (SELECT 1 FROM d) AND NOT EXISTS (SELECT 1 FROM s)",
        u = until_sql("l", ss),
        is_gate = super::gate::gate_sql("token", true)
    )
}
