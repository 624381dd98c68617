//! The embedded SQLite store: one file, no server. See `docs.md`.
#![doc = include_str!("docs.md")]

mod admin;
mod config;
mod conn;
mod ddl;
mod error;
mod session;
mod sql;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags};

#[cfg(test)]
pub(crate) use config::OPTIONS;
pub use config::SqliteConfig;

use crate::backend::admission::Shrink;
use crate::backend::wait::{self, Attempt, LocalWakeups};
use crate::backend::{AcquireRequest, Backend, ForceReleased, Grant, LeaseMode, LockStatus, RenewRequest};
use crate::vocabulary::capability::{Capabilities, FenceDurability};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};
use conn::ConnThread;
use error::map_err;
use session::SessionBook;

const STORE: &str = "sqlite";

/// The most leases per renew call (`stores::deferred` repeats it for the
/// capabilities it reports before the store is open).
const RENEW_SLICE: usize = 512;

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteBackend {
    /// The one connection, on a thread of its own.
    conn: Arc<ConnThread>,
    config: SqliteConfig,
    wakeups: Arc<LocalWakeups>,
    /// When this client last swept rows of long-dead holders (ms since the
    /// epoch; see `sql::release`).
    last_sweep_ms: Arc<AtomicI64>,
    /// This client's sessions and which one each of its grants lives with;
    /// used only on the connection's thread, inside its transactions.
    book: Arc<Mutex<SessionBook>>,
}

/// How often a client sweeps rows of long-dead holders, at most.
const SWEEP_EVERY_MS: i64 = 1_000;

impl SqliteBackend {
    /// Opens the store a `sqlite://` URL names, creating the file if missing
    /// (not its directory; with `mode=rw`, not the file either).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: takes no lock; the file is opened and its schema created on
    /// the blocking pool, which a drop does not interrupt (creation is idempotent).
    pub async fn open_url(url: &str) -> Result<Self> {
        Self::open(SqliteConfig::from_url(url)?).await
    }

    /// Opens the database file and creates its tables, creating the file if
    /// missing (never its directory; with [`SqliteConfig::must_exist`], not
    /// the file either).
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] naming the path when its directory, or under
    /// `mode=rw` the file, does not exist, or when SQLite cannot open it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: takes no lock; the file is opened and its schema created on
    /// the blocking pool, which a drop does not interrupt (creation is idempotent).
    pub async fn open(config: SqliteConfig) -> Result<Self> {
        let endpoint = config.endpoint();
        Self::open_inner(config).await.map_err(|e| e.at(&endpoint))
    }

    async fn open_inner(config: SqliteConfig) -> Result<Self> {
        let cfg = config.clone();
        let conn = tokio::task::spawn_blocking(move || -> Result<Connection> {
            cfg.check_path()?;
            // Everything below waits for other processes' locks up to the busy timeout.
            let deadline = Instant::now() + cfg.busy_timeout;
            // Without CREATE under mode=rw, so a file removed since the check is not made again.
            let flags = if cfg.must_exist {
                OpenFlags::default() - OpenFlags::SQLITE_OPEN_CREATE
            } else {
                OpenFlags::default()
            };
            let mut conn = Connection::open_with_flags(&cfg.path, flags).map_err(map_err)?;
            conn.busy_timeout(cfg.busy_timeout).map_err(map_err)?;
            let mode = ddl::switch_to_wal(&conn, deadline).map_err(map_err)?;
            if !mode.eq_ignore_ascii_case("wal") {
                // Still correct (every change is a BEGIN IMMEDIATE transaction),
                // but readers and the writer now block each other.
                tracing::warn!(path = %cfg.path.display(), mode, "SQLite could not switch this file to WAL mode");
            }
            conn.pragma_update(None, "synchronous", if cfg.synchronous_full { "FULL" } else { "NORMAL" })
                .map_err(map_err)?;
            ddl::create_schema(&mut conn).map_err(map_err)?;
            Ok(conn)
        })
        .await
        .map_err(|e| Error::backend(STORE, false, e))??;
        let conn = ConnThread::start(conn)
            .map_err(|e| Error::backend(STORE, false, format!("cannot start the connection's thread: {e}")))?;
        Ok(SqliteBackend { conn, config, wakeups: Arc::default(), last_sweep_ms: Arc::default(), book: Arc::default() })
    }

    /// Runs `f` on the connection, in turn (see [`ConnThread`]).
    async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        self.conn.run(false, f).await
    }

    /// Runs `f` on the connection ahead of the queued calls (renewals).
    async fn on_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        self.conn.run(true, f).await
    }

    /// One attempt; with `peek` it first looks without the write lock; with
    /// `reserve` (a waiting attempt) it leaves a reservation if refused and
    /// its mode keeps one.
    async fn attempt(&self, req: &AcquireRequest, peek: bool, reserve: bool) -> Result<Attempt> {
        let started = Instant::now();
        // At most 2^62: fits the signed INTEGER counter.
        let floor = req.fence_floor_within(sql::MAX_FENCE_FLOOR, STORE)? as i64;
        let (key, token, ttl, label, mode) =
            (req.key.as_str().to_owned(), req.token, req.ttl, req.label.clone(), req.mode);
        let book = self.book.clone();
        let outcome = self
            .with_conn(move |conn| {
                // Polling waiters look first, so they do not queue behind
                // each other on BEGIN IMMEDIATE while nothing changes.
                if peek {
                    if let Some(busy) = sql::peek(conn, &key, token, mode, ttl)? {
                        return Ok(busy);
                    }
                }
                let mut book = book.lock().unwrap_or_else(|p| p.into_inner());
                sql::acquire(conn, &mut book, &key, token, mode, ttl, &label, reserve, floor)
            })
            .await?;
        match outcome {
            sql::Acquired::Granted { fence, left_ms } => {
                // Valid until the session's expiry, counted from before the
                // transaction read the clock.
                let left = Duration::from_millis(left_ms.max(0) as u64);
                Ok(Attempt::Granted(Grant { valid_for: left.min(req.ttl), ..Grant::new(fence, started, req.ttl) }))
            }
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
            // A call costs one statement per TTL whatever its size (see
            // `session`); slices keep the client's own work per call (its
            // leases' deadlines, the call's vectors) short, so that its
            // other tasks do not wait behind a tick of 100,000 leases.
            renew_slice: Some(RENEW_SLICE),
            shared_leases: true,
            fence_floor: true,
            records: true,
            admin: true,
            shrink: true,
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
        let now = sql::now_ms();
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        let sweep = now - last >= SWEEP_EVERY_MS
            && self.last_sweep_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok();
        let book = self.book.clone();
        let released = self
            .with_conn(move |conn| {
                let mut book = book.lock().unwrap_or_else(|p| p.into_inner());
                sql::release(conn, &mut book, &k, token, sweep)
            })
            .await?;
        self.wakeups.wake_one(key.as_str());
        Ok(released)
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        // One statement per TTL on this client's session rows, whatever the
        // number of leases (see `session`).
        let leases: Vec<(OwnerToken, i64)> =
            leases.iter().map(|l| (l.token, l.ttl.as_millis().min(i64::MAX as u128) as i64)).collect();
        let book = self.book.clone();
        self.on_conn(move |conn| {
            let mut book = book.lock().unwrap_or_else(|p| p.into_inner());
            session::renew(conn, &mut book, &leases, sql::now_ms())
        })
        .await
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        self.status_of(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        self.list_held(prefix).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForceReleased> {
        self.force_release_all(key).await
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        let (k, label) = (key.as_str().to_owned(), label.to_owned());
        self.with_conn(move |conn| sql::relabel(conn, &k, token, &label)).await
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        let k = key.as_str().to_owned();
        self.with_conn(move |conn| sql::resize(conn, &k, limit)).await
    }

    async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        let k = key.as_str().to_owned();
        let outcome = self.with_conn(move |conn| sql::shrink(conn, &k, token, to)).await?;
        if outcome == Shrink::Shrunk {
            // Room was made, as a release makes it: the local waiter whose
            // turn it is tries again (the turn then passes on to the next).
            self.wakeups.wake_one(key.as_str());
        }
        outcome.answer()
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

    async fn read_record(&self, key: &LockKey) -> Result<Option<u64>> {
        let k = key.as_str().to_owned();
        self.with_conn(move |conn| sql::read_record(conn, &k)).await
    }

    async fn write_record(&self, key: &LockKey, token: OwnerToken, value: u64) -> Result<bool> {
        let k = key.as_str().to_owned();
        self.with_conn(move |conn| sql::write_record(conn, &k, token, value)).await
    }
}

#[cfg(test)]
mod tests;
