//! The PostgreSQL store: lease rows on the database's clock, fences from a
//! per-namespace counter in the same statement, wake-ups by LISTEN/NOTIFY.
#![doc = include_str!("docs.md")]

mod acquire_sql;
mod admin;
mod config;
mod ddl;
mod error;
mod gate;
mod listener;
mod lost;
mod pool;
mod pooler;
mod release_sql;
mod renew;
mod session;
mod share_calls;
mod share_fns;
mod shares;
mod shrink;
mod sql;
mod statements;
mod tls;

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_postgres::types::Type;

#[cfg(test)]
pub(crate) use config::OPTIONS;
pub use config::{PostgresConfig, Prepared, SslMode};
pub use error::PgError;

use crate::backend::wait::{self, Attempt, LocalWakeups};
use crate::backend::{AcquireRequest, Backend, ForceReleased, Grant, HolderInfo, LeaseMode, LockStatus, RenewRequest};
use crate::vocabulary::capability::{Capabilities, FenceDurability};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};
use error::map_err;
use listener::{Listener, WaitingKeys};
use pool::Pool;
use statements::Stmt;

const STORE: &str = "postgres";

struct Inner {
    config: PostgresConfig,
    sql: statements::Statements,
    shares: shares::ShareSql,
    shrink: shrink::ShrinkSql,
    channel: String,
    pool: Pool,
    wakeups: Arc<LocalWakeups>,
    waiting: Arc<WaitingKeys>,
    listener: OnceLock<Listener>,
    durability: OnceLock<FenceDurability>,
    /// Named prepared statements still allowed (cleared if a pooler breaks them).
    prepared: std::sync::atomic::AtomicBool,
    /// The namespace has the functions of shared leases (see `share_fns`); a
    /// namespace of an earlier version opened with `create=false` may not.
    share_fns: std::sync::atomic::AtomicBool,
    /// This client's sessions and the session each of its mutex leases
    /// lives with (see `session`).
    sessions: std::sync::Mutex<crate::backend::session_book::SessionBook>,
    /// Last sweep of long-expired rows, in ms since `epoch`.
    last_sweep_ms: AtomicU64,
    epoch: Instant,
}

/// The PostgreSQL store.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// Connects to the store a `postgres://` URL names (see [`PostgresConfig::from_url`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: takes no lock; a dropped call may leave the namespace's
    /// tables created (creation is idempotent).
    pub async fn open_url(url: &str) -> Result<Self> {
        Self::open(PostgresConfig::from_url(url)?).await
    }

    /// Connects, creates the schema and tables if missing (unless `create=false`)
    /// and reads the server's durability settings.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: takes no lock; a dropped call may leave the namespace's
    /// tables created (creation is idempotent).
    pub async fn open(config: PostgresConfig) -> Result<Self> {
        let endpoint = config.endpoint();
        Self::open_inner(config).await.map_err(|e| e.at(&endpoint))
    }

    async fn open_inner(config: PostgresConfig) -> Result<Self> {
        let root_pem = match &config.ssl_root_cert {
            Some(path) => Some(
                tokio::fs::read(path)
                    .await
                    .map_err(|e| Error::invalid("url", format!("cannot read sslrootcert {}: {e}", path.display())))?,
            ),
            None => None,
        };
        let (tls, mode) = tls::connector(&config, root_pem.as_deref())?;
        let mut pg = config.pg.clone();
        pg.ssl_mode(mode);
        let mut config = config;
        if let Some(l) = config.listen.as_mut() {
            l.ssl_mode(mode);
        }
        let pool = Pool {
            pg,
            tls,
            slots: (0..config.pool_size).map(|_| Default::default()).collect(),
            renewal: Default::default(),
            txn: Default::default(),
            // Within the call's own timeout, which covers the connect and
            // the fence: past it the caller would read a bare "timed out"
            // instead of the fence's error that names the backend.
            lost_limit: config.op_timeout / 2,
            txn_turn: Default::default(),
            abandoned_ends: Default::default(),
            next: AtomicUsize::new(0),
            prepared: config.prepared,
        };
        let inner = Inner {
            sql: statements::Statements::new(&config),
            shares: shares::ShareSql::new(&config),
            shrink: shrink::ShrinkSql::new(&config),
            channel: config.channel(),
            config,
            pool,
            wakeups: Arc::default(),
            waiting: Arc::default(),
            listener: OnceLock::new(),
            durability: OnceLock::new(),
            prepared: std::sync::atomic::AtomicBool::new(true),
            share_fns: std::sync::atomic::AtomicBool::new(false),
            sessions: std::sync::Mutex::default(),
            last_sweep_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        };
        let backend = PostgresBackend { inner: Arc::new(inner) };
        let durability = backend.init().await?;
        let _ = backend.inner.durability.set(durability);
        Ok(backend)
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            store_notification: self.inner.config.listen.is_some(),
            fence_durability: self.inner.durability.get().copied().unwrap_or(FenceDurability::Volatile),
            shared_leases: true,
            fence_floor: true,
            records: true,
            admin: true,
            shrink: true,
            ..Capabilities::minimal()
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        let attempt = match req.mode {
            LeaseMode::Exclusive => self.attempt(req, false).await?,
            _ => self.attempt_shared(req, false).await?,
        };
        Ok(match attempt {
            Attempt::Granted(g) => Some(g),
            Attempt::Busy { .. } => None,
        })
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        let key = req.key.as_str();
        if req.mode != LeaseMode::Exclusive {
            let _waiting = self.inner.waiting.enter(key);
            let wakeup = self.inner.wakeups.subscribe(key);
            self.ensure_listener().await;
            return wait::until_granted(&wakeup, req, self.inner.config.poll, || self.attempt_shared(req, true)).await;
        }
        if !self.listening() {
            // A free key needs no listener: a client that never meets a busy
            // key never opens one (and never receives every release's NOTIFY).
            // Nor does it register as a waiter or subscribe to wake-ups
            // before it met the key busy: one statement, nothing else.
            if let Attempt::Granted(g) = self.attempt(req, false).await? {
                return Ok(g);
            }
            // Busy: register, LISTEN, then attempt again inside the loop
            // (marking the row wanted), so a release after the attempt above
            // is seen either way.
            let _waiting = self.inner.waiting.enter(key);
            let wakeup = self.inner.wakeups.subscribe(key);
            self.ensure_listener().await;
            return wait::until_granted(&wakeup, req, self.inner.config.poll, || self.attempt(req, true)).await;
        }
        let _waiting = self.inner.waiting.enter(key);
        let wakeup = self.inner.wakeups.subscribe(key);
        wait::until_granted(&wakeup, req, self.inner.config.poll, || self.attempt(req, true)).await
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        // A shared acquire of this client dropped while its COMMIT was in
        // flight (on the transaction connection, not this key's) may yet
        // write a reservation or a share of this token: wait for it first.
        self.inner.pool.after_abandoned_ends(self.inner.config.op_timeout).await;
        let sessions = self.book().own_sessions_for(token);
        let owner = token;
        let token = token.to_bytes();
        let token = &token[..];
        let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 4] = [
            (&key.as_str(), Type::TEXT),
            (&token, Type::BYTEA),
            (&self.inner.channel, Type::TEXT),
            (&sessions, Type::BYTEA_ARRAY),
        ];
        // Where the namespace has its functions, the gate's shrink after a
        // held share goes in the release's own statement (`release_sql`);
        // a namespace whose functions went since runs the two calls.
        let fused = if self.inner.share_fns.load(std::sync::atomic::Ordering::Relaxed) {
            match self.query("release", Some(key.as_str()), Stmt::ReleaseShrinking, &params).await {
                Err(e) if self.functions_gone(&e) => None,
                outcome => Some(outcome?),
            }
        } else {
            None
        };
        let rows = match fused {
            Some(rows) => rows,
            None => self.query("release", Some(key.as_str()), Stmt::Release, &params).await?,
        };
        self.book().released(owner);
        let released = match rows.first() {
            Some(row) => {
                if row.try_get::<_, bool>(2).map_err(map_err)? {
                    // A held share released by the two-call form (or nothing
                    // found on a gated key: see `release_sql`): the key's gate comes
                    // down to the shares left. If it cannot, the release
                    // fails, so that it is retried: the retry finds nothing
                    // and shrinks the gate (left up, it would refuse every
                    // exclusive grant until the released share's expiry).
                    self.shrink_gate(key.as_str()).await?;
                }
                // With a live listener the NOTIFY wakes one waiter here as in
                // every other client; without one, wake a local waiter directly.
                if !self.listening() {
                    self.inner.wakeups.wake_one(key.as_str());
                }
                row.try_get::<_, bool>(0).map_err(map_err)?
            }
            None => false,
        };
        self.maybe_sweep().await;
        Ok(released)
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        self.renew_leases(leases).await // renew.rs
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        let rows = self.query("status", Some(key.as_str()), Stmt::Status, &[(&key.as_str(), Type::TEXT)]).await?;
        let holder = match rows.first() {
            Some(row) => {
                let label: String = row.try_get(0).map_err(map_err)?;
                let fence: i64 = row.try_get(1).map_err(map_err)?;
                let left: i64 = row.try_get(2).map_err(map_err)?;
                Some(HolderInfo {
                    label,
                    fence: fence as u64,
                    ttl_left: Some(Duration::from_millis(left.max(0) as u64)),
                    weight: 1,
                })
            }
            None => None,
        };
        let (shared, limit) = self.shares_of(key).await?;
        Ok(LockStatus { holder, shared, limit, ..LockStatus::free(key) })
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        self.list_held(prefix).await // admin.rs
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForceReleased> {
        self.force(key).await // admin.rs
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        self.resize_shares(key, limit).await
    }

    async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        self.shrink_lease(key, token, to).await // shrink.rs
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        self.relabel_lease(key, token, label).await
    }

    async fn raise_fence(&self, key: &LockKey, token: OwnerToken, floor: u64) -> Result<bool> {
        self.raise_fence_to(key.as_str(), token, floor).await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<u64>> {
        self.read_record_of(key.as_str()).await
    }

    async fn write_record(&self, key: &LockKey, token: OwnerToken, value: u64) -> Result<bool> {
        self.write_record_of(key.as_str(), token, value).await
    }
}
