//! Shared leases (writers, semaphore permits, readers) on PostgreSQL.
//!
//! The mutex keeps its one-statement path on the lease table. Shares and
//! reservations live in `<table>_shares`, one row per (key, token), and the
//! key's lease row is their **gate**: while shares are held it carries the
//! token [`GATE`] (drawn by no client) and an expiry no earlier than any held
//! share's, so the mutex's statements see the key as held without reading
//! the shares table, and a mutex grant takes the gate row's lock, which
//! every shared transaction holds from its first statement to its commit.
//!
//! A shared acquire is one transaction on a connection of its own: lock (or
//! create) the gate row, read the key's shares, decide by the lease model's
//! one admission rule ([`admission::decide`]) and write. Releasing a share
//! is the release statement (which deletes it and notifies) followed by a
//! transaction that shrinks the gate to the latest remaining share, read
//! after the gate's lock was taken, so a share granted meanwhile is seen.
//! Until that shrink lands the gate is only longer than needed.

use std::time::{Duration, Instant};

use tokio_postgres::Client as PgClient;
use tokio_postgres::types::{ToSql, Type};

use super::PostgresBackend;
use super::config::PostgresConfig;
use super::error::map_err;
use super::gate::GATE;
use super::session::{held_session_sql, until_sql};
use crate::backend::admission::{self, Decision, Row};
use crate::backend::wait::Attempt;
use crate::backend::{AcquireRequest, Grant, HolderInfo, LeaseMode};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

/// The statements of shared leases (schema and table names checked and
/// quoted as in [`Statements`](super::statements::Statements); all values bound).
#[derive(Debug)]
pub(super) struct ShareSql {
    lock_gate: String,
    make_gate: String,
    rows: String,
    fence_next: String,
    place_next: String,
    upsert: String,
    gate_to_shares: String,
    grant_share: String,
    grant_writer: String,
    extend_writer: String,
    extend_share: String,
    drop_reservation: String,
    mark_wanted: String,
    lock_row: String,
    shrink: String,
    notify: String,
    list: String,
    resize: String,
    relabel: String,
    lease_to_gate: String,
}

const LEFT_MS: &str = "(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::int8";
const UNTIL: &str = "clock_timestamp() + $2::int8 * interval '1 millisecond'";

impl ShareSql {
    pub(super) fn new(config: &PostgresConfig) -> Self {
        let schema = format!("\"{}\"", config.schema);
        let t = format!("{schema}.\"{}\"", config.table);
        let f = format!("{schema}.\"{}_fence\"", config.table);
        let s = format!("{schema}.\"{}_shares\"", config.table);
        let ss = format!("{schema}.\"{}_sess\"", config.table);
        let u = until_sql("g", &ss);
        let hs = held_session_sql("l");
        ShareSql {
            // The key's lease row, locked until commit (its latest version).
            // A row that lives with a session is free only once `lapse`
            // counted the removal in that session row, under its lock and
            // re-checked on its latest version (model pg_session: a
            // renewal in flight commits first); a session the statement's
            // snapshot cannot see (made after it) keeps the row held.
            lock_gate: format!(
                "WITH g AS (
                     SELECT token, fence, expires_at, {hs} AS session, wanted FROM {t} AS l WHERE key = $1 FOR UPDATE
                 ), lapse AS (
                     UPDATE {ss} SET removed = removed + 1
                     WHERE id = (SELECT session FROM g) AND expires_at <= clock_timestamp()
                     RETURNING id
                 )
                 SELECT token, fence,
                        CASE WHEN session IS NULL THEN expires_at > clock_timestamp()
                             ELSE NOT EXISTS (SELECT 1 FROM lapse) END,
                        (extract(epoch FROM {u} - clock_timestamp()) * 1000)::int8, wanted
                 FROM g"
            ),
            // A key without a row: an expired gate row made with a fence from
            // the namespace counter (row 1, taken before the row, as a mutex
            // grant of a key without a row takes it), or the row made since,
            // locked; either way locked until commit.
            make_gate: format!(
                "WITH f AS (UPDATE {f} SET value = value + 1 WHERE id = 1 RETURNING value)
                 INSERT INTO {t} AS l (key, token, fence, label, acquired_at, expires_at, wanted)
                 SELECT $1, $2, f.value, '', clock_timestamp(), timestamptz 'epoch', false FROM f
                 ON CONFLICT (key) DO UPDATE SET wanted = l.wanted
                 RETURNING token, fence, expires_at > clock_timestamp(), {LEFT_MS}, wanted"
            ),
            rows: format!(
                "SELECT token, mode, weight, limit_n, held, fence, {LEFT_MS}
                 FROM {s} WHERE key = $1 AND expires_at > clock_timestamp()"
            ),
            // The key's next fence, from its (locked) lease row: above every
            // earlier grant of the key, shared or exclusive, and every place.
            fence_next: format!(
                "UPDATE {t} SET fence = greatest(fence, (SELECT coalesce(max(fence), 0) FROM {s} WHERE key = $1)) + 1
                 WHERE key = $1 RETURNING fence"
            ),
            // A reservation's place: after every fence and place of the key,
            // written nowhere but the reservation (an exclusive holder's
            // fence in the row stays its own).
            place_next: format!(
                "SELECT greatest((SELECT fence FROM {t} WHERE key = $1),
                                 (SELECT max(fence) FROM {s} WHERE key = $1)) + 1"
            ),
            upsert: format!(
                "INSERT INTO {s} (key, token, mode, weight, limit_n, held, fence, label, acquired_at, expires_at)
                 VALUES ($1, $3, $4, $5, $6, $7, $8, $9, clock_timestamp(), {UNTIL})
                 ON CONFLICT (key, token) DO UPDATE SET mode = excluded.mode, weight = excluded.weight,
                     limit_n = excluded.limit_n, held = excluded.held, fence = excluded.fence,
                     label = excluded.label, acquired_at = excluded.acquired_at, expires_at = excluded.expires_at"
            ),
            gate_to_shares: format!(
                "UPDATE {t} SET fence = greatest(fence, $4), label = '',
                     expires_at = greatest(CASE WHEN token = $3 THEN expires_at ELSE timestamptz 'epoch' END, {UNTIL}),
                     token = $3, session = NULL
                 WHERE key = $1"
            ),
            // A share's grant in one statement: `fence_next`, then
            // `gate_to_shares` with that fence (one update of the gate
            // row: its old token and expiry read before it), and the
            // share's row held at that fence.
            grant_share: format!(
                "WITH g AS (
                     UPDATE {t} SET fence = greatest(fence, (SELECT coalesce(max(fence), 0) FROM {s} WHERE key = $1)) + 1,
                         label = '',
                         expires_at = greatest(CASE WHEN token = $3 THEN expires_at ELSE timestamptz 'epoch' END, {UNTIL}),
                         token = $3, session = NULL
                     WHERE key = $1 RETURNING fence
                 )
                 INSERT INTO {s} (key, token, mode, weight, limit_n, held, fence, label, acquired_at, expires_at)
                 SELECT $1, $4, $5, $6, $7, true, g.fence, $8, clock_timestamp(), {UNTIL} FROM g
                 ON CONFLICT (key, token) DO UPDATE SET mode = excluded.mode, weight = excluded.weight,
                     limit_n = excluded.limit_n, held = excluded.held, fence = excluded.fence,
                     label = excluded.label, acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
                 RETURNING fence"
            ),
            // Keeps a mark it finds: in this two-call form the writer may
            // take the key between a share's delete and the gate's shrink,
            // past a mutex waiter that woke, found the gate still marked
            // and slept on that mark (model 21, finding (b)). The
            // function's form is one commit and cannot be passed so, and
            // a kept mark there would make every later share release of
            // the key notify.
            grant_writer: format!(
                "UPDATE {t} SET token = $3, fence = $4, label = $5, acquired_at = clock_timestamp(),
                     expires_at = {UNTIL}, wanted = $6 OR wanted, session = NULL
                 WHERE key = $1"
            ),
            extend_writer: format!("UPDATE {t} SET expires_at = {UNTIL} WHERE key = $1 AND token = $3"),
            extend_share: format!("UPDATE {s} SET expires_at = {UNTIL} WHERE key = $1 AND token = $3 AND held"),
            drop_reservation: format!("DELETE FROM {s} WHERE key = $1 AND token = $2"),
            mark_wanted: format!("UPDATE {t} SET wanted = true WHERE key = $1"),
            lock_row: format!("SELECT wanted FROM {t} WHERE key = $1 FOR UPDATE"),
            shrink: format!(
                "UPDATE {t} SET expires_at = coalesce(
                     (SELECT max(expires_at) FROM {s} WHERE key = $1 AND held), timestamptz 'epoch')
                 WHERE key = $1 AND token = $2
                 RETURNING wanted"
            ),
            notify: "SELECT pg_notify($1, $2)".to_owned(),
            // Keeps the row's fence and expiry (no later than the share's:
            // the same; a session's expiry becomes the row's own).
            lease_to_gate: format!(
                "UPDATE {t} AS l SET token = $3, label = '', expires_at = {ul}, session = NULL
                 WHERE key = $1 AND token = $2",
                ul = until_sql("l", &ss)
            ),
            list: format!(
                "SELECT label, fence, {LEFT_MS}, weight, limit_n FROM {s}
                 WHERE key = $1 AND held AND expires_at > clock_timestamp() ORDER BY fence"
            ),
            resize: format!(
                "WITH u AS (
                     UPDATE {s} SET limit_n = $2
                     WHERE key = $1 AND mode = {mode} AND expires_at > clock_timestamp()
                     RETURNING held, weight
                 )
                 SELECT coalesce(sum(weight) FILTER (WHERE held), 0)::int8 FROM u",
                mode = admission::MODE_SHARED
            ),
            relabel: format!(
                "WITH a AS (
                     UPDATE {t} AS l SET label = $3 WHERE key = $1 AND token = $2 AND {ul} > clock_timestamp()
                     RETURNING 1
                 ), b AS (
                     UPDATE {s} SET label = $3
                     WHERE key = $1 AND token = $2 AND held AND expires_at > clock_timestamp()
                     RETURNING 1
                 )
                 SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM b)",
                ul = until_sql("l", &ss)
            ),
        }
    }
}

/// What a shared acquire transaction decided.
enum Outcome {
    Granted(u64),
    Busy(Option<i64>),
    Conflict(String),
}

impl PostgresBackend {
    /// One attempt of a writer or a share; a waiting attempt (`reserve`)
    /// leaves a reservation when refused.
    pub(super) async fn attempt_shared(&self, req: &AcquireRequest, reserve: bool) -> Result<Attempt> {
        let started = Instant::now();
        if self.inner.share_fns.load(std::sync::atomic::Ordering::Relaxed) {
            match self.attempt_shared_in_server(req, reserve, started).await {
                Err(e) if self.functions_gone(&e) => {}
                outcome => return outcome,
            }
        }
        let sql = &self.inner.shares;
        let key = req.key.as_str();
        let token = req.token.to_bytes();
        let (tok, gate) = (token.to_vec(), GATE.to_vec());
        let ttl_ms = req.ttl.as_millis() as i64;
        let (mode, weight, limit) = admission::encode(req.mode);
        let mode = mode as i16;
        let outcome = self
            .transaction("acquire", async |c| {
                let by_key = [(&key as &(dyn ToSql + Sync), Type::TEXT), (&gate, Type::BYTEA)];
                // The shares are read in the same round trip, right after
                // the gate's lock is taken (the server runs the two in
                // order, so the read's snapshot is taken under the lock).
                let (g, shares) = futures::future::join(
                    c.query_typed(&sql.lock_gate, &by_key[..1]),
                    c.query_typed(&sql.rows, &[(&key, Type::TEXT)]),
                )
                .await;
                let (g, shares) = match g.map_err(map_err)?.pop() {
                    Some(g) => (g, shares.map_err(map_err)?),
                    // No row: made (or found made since) and locked; the
                    // shares read again under that lock.
                    None => (
                        c.query_typed_one(&sql.make_gate, &by_key).await.map_err(map_err)?,
                        c.query_typed(&sql.rows, &[(&key, Type::TEXT)]).await.map_err(map_err)?,
                    ),
                };
                let gate_token: Vec<u8> = g.try_get(0).map_err(map_err)?;
                let gate_fence: i64 = g.try_get(1).map_err(map_err)?;
                let gate_live: bool = g.try_get(2).map_err(map_err)?;
                let gate_wanted: bool = g.try_get(4).map_err(map_err)?;
                let mut soonest: Option<i64> = None;
                let mut rows = Vec::new();
                if gate_live && gate_token != GATE {
                    let token = gate_token.clone().try_into().unwrap_or(GATE);
                    rows.push(Row { token, mode: LeaseMode::Exclusive, held: true, order: gate_fence as u64 });
                    soonest = Some(g.try_get(3).map_err(map_err)?);
                }
                for r in shares {
                    let t: Vec<u8> = r.try_get(0).map_err(map_err)?;
                    let held: bool = r.try_get(4).map_err(map_err)?;
                    if held {
                        let left: i64 = r.try_get(6).map_err(map_err)?;
                        soonest = Some(soonest.map_or(left, |s| s.min(left)));
                    }
                    rows.push(Row {
                        token: t.try_into().unwrap_or(GATE),
                        mode: admission::decode(
                            r.try_get::<_, i16>(1).map_err(map_err)?.into(),
                            r.try_get(2).map_err(map_err)?,
                            r.try_get(3).map_err(map_err)?,
                        ),
                        held,
                        order: r.try_get::<_, i64>(5).map_err(map_err)? as u64,
                    });
                }
                let others_wait = rows.iter().any(|r| !r.held && r.token != token);
                let next = async |stmt: &str| -> Result<i64> {
                    c.query_typed_one(stmt, &by_key[..1]).await.map_err(map_err)?.try_get(0).map_err(map_err)
                };
                let base = [(&key as &(dyn ToSql + Sync), Type::TEXT), (&ttl_ms, Type::INT8)];
                // The share row, held or a reservation, at `order` (its fence or place).
                let upsert = async |held: bool, order: i64| -> Result<()> {
                    let row = [
                        base[0].clone(),
                        base[1].clone(),
                        (&tok, Type::BYTEA),
                        (&mode, Type::INT2),
                        (&weight, Type::INT8),
                        (&limit, Type::INT8),
                        (&held, Type::BOOL),
                        (&order, Type::INT8),
                        (&req.label, Type::TEXT),
                    ];
                    c.query_typed(&sql.upsert, &row).await.map_err(map_err).map(|_| ())
                };
                Ok(match admission::decide(token, req.mode, &rows) {
                    Decision::AlreadyHeld { fence } => {
                        // A retry whose reply was lost: the lease counted from now.
                        let stmt = if gate_token == token { &sql.extend_writer } else { &sql.extend_share };
                        c.query_typed(stmt, &[base[0].clone(), base[1].clone(), (&tok, Type::BYTEA)])
                            .await
                            .map_err(map_err)?;
                        if gate_token != token {
                            let f = fence as i64;
                            c.query_typed(
                                &sql.gate_to_shares,
                                &[base[0].clone(), base[1].clone(), (&gate, Type::BYTEA), (&f, Type::INT8)],
                            )
                            .await
                            .map_err(map_err)?;
                        }
                        Outcome::Granted(fence)
                    }
                    Decision::Grant if !req.mode.is_exclusive() => {
                        let row = [
                            base[0].clone(),
                            base[1].clone(),
                            (&gate, Type::BYTEA),
                            (&tok, Type::BYTEA),
                            (&mode, Type::INT2),
                            (&weight, Type::INT8),
                            (&limit, Type::INT8),
                            (&req.label, Type::TEXT),
                        ];
                        let g = c.query_typed_one(&sql.grant_share, &row).await.map_err(map_err)?;
                        Outcome::Granted(g.try_get::<_, i64>(0).map_err(map_err)? as u64)
                    }
                    Decision::Grant => {
                        let fence = next(&sql.fence_next).await?;
                        c.query_typed(
                            &sql.grant_writer,
                            &[
                                base[0].clone(),
                                base[1].clone(),
                                (&tok, Type::BYTEA),
                                (&fence, Type::INT8),
                                (&req.label, Type::TEXT),
                                (&others_wait, Type::BOOL),
                            ],
                        )
                        .await
                        .map_err(map_err)?;
                        c.query_typed(&sql.drop_reservation, &[(&key, Type::TEXT), (&tok, Type::BYTEA)])
                            .await
                            .map_err(map_err)?;
                        Outcome::Granted(fence as u64)
                    }
                    Decision::Refuse { reserve: true, keep_order } if reserve => {
                        let place = match keep_order {
                            Some(place) => place as i64,
                            None => next(&sql.place_next).await?,
                        };
                        upsert(false, place).await?;
                        // So that the releases that may admit it notify: the
                        // row is locked, so a mark read is there until this
                        // commits, and stays until a grant (as a mutex
                        // waiter's, model pg_wakeup); no new row version.
                        if !gate_wanted {
                            c.query_typed(&sql.mark_wanted, &[(&key, Type::TEXT)]).await.map_err(map_err)?;
                        }
                        Outcome::Busy(soonest)
                    }
                    Decision::Refuse { .. } => Outcome::Busy(soonest),
                    Decision::Conflict(reason) => Outcome::Conflict(reason),
                })
            })
            .await?;
        match outcome {
            Outcome::Granted(fence) => Ok(Attempt::Granted(Grant::new(fence, started, req.ttl))),
            Outcome::Busy(left) => {
                Ok(Attempt::Busy { expires_in: Some(Duration::from_millis(left.unwrap_or(0).max(0) as u64)) })
            }
            Outcome::Conflict(reason) => Err(Error::Conflict { key: key.to_owned(), reason }),
        }
    }

    /// Makes `token`'s lease row of `key` the gate of its shares, inside a
    /// transaction `c` that wrote the lease's held share (a shrink of a
    /// writer to a share).
    pub(super) async fn lease_to_gate(&self, c: &PgClient, key: &str, token: &[u8]) -> Result<()> {
        let gate = GATE.to_vec();
        c.query_typed(
            &self.inner.shares.lease_to_gate,
            &[(&key, Type::TEXT), (&token, Type::BYTEA), (&gate, Type::BYTEA)],
        )
        .await
        .map_err(map_err)
        .map(|_| ())
    }

    /// Locks `key`'s gate row (the lease row) in transaction `c`, as every
    /// shared transaction does first.
    pub(super) async fn lock_gate(&self, c: &PgClient, key: &str) -> Result<()> {
        c.query_typed(&self.inner.shares.lock_row, &[(&key, Type::TEXT)]).await.map_err(map_err).map(|_| ())
    }

    /// After a held share was released: the gate down to the latest
    /// remaining share (or expired), and the waiters told.
    pub(super) async fn shrink_gate(&self, key: &str) -> Result<()> {
        let sql = &self.inner.shares;
        let gate = GATE.to_vec();
        if self.inner.share_fns.load(std::sync::atomic::Ordering::Relaxed) {
            match self.shrink_gate_in_server(key).await {
                Err(e) if self.functions_gone(&e) => {}
                outcome => return outcome,
            }
        }
        self.transaction("release", async |c| {
            // One round trip: the server runs the shrink after the lock is
            // taken, so its read of the shares is taken under the lock.
            let (locked, rows) = futures::future::join(
                c.query_typed(&sql.lock_row, &[(&key, Type::TEXT)]),
                c.query_typed(&sql.shrink, &[(&key, Type::TEXT), (&gate, Type::BYTEA)]),
            )
            .await;
            locked.map_err(map_err)?;
            let rows = rows.map_err(map_err)?;
            if rows.iter().any(|r| r.try_get::<_, bool>(0).unwrap_or(true)) {
                c.query_typed(&sql.notify, &[(&self.inner.channel, Type::TEXT), (&key, Type::TEXT)])
                    .await
                    .map_err(map_err)?;
            }
            Ok(())
        })
        .await
    }

    /// The key's held shares and the limit recorded with them.
    pub(super) async fn shares_of(&self, key: &LockKey) -> Result<(Vec<HolderInfo>, Option<u32>)> {
        let sql = &self.inner.shares;
        let key = key.as_str();
        let rows = self
            .transaction("status", async |c| c.query_typed(&sql.list, &[(&key, Type::TEXT)]).await.map_err(map_err))
            .await?;
        let mut limit = None;
        let mut shares = Vec::with_capacity(rows.len());
        for r in rows {
            let left: i64 = r.try_get(2).map_err(map_err)?;
            let l: i64 = r.try_get(4).map_err(map_err)?;
            limit = Some(l.clamp(0, i64::from(u32::MAX)) as u32);
            shares.push(HolderInfo {
                label: r.try_get(0).map_err(map_err)?,
                fence: r.try_get::<_, i64>(1).map_err(map_err)? as u64,
                ttl_left: Some(Duration::from_millis(left.max(0) as u64)),
                weight: r.try_get::<_, i64>(3).map_err(map_err)?.clamp(0, i64::from(u32::MAX)) as u32,
            });
        }
        Ok((shares, limit))
    }

    /// [`Backend::resize`](crate::backend::Backend::resize).
    pub(super) async fn resize_shares(&self, key: &LockKey, limit: u32) -> Result<u64> {
        let (sql, key, limit) = (&self.inner.shares, key.as_str(), i64::from(limit));
        self.transaction("resize", async |c| {
            let row =
                c.query_typed_one(&sql.resize, &[(&key, Type::TEXT), (&limit, Type::INT8)]).await.map_err(map_err)?;
            Ok(row.try_get::<_, i64>(0).map_err(map_err)?.max(0) as u64)
        })
        .await
    }

    /// [`Backend::relabel`](crate::backend::Backend::relabel).
    pub(super) async fn relabel_lease(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        let (sql, key, tok) = (&self.inner.shares, key.as_str(), token.to_bytes().to_vec());
        self.transaction("relabel", async |c| {
            let row = c
                .query_typed_one(&sql.relabel, &[(&key, Type::TEXT), (&tok, Type::BYTEA), (&label, Type::TEXT)])
                .await
                .map_err(map_err)?;
            Ok(row.try_get::<_, i64>(0).map_err(map_err)? > 0)
        })
        .await
    }
}
