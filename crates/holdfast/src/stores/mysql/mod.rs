//! The MySQL/MariaDB store: lease rows on InnoDB with the server's clock. See `docs.md`.
#![doc = include_str!("docs.md")]

mod admin;
mod attempt;
mod config;
mod error;
mod lost;
mod renew;
mod session;
mod session_rows;
mod share_procs;
mod shares;
mod shrink;
mod sql;
mod sweep;
mod takeover;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use mysql_async::Pool;

#[cfg(test)]
pub(crate) use config::OPTIONS;
pub use config::{MysqlConfig, SslMode};

use crate::backend::session_book::SessionBook;
use crate::backend::wait::{self, Attempt, LocalWakeups};
use crate::backend::{AcquireRequest, Backend, ForceReleased, Grant, HolderInfo, LeaseMode, LockStatus, RenewRequest};
use crate::vocabulary::capability::{Capabilities, FenceDurability};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};
use error::{is_contention, map_err};
use lost::{LostConnections, Operation};

const STORE: &str = "mysql";

/// Wake-ups shared by every backend of the same server, database and
/// namespace in this process, so a release through one client wakes a
/// waiter of another client at once.
fn shared_wakeups(id: &str) -> Arc<LocalWakeups> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<LocalWakeups>>>> = OnceLock::new();
    let mut reg = REGISTRY.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(w) = reg.get(id).and_then(Weak::upgrade) {
        return w;
    }
    reg.retain(|_, w| w.strong_count() > 0);
    let w = Arc::new(LocalWakeups::default());
    reg.insert(id.to_owned(), Arc::downgrade(&w));
    w
}

/// Runs `f` within `config.timeout`; a timeout is a retryable error. For
/// work that sends no lock statement: the lock statements go through
/// [`MysqlBackend::timed`], which fences lost connections.
async fn timed<T>(config: &MysqlConfig, f: impl Future<Output = mysql_async::Result<T>>) -> Result<T> {
    match tokio::time::timeout(config.timeout, f).await {
        Ok(r) => r.map_err(map_err),
        Err(_) => Err(Error::backend(
            STORE,
            true,
            format!("no answer from {}:{} within {:?}", config.host, config.port, config.timeout),
        )),
    }
}

/// Which attempt of an acquire [`MysqlBackend::attempt`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// `try_acquire`: the grant statement; a row it finds held is read to
    /// see whether its session lapsed (then it is taken over).
    Try,
    /// A waiting acquire's first attempt: the grant statement alone (a
    /// contended key would cost every acquire that read; a lapsed
    /// session's row is found by the next attempt).
    FirstWait,
    /// A waiting acquire's later attempts: a read that locks nothing first,
    /// then, if that found the key free, as `Try`.
    Wait,
}

/// The MySQL/MariaDB store.
#[derive(Clone)]
pub struct MysqlBackend {
    pool: Pool,
    /// Renewal's own connections: a renewal never waits for a connection
    /// that acquisitions hold, so load on the client cannot delay it into
    /// lost leases.
    renew_pool: Pool,
    config: Arc<MysqlConfig>,
    sql: Arc<sql::Statements>,
    shares: Arc<shares::ShareSql>,
    wakeups: Arc<LocalWakeups>,
    /// Held while a sweep of long-expired rows runs: one sweep at a time
    /// per client, at most one per `SWEEP_EVERY`.
    sweep_turn: Arc<tokio::sync::Mutex<sweep::SweepWalk>>,
    fence_durability: FenceDurability,
    /// This client's session rows (see `session_rows`).
    sessions: Arc<Mutex<SessionBook>>,
    /// Connections given up with a statement of unknown outcome, ended on
    /// the server before any later lock statement (see `lost`).
    lost: Arc<LostConnections>,
    /// Tokens of this client's shares (`true`: granted, or a lease shrunk
    /// to a share) and reservations (`false`): their release goes to the
    /// shares' transaction first, without the lease row's release
    /// statement, which finds nothing for them, and a granted one's without
    /// the read of its row (two statements of a read cycle's 14). Only an
    /// order: any token still falls through to the other statements.
    share_tokens: Arc<Mutex<HashMap<OwnerToken, bool>>>,
}

impl fmt::Debug for MysqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlBackend").field("config", &self.config).finish_non_exhaustive()
    }
}

impl MysqlBackend {
    /// Connects to the store a `mysql://` URL names, creating its tables if missing.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: takes no lock; a dropped call may leave the namespace's
    /// tables created (creation is idempotent).
    pub async fn open_url(url: &str) -> Result<Self> {
        Self::open(MysqlConfig::from_url(url)?).await
    }

    /// Connects, creates the lease and fence tables if missing
    /// (`CREATE TABLE IF NOT EXISTS`), and reads the server's commit
    /// durability setting.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: takes no lock; a dropped call may leave the namespace's
    /// tables created (creation is idempotent).
    pub async fn open(config: MysqlConfig) -> Result<Self> {
        let endpoint = config.endpoint();
        Self::open_inner(config).await.map_err(|e| e.at(&endpoint))
    }

    async fn open_inner(config: MysqlConfig) -> Result<Self> {
        config::check_namespace(&config.namespace)?;
        let statements = sql::Statements::new(
            &config.leases_table(),
            &config.fence_table(),
            &config.shares_table(),
            &config.records_table(),
            &config.sessions_table(),
        );
        let share_sql = shares::ShareSql::new(
            &config.namespace,
            &config.leases_table(),
            &config.fence_table(),
            &config.shares_table(),
            &config.sessions_table(),
        );
        let schema: Vec<&str> = statements
            .schema
            .iter()
            .chain([&share_sql.schema, &statements.sessions.schema])
            .map(String::as_str)
            .collect();
        let mut init = session::base_init(&config);
        let once = session::driver_opts(&config, 1, init.clone()).into();
        let tables = [config.leases_table(), config.shares_table()];
        let facts =
            timed(&config, session::open_once(once, &tables, &schema, &share_sql.procs, config.timeout)).await?;
        if facts.read_committed {
            init.push(session::READ_COMMITTED.to_owned());
        } else {
            tracing::debug!(
                "the server logs statements (binlog_format=STATEMENT): sessions stay at its isolation level"
            );
        }
        let wakeups =
            shared_wakeups(&format!("{}:{}/{}/{}", config.host, config.port, config.database, config.namespace));
        Ok(MysqlBackend {
            pool: Pool::new(session::driver_opts(&config, config.pool_max, init.clone())),
            // Up to two renewal slices at once on connections of their own.
            renew_pool: Pool::new(session::driver_opts(&config, 2, init)),
            config: Arc::new(config),
            sql: Arc::new(statements),
            shares: Arc::new(share_sql),
            wakeups,
            sweep_turn: Arc::default(),
            fence_durability: facts.fence_durability,
            sessions: Arc::default(),
            lost: Arc::default(),
            share_tokens: Arc::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MysqlConfig {
        &self.config
    }

    /// Runs an idempotent call again after a deadlock or lock wait timeout
    /// (InnoDB rolled the statement back; trying again is what it asks for).
    async fn retry_contention<T, F, Fut>(&self, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut tries = 0;
        loop {
            match f().await {
                Err(e) if is_contention(&e) && tries < 5 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_micros(rand::random_range(100..2000))).await;
                }
                other => return other,
            }
        }
    }

    /// Runs `work` with the configured bound; a timeout is a retryable
    /// error. `work` takes its connections from the operation it is handed
    /// ([`Operation::conn`]), which first ends every connection an earlier
    /// operation lost (see `lost`). When `work` times out, or fails on I/O
    /// rather than with the server's answer, its connections are recorded
    /// as lost: the outcome of their last statement is unknown.
    async fn timed<T>(&self, work: impl AsyncFnOnce(&Operation<'_>) -> mysql_async::Result<T>) -> Result<T> {
        let op = Operation::new(&self.pool, &self.lost);
        match tokio::time::timeout(self.config.timeout, work(&op)).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(e)) => {
                if lost::outcome_unknown(&e) {
                    op.lose_taken();
                }
                Err(lost::fence_error(e).unwrap_or_else(map_err))
            }
            Err(_) if op.was_fencing() => Err(Error::backend(
                STORE,
                true,
                format!(
                    "connection(s) {:?} of this client, given up with a statement whose outcome is unknown, are \
                     still on the server {:?} after they were ended (KILL CONNECTION); nothing is sent until they \
                     end: try again",
                    self.lost.recorded(),
                    self.config.timeout
                ),
            )),
            Err(_) => {
                op.lose_taken();
                Err(Error::backend(
                    STORE,
                    true,
                    format!(
                        "no answer from {}:{} within {:?}",
                        self.config.host, self.config.port, self.config.timeout
                    ),
                ))
            }
        }
    }

    /// This client's session book (a poisoned lock is taken as it is: the
    /// book is only ever left consistent).
    fn book(&self) -> std::sync::MutexGuard<'_, SessionBook> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn share_tokens(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerToken, bool>> {
        self.share_tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One attempt of a writer or a share (see `shares`); a waiting one
    /// (`reserve`) leaves a reservation when refused.
    async fn attempt_shared(&self, req: &AcquireRequest, reserve: bool) -> Result<Attempt> {
        let started = Instant::now();
        let key = req.key.as_str();
        let ask = || shares::Ask { key, token: req.token, mode: req.mode, ttl: req.ttl, label: &req.label, reserve };
        let outcome = self
            .timed(async |op| {
                let mut conn = op.conn().await?;
                shares::acquire(&mut conn, &self.shares, ask()).await
            })
            .await?;
        match outcome {
            shares::Shared::Granted(_) => drop(self.share_tokens().insert(req.token, true)),
            shares::Shared::Busy(_) if reserve => drop(self.share_tokens().insert(req.token, false)),
            _ => {}
        }
        match outcome {
            shares::Shared::Granted(fence) => Ok(Attempt::Granted(Grant::new(fence, started, req.ttl))),
            shares::Shared::Busy(expires_in) => Ok(Attempt::Busy { expires_in }),
            shares::Shared::Conflict(reason) => Err(Error::Conflict { key: key.to_owned(), reason }),
        }
    }

    /// An attempt made while waiting: a deadlock or lock wait timeout is
    /// contention for the key and counts as busy, so the wait goes on. Any
    /// other error, retryable or not (a server that went away), is the
    /// caller's: counted as busy it would turn a dead store into an endless
    /// wait, or a timeout that reads as "busy".
    async fn waiting_attempt(&self, req: &AcquireRequest, turn: Turn) -> Result<Attempt> {
        let attempt = match req.mode {
            LeaseMode::Exclusive => self.attempt(req, turn).await,
            _ => self.attempt_shared(req, true).await,
        };
        match attempt {
            Err(e) if is_contention(&e) => Ok(Attempt::Busy { expires_in: None }),
            other => other,
        }
    }
}

#[async_trait]
impl Backend for MysqlBackend {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fence_durability: self.fence_durability,
            shared_leases: true,
            fence_floor: true,
            records: true,
            admin: true,
            shrink: true,
            ..Capabilities::minimal()
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        // A deadlock or lock wait timeout is contention: try again a
        // couple of times before reporting it.
        let attempt = || async {
            match req.mode {
                LeaseMode::Exclusive => self.attempt(req, Turn::Try).await,
                _ => self.attempt_shared(req, false).await,
            }
        };
        match self.retry_contention(attempt).await? {
            Attempt::Granted(g) => Ok(Some(g)),
            Attempt::Busy { .. } => Ok(None),
        }
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        let wakeup = self.wakeups.subscribe(req.key.as_str());
        let mut first = true;
        wait::until_granted(&wakeup, req, self.config.poll, || {
            let turn = if std::mem::take(&mut first) { Turn::FirstWait } else { Turn::Wait };
            self.waiting_attempt(req, turn)
        })
        .await
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        let own = self.book().session_of(token);
        // This client's share (`Some(true)`: granted) or reservation.
        let share = self.share_tokens().get(&token).copied();
        // Deleting by token is idempotent, so a deadlock victim just retries.
        let released = self
            .retry_contention(|| {
                self.timed(async |op| {
                    let mut conn = op.conn().await?;
                    let (k, own) = (key.as_str(), own.as_ref().map(|id| &id[..]));
                    if share.is_none() && sql::release(&mut conn, &self.sql, k, token, own).await? {
                        return Ok(true);
                    }
                    // Not a grant of the lease row: maybe a share or a
                    // reservation, else a row of a session.
                    let granted = share == Some(true);
                    if let Some(released) = shares::release(&mut conn, &self.shares, k, token, granted).await? {
                        return Ok(released);
                    }
                    if share.is_some() && sql::release(&mut conn, &self.sql, k, token, own).await? {
                        return Ok(true);
                    }
                    sql::release_counted(&mut conn, &self.sql, k, token).await
                })
            })
            .await?;
        self.share_tokens().remove(&token);
        self.book().released(token);
        self.wakeups.wake_one(key.as_str());
        self.maybe_sweep();
        Ok(released)
    }

    async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        self.shrink_lease(key, token, to).await // shrink.rs
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        self.renew_leases(leases).await // renew.rs
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        let holder = self
            .timed(async |op| {
                let mut conn = op.conn().await?;
                sql::holder(&mut conn, &self.sql, key.as_str()).await
            })
            .await?;
        let listed = self
            .timed(async |op| {
                let mut conn = op.conn().await?;
                admin::list(&mut conn, &self.shares, key.as_str()).await
            })
            .await?;
        let mut status = LockStatus {
            holder: holder.map(|(label, fence, left)| HolderInfo { label, fence, ttl_left: Some(left), weight: 1 }),
            ..LockStatus::free(key)
        };
        for (label, fence, left, weight, limit) in listed {
            status.limit = Some(u32::try_from(limit).unwrap_or(u32::MAX));
            let weight = u32::try_from(weight).unwrap_or(u32::MAX);
            status.shared.push(HolderInfo { label, fence, ttl_left: Some(left), weight });
        }
        Ok(status)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        self.list_held(prefix).await // admin.rs
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForceReleased> {
        self.force(key).await // admin.rs
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        self.timed(async |op| {
            let mut conn = op.conn().await?;
            shares::resize(&mut conn, &self.shares, key.as_str(), limit).await
        })
        .await
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        self.timed(async |op| {
            let mut conn = op.conn().await?;
            admin::relabel(&mut conn, &self.shares, key.as_str(), token, label).await
        })
        .await
    }

    async fn raise_fence(&self, key: &LockKey, token: OwnerToken, floor: u64) -> Result<bool> {
        if floor > sql::MAX_FENCE_FLOOR {
            return Err(Error::invalid(
                "fence floor",
                format!("{floor} is above 2^62, the highest floor the MySQL store takes"),
            ));
        }
        // Raising to a floor twice is raising once, so a deadlock victim retries.
        self.retry_contention(|| {
            self.timed(async |op| {
                let mut conn = op.conn().await?;
                sql::raise_fence(&mut conn, &self.sql, key.as_str(), token, floor).await
            })
        })
        .await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<u64>> {
        self.timed(async |op| sql::read_record(&mut op.conn().await?, &self.sql, key.as_str()).await).await
    }

    async fn write_record(&self, key: &LockKey, token: OwnerToken, value: u64) -> Result<bool> {
        // Writing one value twice is writing it once, so a deadlock victim retries.
        self.retry_contention(|| {
            self.timed(async |op| sql::write_record(&mut op.conn().await?, &self.sql, key.as_str(), token, value).await)
        })
        .await
    }
}
