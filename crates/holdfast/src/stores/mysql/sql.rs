//! The MySQL/MariaDB statements. Every value is a bound parameter of a
//! prepared statement; the only text built at run time is the two table
//! names, from a namespace checked against `[A-Za-z_][A-Za-z0-9_]*` and
//! quoted with backticks.
//!
//! Time is the server's: `UTC_TIMESTAMP(6)` (the statement's start, in UTC,
//! so the session `time_zone` and DST never matter), expiries are
//! `DATETIME(6)` in UTC.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, TxOpts, Value};

use super::session::{left, rows_matched};
use super::session_rows::{self, FAR_SQL, RELEASED_SQL, SessionSql, held_session_sql};
use crate::vocabulary::key::OwnerToken;

/// Most leases per renewal statement (two placeholders each), far under the
/// server's limit of 65535 placeholders per statement.
pub(super) const RENEW_CHUNK: usize = 256;

/// Most rows one sweep deletes.
pub(super) const SWEEP_ROWS: usize = 32;

/// Rows one sweep reads, in key order from where the last one stopped.
pub(super) const SWEEP_WINDOW: usize = 256;

/// The statement texts of one namespace.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) schema: Vec<String>,
    fence_next: String,
    take_over: String,
    insert: String,
    peek: String,
    release: String,
    release_counted: String,
    pub(super) sweep_find: String,
    pub(super) lock_counter: String,
    pub(super) sweep_fence: String,
    pub(super) sweep_count: String,
    pub(super) sweep_delete: String,
    pub(super) raise_counter: String,
    pub(super) renew_one: String,
    holder: String,
    lock_row: String,
    raise_fence: String,
    holds: String,
    holds_exclusive: String,
    read_record: String,
    write_record: String,
    leases: String,
    pub(super) probe: String,
    pub(super) lock_probed: String,
    pub(super) take_lapsed: String,
    pub(super) sessions: SessionSql,
}

impl Statements {
    /// Statements over `<leases>`, `<fence>`, `<shares>`, `<records>` and
    /// `<sessions>`, all already validated names.
    pub(super) fn new(leases: &str, fence: &str, shares: &str, records: &str, sessions: &str) -> Self {
        let l = format!("`{leases}`");
        let x = SessionSql::table(sessions);
        // Until when the row aliased `l` is held (its session's expiry for a
        // session-bound row), and the held session; `{l}` qualifies the
        // columns where a statement cannot alias its table.
        let (u, hs) = (session_rows::until_sql("l", &x), held_session_sql("l"));
        let u_table = session_rows::until_sql(&l, &x);
        let f = format!("`{fence}`");
        let s = format!("`{shares}`");
        let r = format!("`{records}`");
        Statements {
            schema: vec![
                // lock_key is VARBINARY: keys compare as exact bytes, so 'A',
                // 'a' and 'a ' are three keys (no collation folds case or
                // trailing spaces). 256 bytes = MAX_KEY_BYTES.
                format!(
                    "CREATE TABLE IF NOT EXISTS {l} (
                        lock_key   VARBINARY(256) NOT NULL,
                        token      BINARY(16) NOT NULL,
                        fence      BIGINT UNSIGNED NOT NULL,
                        label      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                        live_until DATETIME(6) NOT NULL,
                        session    BINARY(16) NULL,
                        PRIMARY KEY (lock_key),
                        KEY lease_session (session)
                    ) ENGINE=InnoDB"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {f} (
                        id    TINYINT UNSIGNED NOT NULL PRIMARY KEY,
                        value BIGINT UNSIGNED NOT NULL
                    ) ENGINE=InnoDB"
                ),
                format!("INSERT IGNORE INTO {f} (id, value) VALUES (0, 0)"),
                format!(
                    "CREATE TABLE IF NOT EXISTS {r} (
                        lock_key VARBINARY(256) NOT NULL PRIMARY KEY,
                        value    BIGINT UNSIGNED NOT NULL
                    ) ENGINE=InnoDB"
                ),
            ],
            // The counter, drawn from only for a key that has no row (and
            // by shares): the least fence above every fence of every key
            // whose row was deleted (the sweep and the forced release raise
            // it to what they delete). The OK packet of this UPDATE carries
            // the new value as its insert id; LAST_INSERT_ID() is the same
            // value for the next statement of the session. The request's
            // fence floor (0: none) is the least next fence.
            fence_next: format!("UPDATE {f} SET value = LAST_INSERT_ID(GREATEST(value + 1, ?)) WHERE id = 0"),
            // The grant of a key that has a row (the usual case: rows stay
            // after release as the released marker): one autocommit
            // statement under the row's lock. Free (expired, released, an
            // expired gate of shares): the row's fence + 1, at least the
            // floor. Our own live row (a retry after an attempt whose reply
            // was lost): its fence, raised to the floor if lower, and a new
            // expiry. Assigned in order, each seeing the ones before: once
            // `token` is ours the later conditions stay true, and
            // `live_until` is assigned last, so the earlier ones see the old
            // expiry. LAST_INSERT_ID(expr) runs only on a grant: the fence
            // comes back as the insert id, and no insert id means not
            // granted (then rows matched 1: busy; 0: no row, see `insert`).
            // A held row of a session keeps `live_until` far ahead, so this
            // statement never takes another client's: its session's lapse is
            // checked under that row's lock (`take_lapsed`). A row it grants
            // is held under the acquire's session (`?`, written after the
            // token, so that `free` still holds): `live_until` far ahead.
            // When the same session took the key last, its released row
            // already names it, and no index entry changes.
            take_over: format!(
                "UPDATE {l} SET
                   fence = IF(live_until <= UTC_TIMESTAMP(6), LAST_INSERT_ID(GREATEST(fence + 1, ?)),
                              IF(token = ?, LAST_INSERT_ID(GREATEST(fence, ?)), fence)),
                   label = IF({free}, ?, label),
                   token = IF({free}, ?, token),
                   session = IF({free}, ?, session),
                   live_until = IF({free}, {FAR_SQL}, live_until)
                 WHERE lock_key = ?",
                free = "(live_until <= UTC_TIMESTAMP(6) OR token = ?)"
            ),
            // The grant of a key without a row, after `fence_next` in one
            // transaction (the counter's lock first, as shares and the sweep
            // take it). A row that appeared since is left as it is (affected
            // rows 0: somebody was granted the key meanwhile).
            insert: format!(
                "INSERT INTO {l} (lock_key, token, fence, label, live_until, session)
                 VALUES (?, ?, LAST_INSERT_ID(), ?, {FAR_SQL}, ?)
                 ON DUPLICATE KEY UPDATE lock_key = lock_key"
            ),
            // Busy only for another token: a retry after a lost reply goes on
            // to the grant, which hands the grant back.
            peek: format!(
                "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), {u}) FROM {l} AS l
                 WHERE lock_key = ? AND {u} > UTC_TIMESTAMP(6) AND token <> ?"
            ),
            // The row stays as the released marker: its fence is the key's,
            // and the next grant takes it + 1 (model `mysql_fence`). The
            // label stays too (nothing shows a released row's): a row whose
            // size does not change is updated in place, and the next grant,
            // usually by the same client, writes a label of the same size.
            // A row of its own expiry, or held under the releasing client's
            // own session (`?`; NULL: none): no count, the holder is the one
            // releasing. The session column stays as it is.
            release: format!(
                "UPDATE {l} SET token = {RELEASED_SQL}, live_until = UTC_TIMESTAMP(6)
                 WHERE lock_key = ? AND token = ? AND (live_until <> {FAR_SQL} OR session = ?)"
            ),
            // A row of another session (another client's lease released by
            // its token, or this client's after an acquire whose answer it
            // never read): the removal is counted in the session, in the same
            // statement. (A statement of its own: joined into every release,
            // it cost a quarter of the uncontended cycle, docs/performance.md.)
            release_counted: format!(
                "UPDATE {l} AS l JOIN {x} AS x ON x.id = l.session
                 SET x.removed = x.removed + 1, l.token = {RELEASED_SQL}, l.live_until = UTC_TIMESTAMP(6)
                 WHERE l.lock_key = ? AND l.token = ? AND l.live_until = {FAR_SQL}"
            ),
            // The next window of the primary key, read plainly (no locks):
            // the transaction then locks only the rows it deletes, by primary
            // key. No index on the expiry: every grant and release writes it,
            // and keeping an index of it cost 10-15% of the uncontended cycle
            // (docs/performance.md), for a sweep that reads 256 rows a second.
            sweep_find: format!(
                "SELECT lock_key, {u} < UTC_TIMESTAMP(6) - INTERVAL 60 SECOND FROM {l} AS l
                 WHERE lock_key > ? ORDER BY lock_key LIMIT {SWEEP_WINDOW}"
            ),
            lock_counter: format!("SELECT value FROM {f} WHERE id = 0 FOR UPDATE"),
            // The expiry is checked again under the row locks: a key taken
            // over since the read has a live row, which stays. Always
            // `SWEEP_ROWS` placeholders, so that one prepared statement serves.
            sweep_fence: format!(
                "SELECT CAST(COALESCE(MAX(fence), 0) AS UNSIGNED) FROM {l} AS l WHERE lock_key IN ({list})
                   AND {u} < UTC_TIMESTAMP(6) - INTERVAL 60 SECOND FOR UPDATE",
                list = vec!["?"; SWEEP_ROWS].join(", ")
            ),
            // The held rows of lapsed sessions among them are counted (their
            // sessions lapsed a minute ago: the count only matters to a
            // holder whose server clock stepped back, but it costs nothing).
            sweep_count: format!(
                "UPDATE {x} AS x JOIN {l} AS l ON x.id = {hs} SET x.removed = x.removed + 1
                 WHERE l.lock_key IN ({list}) AND x.expires_at < UTC_TIMESTAMP(6) - INTERVAL 60 SECOND",
                list = vec!["?"; SWEEP_ROWS].join(", ")
            ),
            sweep_delete: format!(
                "DELETE FROM {l} WHERE lock_key IN ({}) AND {u_table} < UTC_TIMESTAMP(6) - INTERVAL 60 SECOND",
                vec!["?"; SWEEP_ROWS].join(", ")
            ),
            // An unchanged value is not written.
            raise_counter: format!("UPDATE {f} SET value = GREATEST(value, ?) WHERE id = 0"),
            // Rows of their own expiry only (a session's rows are renewed
            // by their session).
            renew_one: format!(
                "UPDATE {l} SET live_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
                 WHERE lock_key = ? AND token = ? AND live_until > UTC_TIMESTAMP(6) AND live_until <> {FAR_SQL}"
            ),
            // An exclusive holder's row, not the gate of shares.
            holder: format!(
                "SELECT label, fence, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), {u}) FROM {l} AS l
                 WHERE lock_key = ? AND {u} > UTC_TIMESTAMP(6) AND {not_gate}",
                not_gate = super::shares::NOT_GATE
            ),
            // Locks the key's row: every grant of the key writes it (a key
            // whose lease is held has a row), so none commits between a
            // holder check and what the caller writes after it.
            lock_row: format!("SELECT 1 FROM {l} WHERE lock_key = ? FOR UPDATE"),
            // The key's fence floor is its row's fence: every later grant of
            // the key takes it + 1, or, once the sweep or a forced release
            // deleted the row, draws from the counter they raised to it.
            raise_fence: format!("UPDATE {l} SET fence = GREATEST(fence, ?) WHERE lock_key = ?"),
            // An unexpired exclusive lease (no client's token is the gate's)
            // or a held share.
            holds: format!(
                "SELECT EXISTS (SELECT 1 FROM {l} AS l WHERE lock_key = ? AND token = ? AND {u} > UTC_TIMESTAMP(6))
                     OR EXISTS (SELECT 1 FROM {s} WHERE lock_key = ? AND token = ? AND held = 1
                                AND live_until > UTC_TIMESTAMP(6))"
            ),
            // An unexpired exclusive lease (no client's token is the gate's)
            // or a held writer.
            holds_exclusive: format!(
                "SELECT EXISTS (SELECT 1 FROM {l} AS l WHERE lock_key = ? AND token = ? AND {u} > UTC_TIMESTAMP(6))
                     OR EXISTS (SELECT 1 FROM {s} WHERE lock_key = ? AND token = ? AND held = 1 AND mode <> {shared}
                                AND live_until > UTC_TIMESTAMP(6))",
                shared = crate::backend::admission::MODE_SHARED
            ),
            read_record: format!("SELECT value FROM {r} WHERE lock_key = ?"),
            write_record: format!(
                "INSERT INTO {r} (lock_key, value) VALUES (?, ?) ON DUPLICATE KEY UPDATE value = VALUES(value)"
            ),
            // The takeover of a row a grant found held: first a consistent
            // read (token, held session, lapsed on this snapshot, time left).
            probe: format!(
                "SELECT token, {hs}, {u} <= UTC_TIMESTAMP(6), TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), {u})
                 FROM {l} AS l WHERE lock_key = ?"
            ),
            // Then, in a transaction: the row's lock (the lease row before
            // its session row, as everywhere), the count, the grant.
            lock_probed: format!("SELECT token, session FROM {l} WHERE lock_key = ? FOR UPDATE"),
            take_lapsed: format!(
                "UPDATE {l} SET fence = LAST_INSERT_ID(GREATEST(fence + 1, ?)), label = ?, token = ?, session = ?,
                   live_until = {FAR_SQL}
                 WHERE lock_key = ?"
            ),
            sessions: SessionSql::new(sessions, leases),
            leases: l,
        }
    }

    pub(super) fn renew_many(&self, n: usize) -> String {
        format!(
            "UPDATE {} SET live_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
             WHERE (lock_key, token) IN ({}) AND live_until > UTC_TIMESTAMP(6) AND live_until <> {FAR_SQL}",
            self.leases,
            vec!["(?, ?)"; n].join(", ")
        )
    }

    pub(super) fn held_many(&self, n: usize) -> String {
        format!(
            "SELECT lock_key, token FROM {} WHERE (lock_key, token) IN ({}) AND live_until > UTC_TIMESTAMP(6)
               AND live_until <> {FAR_SQL}",
            self.leases,
            vec!["(?, ?)"; n].join(", ")
        )
    }
}

/// The outcome of one acquire attempt.
pub(super) enum Acquired {
    Granted {
        fence: u64,
    },
    Busy {
        expires_in: Option<Duration>,
    },
    /// The key's row is held, maybe under a session that lapsed: the
    /// caller asked to look (`takeover::take_lapsed`).
    RowHeld,
}

/// Time left on an unexpired holder of `key` other than `token`, without
/// locking anything (a consistent read). `None`: free, expired or ours.
pub(super) async fn peek_busy(
    conn: &mut Conn,
    s: &Statements,
    key: &str,
    token: OwnerToken,
) -> mysql_async::Result<Option<Duration>> {
    let us: Option<Option<i64>> = conn.exec_first(s.peek.as_str(), (key.as_bytes(), &token.to_bytes()[..])).await?;
    Ok(us.map(left))
}

/// Grants `key` if free: takes over its row in place (one statement, the
/// row's fence + 1, at least `floor`), or, for a key without a row, one
/// short transaction that draws the fence from the namespace's counter and
/// inserts the row (rolled back, the counter unchanged, if the row appeared
/// meanwhile: the key was granted to somebody, so busy).
/// The row is held under `session` (the client's, see
/// `session_rows::choose`).
/// `probe`: a row found held is reported as such, for the caller to see
/// whether its session lapsed (`takeover::take_lapsed`); else busy.
pub(super) async fn acquire(
    conn: &mut Conn,
    s: &Statements,
    key: &str,
    (token, session, label): (OwnerToken, &[u8], &str),
    floor: u64,
    probe: bool,
) -> mysql_async::Result<Acquired> {
    let (k, tok) = (key.as_bytes(), token.to_bytes());
    let label: String = label.chars().take(255).collect();
    let t = &tok[..];
    let params: Vec<Value> = vec![
        floor.into(),
        t.into(),
        floor.into(),
        t.into(),
        label.as_str().into(),
        t.into(),
        t.into(),
        t.into(),
        session.into(),
        t.into(),
        k.into(),
    ];
    conn.exec_drop(s.take_over.as_str(), Params::Positional(params)).await?;
    if let Some(fence) = conn.last_insert_id() {
        return Ok(Acquired::Granted { fence });
    }
    // A row, not granted: another holder's, maybe of a lapsed session. No
    // row at all (or an info string this code cannot read): the insert
    // decides.
    if rows_matched(conn).is_some_and(|n| n > 0) {
        return Ok(if probe { Acquired::RowHeld } else { Acquired::Busy { expires_in: None } });
    }
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    tx.exec_drop(s.fence_next.as_str(), (floor,)).await?;
    let fence = tx.last_insert_id();
    tx.exec_drop(s.insert.as_str(), (k, t, label, session)).await?;
    if tx.affected_rows() == 1 {
        let outcome = granted(fence);
        match outcome {
            Ok(_) => tx.commit().await?,
            Err(_) => tx.rollback().await?,
        }
        return outcome;
    }
    tx.rollback().await?;
    Ok(Acquired::Busy { expires_in: None })
}

/// A grant with the fence the server reported; never a grant without one
/// (cannot happen on a server that reports `LAST_INSERT_ID(expr)`).
pub(super) fn granted(fence: Option<u64>) -> mysql_async::Result<Acquired> {
    match fence {
        Some(fence) => Ok(Acquired::Granted { fence }),
        None => Err(mysql_async::Error::Other("the server did not report the new fence value".into())),
    }
}

/// The highest fence floor [`raise_fence`] takes: 2^62. The counter is a
/// `BIGINT UNSIGNED` and would hold more, but a counter near 2^64 would fail
/// every later grant (out of range), and fences above `i64::MAX` break
/// readers that keep them signed; 2^62 leaves 2^62 fences above any floor.
/// Real floors are fences of other stores (a Redis fence, microseconds since
/// 1970, reaches 2^62 in the year 148,000).
pub(super) const MAX_FENCE_FLOOR: u64 = 1 << 62;

/// One short transaction: if `token` holds an unexpired lease of `key`
/// (exclusive or shared, not a reservation; read under the key's row lock,
/// which every grant of the key takes), the key's fence (its row's, which
/// the next grant takes + 1) raised to `floor` if it is lower (never
/// lowered); whether it held (a token that holds nothing raises nothing).
/// The caller checked `floor` against [`MAX_FENCE_FLOOR`].
pub(super) async fn raise_fence(
    conn: &mut Conn,
    s: &Statements,
    key: &str,
    token: OwnerToken,
    floor: u64,
) -> mysql_async::Result<bool> {
    let (k, tok) = (key.as_bytes(), token.to_bytes());
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    tx.exec_drop(s.lock_row.as_str(), (k,)).await?;
    let held = tx.exec_first::<i64, _, _>(s.holds.as_str(), (k, &tok[..], k, &tok[..])).await? == Some(1);
    if held {
        tx.exec_drop(s.raise_fence.as_str(), (floor, k)).await?;
    }
    tx.commit().await?;
    Ok(held)
}

/// The record kept with `key`, if one was written.
pub(super) async fn read_record(conn: &mut Conn, s: &Statements, key: &str) -> mysql_async::Result<Option<u64>> {
    conn.exec_first(s.read_record.as_str(), (key.as_bytes(),)).await
}

/// One short transaction: if `token` holds an unexpired exclusive lease of
/// `key` (exclusive or a writer; read under the key's row lock, as in
/// [`raise_fence`], so no grant commits between the check and the write),
/// the record kept with `key` set to `value`; whether it held.
pub(super) async fn write_record(
    conn: &mut Conn,
    s: &Statements,
    key: &str,
    token: OwnerToken,
    value: u64,
) -> mysql_async::Result<bool> {
    let (k, tok) = (key.as_bytes(), token.to_bytes());
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    tx.exec_drop(s.lock_row.as_str(), (k,)).await?;
    let held = tx.exec_first::<i64, _, _>(s.holds_exclusive.as_str(), (k, &tok[..], k, &tok[..])).await? == Some(1);
    if held {
        tx.exec_drop(s.write_record.as_str(), (k, value)).await?;
    }
    tx.commit().await?;
    Ok(held)
}

/// Makes the row of `token` the released marker (the row and its fence
/// stay); true if it owned one (not taken over): a row of its own expiry
/// or of `own` (the releasing client's session for the token, if it knows
/// one), uncounted.
pub(super) async fn release(
    conn: &mut Conn,
    s: &Statements,
    key: &str,
    token: OwnerToken,
    own: Option<&[u8]>,
) -> mysql_async::Result<bool> {
    conn.exec_drop(s.release.as_str(), (key.as_bytes(), &token.to_bytes()[..], own)).await?;
    Ok(conn.affected_rows() >= 1)
}

/// As [`release`], for a row held under a session the releasing client
/// does not know as the token's: the removal is counted in that session
/// (two rows changed); a row whose session row is gone is left to the
/// takeover and the sweep.
pub(super) async fn release_counted(
    conn: &mut Conn,
    s: &Statements,
    key: &str,
    token: OwnerToken,
) -> mysql_async::Result<bool> {
    conn.exec_drop(s.release_counted.as_str(), (key.as_bytes(), &token.to_bytes()[..])).await?;
    Ok(conn.affected_rows() >= 1)
}

/// The unexpired holder of `key`: (label, fence, time left).
pub(super) async fn holder(
    conn: &mut Conn,
    s: &Statements,
    key: &str,
) -> mysql_async::Result<Option<(String, u64, Duration)>> {
    let row: Option<(String, u64, Option<i64>)> = conn.exec_first(s.holder.as_str(), (key.as_bytes(),)).await?;
    Ok(row.map(|(label, fence, us)| (label, fence, left(us))))
}
