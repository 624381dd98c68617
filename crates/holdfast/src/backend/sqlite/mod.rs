//! The embedded SQLite store: one file, no server. See `docs.md`.
#![doc = include_str!("docs.md")]

mod config;
mod sql;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rusqlite::Connection;

pub use config::SqliteConfig;

use crate::backend::{AcquireRequest, Backend, Grant, HolderInfo, LockStatus, RenewRequest};
use crate::capability::{Capabilities, FenceDurability};
use crate::error::{Error, Result};
use crate::key::{LockKey, OwnerToken};
use crate::wait::{self, Attempt, LocalWakeups};

const STORE: &str = "sqlite";

/// Leases per renewal transaction: a few milliseconds of the connection.
const RENEW_CHUNK: usize = 512;

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteBackend {
    conn: Arc<Mutex<Connection>>,
    /// The queue of every call but renewal for the connection (FIFO): a
    /// renewal waits for at most the one call that holds the connection, never
    /// behind a queue of acquisitions, so load on the client cannot delay it
    /// into lost leases.
    queue: Arc<tokio::sync::Mutex<()>>,
    config: SqliteConfig,
    wakeups: Arc<LocalWakeups>,
}

fn map_err(e: rusqlite::Error) -> Error {
    let retryable =
        matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked));
    Error::backend(STORE, retryable, e)
}

impl SqliteBackend {
    /// Opens (creating if missing) the store a `sqlite://` URL names.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: takes no lock; the file is opened and its schema created on
    /// the blocking pool, which a drop does not interrupt (creation is idempotent).
    pub async fn open_url(url: &str) -> Result<Self> {
        Self::open(SqliteConfig::from_url(url)?).await
    }

    /// Opens (creating if missing) the database file and its tables.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: takes no lock; the file is opened and its schema created on
    /// the blocking pool, which a drop does not interrupt (creation is idempotent).
    pub async fn open(config: SqliteConfig) -> Result<Self> {
        let cfg = config.clone();
        let conn = tokio::task::spawn_blocking(move || -> Result<Connection> {
            if let Some(dir) = cfg.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Error::backend(STORE, false, format!("cannot create directory {}: {e}", dir.display()))
                })?;
            }
            // Everything below waits for other processes' locks up to the busy timeout.
            let deadline = Instant::now() + cfg.busy_timeout;
            let conn = Connection::open(&cfg.path).map_err(map_err)?;
            conn.busy_timeout(cfg.busy_timeout).map_err(map_err)?;
            let mode = sql::switch_to_wal(&conn, deadline).map_err(map_err)?;
            if !mode.eq_ignore_ascii_case("wal") {
                // Still correct (every change is a BEGIN IMMEDIATE transaction),
                // but readers and the writer now block each other.
                tracing::warn!(path = %cfg.path.display(), mode, "SQLite could not switch this file to WAL mode");
            }
            conn.pragma_update(None, "synchronous", if cfg.synchronous_full { "FULL" } else { "NORMAL" })
                .map_err(map_err)?;
            conn.execute_batch(&format!("BEGIN IMMEDIATE; {} COMMIT;", sql::SCHEMA)).map_err(map_err)?;
            Ok(conn)
        })
        .await
        .map_err(|e| Error::backend(STORE, false, e))??;
        Ok(SqliteBackend { conn: Arc::new(Mutex::new(conn)), queue: Arc::default(), config, wakeups: Arc::default() })
    }

    /// Runs `f` on the connection on the blocking pool, in turn. The turn
    /// goes with the work, not with this future: dropped while `f` runs, the
    /// future does not let the next call (the cleanup's release of this very
    /// attempt) reach the connection before `f` has committed.
    async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let turn = self.queue.clone().lock_owned().await;
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn).map_err(map_err)
        })
        .await
        .map_err(|e| Error::backend(STORE, false, e))?
    }

    /// Runs `f` on the connection on the blocking pool, ahead of the queue.
    async fn on_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn).map_err(map_err)
        })
        .await
        .map_err(|e| Error::backend(STORE, false, e))?
    }

    /// One attempt; with `peek` it first looks without the write lock; with
    /// `reserve` (a waiting attempt) it leaves a reservation if refused and
    /// its mode keeps one.
    async fn attempt(&self, req: &AcquireRequest, peek: bool, reserve: bool) -> Result<Attempt> {
        let started = Instant::now();
        let (key, token, ttl, label, mode) =
            (req.key.as_str().to_owned(), req.token, req.ttl, req.label.clone(), req.mode);
        let outcome = self
            .with_conn(move |conn| {
                // Polling waiters look first, so they do not queue behind
                // each other on BEGIN IMMEDIATE while nothing changes.
                if peek {
                    if let Some(busy) = sql::peek(conn, &key, token, mode, ttl)? {
                        return Ok(busy);
                    }
                }
                sql::acquire(conn, &key, token, mode, ttl, &label, reserve)
            })
            .await?;
        match outcome {
            sql::Acquired::Granted { fence } => Ok(Attempt::Granted(Grant::new(fence, started, req.ttl))),
            sql::Acquired::Busy { expires_in } => Ok(Attempt::Busy { expires_in: Some(expires_in) }),
            sql::Acquired::Conflict(reason) => Err(Error::Conflict { key: req.key.to_string(), reason }),
        }
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fence_durability: if self.config.synchronous_full {
                FenceDurability::Durable
            } else {
                FenceDurability::ProcessCrash
            },
            // One call per tick, which sorts the leases into the table's
            // order and splits them into short transactions (slices cut
            // before sorting would write each table page once per slice).
            renew_slice: None,
            shared_leases: true,
            fence_floor: true,
            ..Capabilities::minimal()
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        Ok(match self.attempt(req, false, false).await? {
            Attempt::Granted(g) => Some(g),
            Attempt::Busy { .. } => None,
        })
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        let wakeup = self.wakeups.subscribe(req.key.as_str());
        let mut first = true;
        wait::until_granted(&wakeup, req, self.config.poll, || {
            let peek = !std::mem::take(&mut first);
            self.attempt(req, peek, true)
        })
        .await
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        let k = key.as_str().to_owned();
        let released = self.with_conn(move |conn| sql::release(conn, &k, token)).await?;
        self.wakeups.wake_one(key.as_str());
        Ok(released)
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        // In key order (the table's order), so that each transaction writes a
        // run of neighbouring pages and a tick writes each page about once;
        // in transactions of RENEW_CHUNK leases, so that the client's other
        // calls wait for one of them at most, never for the whole tick. The
        // sort runs on the blocking pool: at 100,000 leases it takes
        // milliseconds that the client's tasks should not wait for.
        let mut sorted: Vec<(usize, (LockKey, OwnerToken, Duration))> =
            leases.iter().enumerate().map(|(i, l)| (i, (l.key.clone(), l.token, l.ttl))).collect();
        let chunks = tokio::task::spawn_blocking(move || {
            sorted.sort_unstable_by(|a, b| a.1.0.cmp(&b.1.0));
            let mut chunks: Vec<(Vec<usize>, Vec<_>)> = Vec::new();
            let mut rest = sorted.into_iter().peekable();
            while rest.peek().is_some() {
                chunks.push(rest.by_ref().take(RENEW_CHUNK).unzip());
            }
            chunks
        })
        .await
        .map_err(|e| Error::backend(STORE, false, e))?;
        let mut held = vec![false; leases.len()];
        for (places, batch) in chunks {
            let results = self.on_conn(move |conn| sql::renew(conn, &batch)).await?;
            for (i, h) in places.into_iter().zip(results) {
                held[i] = h;
            }
        }
        Ok(held)
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        let k = key.as_str().to_owned();
        let rows = self.with_conn(move |conn| sql::status(conn, &k)).await?;
        let mut status = LockStatus::free(key);
        for (mode, label, fence, left_ms) in rows {
            let info = HolderInfo {
                label,
                fence,
                ttl_left: Some(Duration::from_millis(left_ms.max(0) as u64)),
                weight: mode.weight(),
            };
            match mode.limit() {
                Some(limit) => {
                    status.limit = Some(limit);
                    status.shared.push(info);
                }
                None => status.holder = Some(info),
            }
        }
        Ok(status)
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        let (k, label) = (key.as_str().to_owned(), label.to_owned());
        self.with_conn(move |conn| sql::relabel(conn, &k, token, &label)).await
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        let k = key.as_str().to_owned();
        self.with_conn(move |conn| sql::resize(conn, &k, limit)).await
    }

    async fn raise_fence(&self, key: &LockKey, token: OwnerToken, floor: u64) -> Result<bool> {
        if floor > sql::MAX_FENCE_FLOOR {
            return Err(Error::invalid(
                "fence floor",
                format!("{floor} is above 2^62, the highest floor the SQLite store takes"),
            ));
        }
        // At most 2^62: fits the signed INTEGER column.
        let floor = floor as i64;
        let k = key.as_str().to_owned();
        self.with_conn(move |conn| sql::raise_fence(conn, &k, token, floor)).await
    }
}
