//! The PostgreSQL statements. Each lock operation is ONE statement in its own
//! (implicit) transaction, sent with the extended protocol's unnamed
//! statement (`query_typed`: Parse/Bind/Execute/Sync in one round trip), so
//! nothing depends on session state and a transaction-pooling PgBouncer can
//! hand every statement to a different server connection.
//!
//! Only two identifiers are ever interpolated: the schema and the table name,
//! checked by [`check_ident`](super::config::check_ident) (`[a-z_][a-z0-9_]*`)
//! and double-quoted. Keys, tokens, labels, TTLs and the channel name are
//! always bind parameters.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::config::PostgresConfig;
use super::error::{map_err, timed_out};
use super::pool::statement_lost;
use super::{PostgresBackend, STORE};
use crate::backend::{AcquireRequest, Grant};
use crate::capability::FenceDurability;
use crate::error::{Error, Result};
use crate::key::OwnerToken;
use crate::wait::Attempt;

/// The SQL of one namespace (schema + table).
#[derive(Debug, Clone)]
pub(super) struct Statements {
    /// `"schema"."table"` as text, for `to_regclass`.
    pub lease_regclass: String,
    /// `"schema"."table_fence"` as text, for `to_regclass`.
    pub fence_regclass: String,
    /// `"schema"."table_shares"` as text, for `to_regclass`.
    pub shares_regclass: String,
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
    /// `$1 keys[], $2 tokens[], $3 ttl_ms[], $4 gate token` -> the 1-based positions renewed.
    pub renew: String,
    /// `$1 key, $2 gate token` -> `(label, fence, ms left)` of the unexpired exclusive holder.
    pub status: String,
    /// Deletes up to 16 rows whose lease ran out more than a minute ago.
    pub sweep: String,
    /// `$1 key, $2 token, $3 floor` -> `(held)`: the counter raised to the
    /// floor if lower; whether the token holds an unexpired lease of the key.
    pub raise_fence: String,
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
        }
    }

    pub(super) fn new(config: &PostgresConfig) -> Self {
        // Both names are checked identifiers ([a-z_][a-z0-9_]*), quoted anyway.
        let schema = format!("\"{}\"", config.schema);
        let t = format!("{schema}.\"{}\"", config.table);
        let f = format!("{schema}.\"{}_fence\"", config.table);
        let sh = format!("{schema}.\"{}_shares\"", config.table);
        // The advisory lock only serialises concurrent first-use DDL of this namespace.
        let lock_id = config.namespace_hash() as i64;
        Statements {
            lease_regclass: t.clone(),
            fence_regclass: f.clone(),
            shares_regclass: sh.clone(),
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
                grant = grant_ctes(&t, &f, "$6"),
            ),
            // `acquire` without `w`.
            acquire_free: format!("{grant}) {GRANT_COLUMNS}, false", grant = grant_ctes(&t, &f, "$5")),
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
            // (its `token` is the gate token only while shares hold the key).
            renew: format!(
                "WITH r AS (
                     SELECT * FROM unnest($1::text[], $2::bytea[], $3::int8[]) WITH ORDINALITY AS r(key, token, ttl_ms, i)
                 ), l AS (
                     UPDATE {t} AS l SET expires_at = clock_timestamp() + r.ttl_ms * interval '1 millisecond'
                     FROM r WHERE l.key = r.key AND l.token = r.token AND l.expires_at > clock_timestamp()
                     RETURNING r.i
                 ), s AS (
                     UPDATE {sh} AS x SET expires_at = clock_timestamp() + r.ttl_ms * interval '1 millisecond'
                     FROM r WHERE x.key = r.key AND x.token = r.token AND x.held AND x.expires_at > clock_timestamp()
                     RETURNING r.i, x.key, x.expires_at
                 ), g AS (
                     UPDATE {t} AS gt SET expires_at = greatest(gt.expires_at, m.e)
                     FROM (SELECT key, max(expires_at) AS e FROM s GROUP BY key) m
                     WHERE gt.key = m.key AND gt.token = $4
                     RETURNING 1
                 )
                 SELECT i FROM l UNION ALL SELECT i FROM s"
            ),
            status: format!(
                "SELECT label, fence, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::int8
                 FROM {t} WHERE key = $1 AND expires_at > clock_timestamp() AND token <> $2"
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
        }
    }
}

/// Cancels the statement running on a connection when dropped armed: a
/// statement the client stopped waiting for must not run on at the server.
struct CancelOnDrop(Option<(tokio_postgres::CancelToken, tokio_postgres_rustls::MakeRustlsConnect)>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some((token, tls)) = self.0.take() else { return };
        // Best effort, off the caller's path; needs a runtime (a statement
        // dropped outside one was never polled on a server anyway).
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = token.cancel_query(tls).await {
                    tracing::debug!(error = %e, "cancelling an abandoned statement failed");
                }
            });
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
}

impl Stmt {
    /// How many there are (the size of a connection's prepared set).
    pub(super) const COUNT: usize = 7;
}

/// The highest fence floor [`raise_fence`](PostgresBackend::raise_fence_to)
/// takes: 2^62, so that the namespace's counter (a signed `bigint`) keeps
/// 2^62 fences above any floor and can never overflow. Real floors are
/// fences of other stores (a Redis fence, microseconds since 1970, reaches
/// 2^62 in the year 148,000).
pub(super) const MAX_FENCE_FLOOR: u64 = 1 << 62;

impl PostgresBackend {
    /// Creates the namespace if needed; returns the fence durability the
    /// server's settings give.
    pub(super) async fn init(&self) -> Result<FenceDurability> {
        let i = &self.inner;
        let timeout = i.config.op_timeout;
        let fut = async {
            let c = i.pool.get(None).await?;
            let row = c
                .client
                .query_typed_one(
                    "SELECT to_regclass($2) IS NOT NULL AND to_regclass($3) IS NOT NULL AND EXISTS (
                                SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'wanted'),
                            current_setting('fsync'), current_setting('synchronous_commit')",
                    &[
                        (&i.sql.lease_regclass, Type::TEXT),
                        (&i.sql.fence_regclass, Type::TEXT),
                        (&i.sql.shares_regclass, Type::TEXT),
                    ],
                )
                .await
                .map_err(map_err)?;
            let exists: bool = row.try_get(0).map_err(map_err)?;
            if !exists {
                if !i.config.create {
                    return Err(Error::backend(
                        STORE,
                        false,
                        format!(
                            "tables {} / {} / {} do not exist and create=false; run the migration in the store docs",
                            i.sql.lease_regclass, i.sql.fence_regclass, i.sql.shares_regclass
                        ),
                    ));
                }
                c.client.batch_execute(&i.sql.create).await.map_err(map_err)?;
            }
            let fsync: String = row.try_get(1).map_err(map_err)?;
            let sync_commit: String = row.try_get(2).map_err(map_err)?;
            Ok(match (fsync.as_str(), sync_commit.as_str()) {
                (_, "off") => FenceDurability::Volatile,
                ("on", _) => FenceDurability::Durable,
                _ => FenceDurability::ProcessCrash,
            })
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| timed_out("connecting and creating tables", timeout))?
    }

    /// Runs one statement on a pooled connection, within `op_timeout`.
    /// `key` picks the connection (see [`Pool`](super::pool::Pool)); `None` for multi-key statements.
    pub(super) async fn query(
        &self,
        what: &str,
        key: Option<&str>,
        stmt: Stmt,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        let timeout = self.inner.config.op_timeout;
        let sql = self.inner.sql.get(stmt);
        // One timer for the connection and the statement: a timer entry is
        // registered and removed per call, and this is the hot path.
        let fut = async {
            let c = match stmt {
                Stmt::Renew => self.inner.pool.renewal().await?,
                _ => self.inner.pool.get(key).await?,
            };
            // A renewal abandoned here (timed out, or its caller dropped) is
            // cancelled on the server too: an abandoned renewal of thousands of
            // rows would otherwise run on, and its retry wait on its row locks.
            // Nothing else is: a cancel request ends whatever its connection runs
            // when it arrives, and the other statements share their connection
            // with other keys' statements and with the release that cleans up
            // after them (renewal has a connection of its own; a cancel that
            // lands on another renewal there fails that renewal call, which the
            // renewer retries like any failed renewal).
            let cancels = matches!(stmt, Stmt::Renew);
            let mut cancel = CancelOnDrop(cancels.then(|| (c.client.cancel_token(), self.inner.pool.tls.clone())));
            let outcome = self.run(&c, stmt, sql, params).await;
            cancel.0 = None;
            outcome
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| timed_out(what, timeout))?
    }

    /// Sends one statement on `c`: its named prepared statement where
    /// allowed (prepared on first use; the parameter types are only
    /// collected then), else the unnamed one.
    async fn run(
        &self,
        c: &super::pool::Conn,
        stmt: Stmt,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        if c.named && self.inner.prepared.load(Ordering::Relaxed) {
            let prepare = || {
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                async move { c.client.prepare_typed(sql, &types).await }
            };
            let outcome = match c.prepared[stmt as usize].get_or_try_init(prepare).await {
                Ok(st) => c.client.query_raw(st, params.iter().map(|(v, _)| *v)).await,
                Err(e) => Err(e),
            };
            let outcome = match outcome {
                Ok(stream) => stream.try_collect::<Vec<Row>>().await,
                Err(e) => Err(e),
            };
            match outcome {
                Ok(rows) => return Ok(rows),
                Err(e) if statement_lost(&e) => {
                    // Nothing ran; from now on use unnamed statements.
                    tracing::warn!(error = %e, "prepared statements do not work here (a pooler without support \
                         for them?); using unnamed statements (prepared=auto or false skips this)");
                    self.inner.prepared.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(map_err(e)),
            }
        }
        c.client.query_typed(sql, params).await.map_err(map_err)
    }

    /// One acquire statement. A waiting attempt (`waiting`: the task is
    /// registered in [`WaitingKeys`](super::listener::WaitingKeys)) that
    /// finds the key busy marks the row `wanted`, so its release will
    /// NOTIFY; if it could not (the row changed since the statement's
    /// snapshot), it asks to be retried at once rather than sleep through an
    /// unannounced release.
    ///
    /// An attempt that is not waiting sends the shorter
    /// [`acquire_free`](Statements::acquire_free): it registers nothing.
    pub(super) async fn attempt(&self, req: &AcquireRequest, waiting: bool) -> Result<Attempt> {
        let started = Instant::now();
        let token = req.token.to_bytes();
        let token = &token[..];
        let ttl_ms = req.ttl.as_millis() as i64;
        let key = req.key.as_str();
        let register = waiting;
        // Other waiters of this key in this client: the new row starts wanted.
        let others_wait = self.inner.waiting.count(key) > usize::from(waiting);
        let rows = if waiting {
            let params: [(&(dyn ToSql + Sync), Type); 6] = [
                (&key, Type::TEXT),
                (&token, Type::BYTEA),
                (&ttl_ms, Type::INT8),
                (&req.label, Type::TEXT),
                (&register, Type::BOOL),
                (&others_wait, Type::BOOL),
            ];
            self.query("acquire", Some(key), Stmt::Acquire, &params).await?
        } else {
            let params: [(&(dyn ToSql + Sync), Type); 5] = [
                (&key, Type::TEXT),
                (&token, Type::BYTEA),
                (&ttl_ms, Type::INT8),
                (&req.label, Type::TEXT),
                (&others_wait, Type::BOOL),
            ];
            self.query("acquire", Some(key), Stmt::AcquireFree, &params).await?
        };
        let row = rows.first().ok_or_else(|| Error::backend(STORE, false, "acquire returned no row"))?;
        let granted: Option<i64> = row.try_get(0).map_err(map_err)?;
        let mine: Option<i64> = row.try_get(1).map_err(map_err)?;
        let left_ms: Option<i64> = row.try_get(2).map_err(map_err)?;
        let registered: bool = row.try_get(3).map_err(map_err)?;
        let left = left_ms.map(|ms| Duration::from_millis(ms.max(0) as u64));
        Ok(match granted.or(mine) {
            Some(fence) => Attempt::Granted(Grant::new(fence as u64, started, req.ttl)),
            None if register && !registered => Attempt::Busy { expires_in: Some(Duration::ZERO) },
            None => Attempt::Busy { expires_in: left },
        })
    }

    /// One statement: if `token` holds an unexpired lease of `key`
    /// (exclusive or shared, not a reservation), the namespace's fence
    /// counter raised to `floor` if it is lower (never lowered), so every
    /// later grant of any key of the namespace gets a fence above it; whether
    /// it held (a token that holds nothing raises nothing).
    pub(super) async fn raise_fence_to(&self, key: &str, token: OwnerToken, floor: u64) -> Result<bool> {
        if floor > MAX_FENCE_FLOOR {
            return Err(Error::invalid(
                "fence floor",
                format!("{floor} is above 2^62, the highest floor the PostgreSQL store takes"),
            ));
        }
        // At most 2^62: fits the signed bigint column.
        let floor = floor as i64;
        let token = token.to_bytes().to_vec();
        let rows = self
            .query(
                "raise fence",
                Some(key),
                Stmt::RaiseFence,
                &[(&key, Type::TEXT), (&token, Type::BYTEA), (&floor, Type::INT8)],
            )
            .await?;
        let row = rows.first().ok_or_else(|| Error::backend(STORE, false, "raise fence returned no row"))?;
        row.try_get(0).map_err(map_err)
    }

    /// At most once a minute per client: delete a few rows whose holders
    /// vanished long ago and whose keys nobody took since.
    pub(super) async fn maybe_sweep(&self) {
        let i = &self.inner;
        let now = i.epoch.elapsed().as_millis() as u64;
        let last = i.last_sweep_ms.load(Ordering::Relaxed);
        if (last != 0 && now.saturating_sub(last) < 60_000)
            || i.last_sweep_ms.compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return;
        }
        if let Err(e) = self.query("sweep", None, Stmt::Sweep, &[]).await {
            tracing::debug!(error = %e, "sweep of expired lease rows failed");
        }
    }
}

/// The columns both acquire statements return: the granted fence, the
/// holder's own fence on a retry, and the holder's time left.
const GRANT_COLUMNS: &str = "SELECT (SELECT fence FROM ins), (SELECT fence FROM mine),
        (SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::int8 FROM cur)";

/// The CTEs `cur`, `f`, `ins` and `mine` of the acquire statements (see
/// `acquire` in [`Statements::new`]), up to and without the closing
/// parenthesis of `mine`, on lease table `t` and fence table `f`; `wanted`
/// is the parameter a new row's `wanted` starts from.
fn grant_ctes(t: &str, f: &str, wanted: &str) -> String {
    format!(
        "WITH cur AS (
                     SELECT token, fence, expires_at, wanted FROM {t}
                     WHERE key = $1 AND expires_at > clock_timestamp()
                 ), f AS (
                     UPDATE {f} SET value = value + 1
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
