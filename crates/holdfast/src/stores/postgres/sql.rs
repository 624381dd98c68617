//! The PostgreSQL store's calls (the statements' text is in
//! `statements.rs`). Each lock operation is ONE statement in its own
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

use super::ddl::{KEEP_TRIGGER, REFUSE_TRIGGER};
use super::error::{PgError, map_err, timed_out};
use super::pool::statement_lost;
#[cfg(doc)]
use super::statements::Statements;
use super::statements::Stmt;
use super::{PostgresBackend, STORE};
use crate::backend::session_book::{SessionBook, SessionChoice, SessionId};
use crate::backend::wait::Attempt;
use crate::backend::{AcquireRequest, Grant};
use crate::vocabulary::capability::FenceDurability;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::OwnerToken;

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
                            current_setting('fsync'), current_setting('synchronous_commit'),
                            to_regclass($4) IS NOT NULL,
                            EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass($1) AND tgname = $5)
                            AND EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass($2) AND tgname = $6)
                            AND to_regclass($7) IS NOT NULL AND EXISTS (
                                SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'session'),
                            (SELECT count(*) FROM pg_proc WHERE oid IN (to_regprocedure($8), to_regprocedure($9))
                                AND $10 = ANY(proconfig)) = 2,
                            to_regprocedure($8) IS NOT NULL AND to_regprocedure($9) IS NOT NULL",
                    &[
                        (&i.sql.lease_regclass, Type::TEXT),
                        (&i.sql.fence_regclass, Type::TEXT),
                        (&i.sql.shares_regclass, Type::TEXT),
                        (&i.sql.records_regclass, Type::TEXT),
                        (&KEEP_TRIGGER, Type::TEXT),
                        (&REFUSE_TRIGGER, Type::TEXT),
                        (&i.sql.sessions_regclass, Type::TEXT),
                        (&i.sql.fns.sigs[0], Type::TEXT),
                        (&i.sql.fns.sigs[1], Type::TEXT),
                        (&super::share_fns::PLAN_SETTING, Type::TEXT),
                    ],
                )
                .await
                .map_err(map_err)?;
            let exists: bool = row.try_get(0).map_err(map_err)?;
            let per_key_fences: bool = row.try_get(4).map_err(map_err)?;
            if !exists || !per_key_fences {
                if !i.config.create {
                    let what = if exists {
                        format!(
                            "namespace {} has no per-key fences (triggers {KEEP_TRIGGER} / {REFUSE_TRIGGER}) or no \
                             session table ({}) yet, and create=false; run the migration in the store docs \
                             (Migration)",
                            i.sql.lease_regclass, i.sql.sessions_regclass
                        )
                    } else {
                        format!(
                            "tables {} / {} / {} do not exist and create=false; run the migration in the store docs",
                            i.sql.lease_regclass, i.sql.fence_regclass, i.sql.shares_regclass
                        )
                    };
                    return Err(Error::backend(STORE, false, what));
                }
                c.client.batch_execute(&i.sql.create.whole).await.map_err(map_err)?;
                i.share_fns.store(true, Ordering::Relaxed);
            } else {
                // A namespace made before records or the functions of
                // shared leases existed: only record calls need the table,
                // and shares run transactions without the functions, so
                // without `create` it stays as it is (record calls fail
                // naming the table).
                let records: bool = row.try_get(3).map_err(map_err)?;
                // Functions of this version (with `PLAN_SETTING`), and
                // functions of any version (an earlier one's work, slower).
                let current: bool = row.try_get(5).map_err(map_err)?;
                let mut functions: bool = row.try_get(6).map_err(map_err)?;
                if i.config.create && !(records && current) {
                    // Not the whole DDL: its table locks stall a namespace
                    // in use, or deadlock in it (see `ddl::Ddl::additions`).
                    match c.client.batch_execute(&i.sql.create.additions).await {
                        Ok(()) => functions = true,
                        // A role that may use the tables but not change
                        // them (`create` left at its default): without the
                        // functions, or with an earlier version's, it works.
                        Err(e) if records => {
                            let _ = c.client.batch_execute("ROLLBACK").await;
                            tracing::warn!(error = %PgError(e), "could not add or update the functions of shared \
                                leases in the namespace (semaphores and read-write locks run slower): connect \
                                once as the tables' owner, or set create=false");
                        }
                        Err(e) => return Err(map_err(e)),
                    }
                }
                i.share_fns.store(functions, Ordering::Relaxed);
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
                Stmt::Renew | Stmt::RenewSession | Stmt::SessionRows => self.inner.pool.renewal().await?,
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
            let cancels = matches!(stmt, Stmt::Renew | Stmt::RenewSession | Stmt::SessionRows);
            let mut cancel = CancelOnDrop(cancels.then(|| (c.client.cancel_token(), self.inner.pool.tls.clone())));
            let outcome = self.run(&c, stmt, sql, params).await;
            cancel.0 = None;
            outcome
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| self.inner.pool.timed_out(what, timeout, key))?
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
        // At most 2^62: fits the signed bigint counter.
        let floor = req.fence_floor_within(MAX_FENCE_FLOOR, STORE)? as i64;
        let token = req.token.to_bytes();
        let token = &token[..];
        let ttl_ms = req.ttl.as_millis() as i64;
        let key = req.key.as_str();
        let register = waiting;
        // Other waiters of this key in this client: the new row starts wanted.
        let others_wait = self.inner.waiting.count(key) > usize::from(waiting);
        let choice = self.book().choose(req.ttl, started);
        let (lean, session, new_session) = match choice {
            SessionChoice::Lean { id, until } => (Some(until), id, None),
            SessionChoice::Full { current, fresh } => (None, current, Some(fresh)),
        };
        let session = &session[..];
        let new_session = new_session.as_ref().map(|id| &id[..]);
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> =
            vec![(&key, Type::TEXT), (&token, Type::BYTEA), (&ttl_ms, Type::INT8), (&req.label, Type::TEXT)];
        if waiting {
            params.push((&register, Type::BOOL));
        }
        params.extend([
            (&others_wait as &(dyn ToSql + Sync), Type::BOOL),
            (&floor, Type::INT8),
            (&session, Type::BYTEA),
        ]);
        if let Some(new_session) = &new_session {
            params.push((new_session, Type::BYTEA));
        }
        let stmt = match (waiting, lean.is_some()) {
            (true, false) => Stmt::Acquire,
            (true, true) => Stmt::AcquireLean,
            (false, false) => Stmt::AcquireFree,
            (false, true) => Stmt::AcquireFreeLean,
        };
        let rows = self.query("acquire", Some(key), stmt, &params).await?;
        let row = rows.first().ok_or_else(|| Error::backend(STORE, false, "acquire returned no row"))?;
        let granted: Option<i64> = row.try_get(0).map_err(map_err)?;
        let mine: Option<i64> = row.try_get(1).map_err(map_err)?;
        let left_ms: Option<i64> = row.try_get(2).map_err(map_err)?;
        let registered: bool = row.try_get(3).map_err(map_err)?;
        let run_again: bool = row.try_get(4).map_err(map_err)?;
        let valid_ms: Option<i64> = row.try_get(5).map_err(map_err)?;
        let used: Option<Vec<u8>> = row.try_get(6).map_err(map_err)?;
        let used = used.and_then(|id| <SessionId>::try_from(id.as_slice()).ok());
        let fence = granted.or(mine);
        let valid = valid_ms.map(|ms| Duration::from_millis(ms.max(0) as u64));
        if let Some(used) = used {
            let mut book = self.book();
            book.used(ttl_ms, used, fence.map(|_| req.token));
            // The full statement names the session's time left whether or
            // not it granted (a retry's is its row's session's).
            if let (Some(valid), None) = (valid, lean) {
                book.known_until(used, started + valid);
            }
        }
        let left = left_ms.map(|ms| Duration::from_millis(ms.max(0) as u64));
        Ok(match fence {
            Some(fence) => {
                // A lean grant (not a retry) is valid as long as the
                // client's count of its session.
                let valid = match (valid, lean) {
                    (Some(valid), _) => valid,
                    (None, Some(until)) => until.saturating_duration_since(started),
                    (None, None) => Duration::ZERO,
                }
                .min(req.ttl);
                let mut grant = Grant::new(fence as u64, started, req.ttl);
                grant.valid_for = valid;
                Attempt::Granted(grant)
            }
            // The row the snapshot saw free changed or went (a sweep): at once again.
            None if run_again => Attempt::Busy { expires_in: Some(Duration::ZERO) },
            None if register && !registered => Attempt::Busy { expires_in: Some(Duration::ZERO) },
            None => Attempt::Busy { expires_in: left },
        })
    }

    /// One statement: if `token` holds an unexpired lease of `key`
    /// (exclusive or shared, not a reservation), the key's fence (kept in
    /// its lease row) raised to `floor` if it is lower (never lowered), so
    /// every later grant of the key gets a fence above it (a swept row
    /// raises the namespace counter to its fence); whether it held (a token
    /// that holds nothing raises nothing).
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

    /// The record kept with `key`, if one was written (the `u64` is
    /// stored in the signed `bigint` bit for bit).
    pub(super) async fn read_record_of(&self, key: &str) -> Result<Option<u64>> {
        let rows = self.query("read record", Some(key), Stmt::ReadRecord, &[(&key, Type::TEXT)]).await?;
        rows.first().map(|row| row.try_get::<_, i64>(0).map(|v| v as u64).map_err(map_err)).transpose()
    }

    /// One statement: the record kept with `key` set to `value` if `token`
    /// holds an unexpired exclusive lease of `key`; whether it held.
    pub(super) async fn write_record_of(&self, key: &str, token: OwnerToken, value: u64) -> Result<bool> {
        let (token, value) = (token.to_bytes().to_vec(), value as i64);
        let rows = self
            .query(
                "write record",
                Some(key),
                Stmt::WriteRecord,
                &[(&key, Type::TEXT), (&token, Type::BYTEA), (&value, Type::INT8)],
            )
            .await?;
        let row = rows.first().ok_or_else(|| Error::backend(STORE, false, "write record returned no row"))?;
        row.try_get(0).map_err(map_err)
    }

    /// This client's session book (a poisoned lock is taken as it is: the
    /// book is only ever left consistent).
    pub(super) fn book(&self) -> std::sync::MutexGuard<'_, SessionBook> {
        self.inner.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// At most once a minute per client: release the rows of sessions that
    /// lapsed over a minute ago (their clients crashed), delete a few rows
    /// released or expired over a minute ago whose keys nobody took since,
    /// raising the namespace counter to their fences (a key seen again
    /// draws from it), and delete lapsed sessions that hold no rows.
    pub(super) async fn maybe_sweep(&self) {
        let i = &self.inner;
        let now = i.epoch.elapsed().as_millis() as u64;
        let last = i.last_sweep_ms.load(Ordering::Relaxed);
        if (last != 0 && now.saturating_sub(last) < 60_000)
            || i.last_sweep_ms.compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return;
        }
        // The counter first, as a grant of a key without a row takes it
        // before the row: the two never wait for each other's rows.
        let sql = &i.sql;
        let swept = self
            .transaction("sweep", async |c| {
                c.query_typed(&sql.sweep_lock, &[]).await.map_err(map_err)?;
                c.query_typed(&sql.sweep_sessions[0], &[]).await.map_err(map_err)?;
                c.query_typed(&sql.sweep, &[]).await.map_err(map_err)?;
                c.query_typed(&sql.sweep_sessions[1], &[]).await.map_err(map_err).map(|_| ())
            })
            .await;
        if let Err(e) = swept {
            tracing::debug!(error = %e, "sweep of expired lease rows failed");
        }
    }
}
