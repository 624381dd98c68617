//! The PostgreSQL store: lease rows on the database's clock, fences from a
//! per-namespace counter in the same statement, wake-ups by LISTEN/NOTIFY.
#![doc = include_str!("docs.md")]

mod config;
mod sql;
mod tls;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::watch;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client as PgClient, Row};
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::{CancellationToken, DropGuard};

pub use config::{PostgresConfig, SslMode};

use crate::backend::{AcquireRequest, Backend, Grant, HolderInfo, LockStatus, RenewRequest};
use crate::capability::{Capabilities, FenceDurability};
use crate::error::{Error, Result};
use crate::key::{LockKey, OwnerToken};
use crate::wait::{self, Attempt, LocalWakeups};

const STORE: &str = "postgres";

/// Back-off of listener reconnects.
const RECONNECT_MIN: Duration = Duration::from_millis(25);
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// How often an idle listener checks that its connection still answers.
const LISTENER_PING: Duration = Duration::from_secs(10);

/// A tokio-postgres error whose message includes its cause (tokio-postgres
/// prints only "db error" for a server error; the SQLSTATE and the server's
/// message are in the cause). The original is the `source()`.
#[derive(Debug)]
pub struct PgError(tokio_postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.0.as_db_error(), std::error::Error::source(&self.0)) {
            (Some(db), _) => write!(f, "{} (SQLSTATE {})", db.message(), db.code().code()),
            (None, Some(cause)) => write!(f, "{}: {cause}", self.0),
            (None, None) => write!(f, "{}", self.0),
        }
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Maps a tokio-postgres error: connection loss, server shutdown, resource
/// shortage, serialization failures and deadlocks are retryable; TLS and
/// authentication failures, bad settings and SQL errors are not.
fn map_err(e: tokio_postgres::Error) -> Error {
    let retryable = match e.code() {
        None => {
            let kind = e.to_string();
            ["error communicating with the server", "connection closed", "error connecting to server", "timeout"]
                .iter()
                .any(|k| kind.starts_with(k))
        }
        Some(code) => {
            let c = code.code();
            c.starts_with("08") // connection exception
                || c.starts_with("53") // insufficient resources (too many connections)
                || c.starts_with("57P") // admin/crash shutdown, cannot connect now
                || c == "40001" // serialization failure
                || c == "40P01" // deadlock
                || c == "55P03" // lock not available
        }
    };
    Error::backend(STORE, retryable, PgError(e))
}

fn timed_out(what: &str, after: Duration) -> Error {
    Error::backend(STORE, true, format!("{what} timed out after {after:?}"))
}

/// Keys that waiters of this client wait on, so a reconnected listener can
/// wake one waiter per key (notifications sent while it was down are lost).
#[derive(Debug, Default)]
struct WaitingKeys(Mutex<HashMap<String, usize>>);

impl WaitingKeys {
    fn enter(self: &Arc<Self>, key: &str) -> WaitingGuard {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()).entry(key.to_owned()).or_default() += 1;
        WaitingGuard { keys: self.clone(), key: key.to_owned() }
    }

    /// How many waiters of this client wait for `key`.
    fn count(&self, key: &str) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied().unwrap_or(0)
    }

    fn poke_all(&self, wakeups: &LocalWakeups) {
        let keys: Vec<String> = self.0.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        for k in keys {
            wakeups.wake_one(&k);
        }
    }
}

struct WaitingGuard {
    keys: Arc<WaitingKeys>,
    key: String,
}

impl Drop for WaitingGuard {
    fn drop(&mut self) {
        let mut map = self.keys.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// A few statement connections. tokio-postgres pipelines concurrent
/// statements on one connection and the server runs them in order; as every
/// statement is a short autocommit one, no caller holds a connection while
/// it waits for a key.
///
/// Statements about one key always use the same connection (chosen by a hash
/// of the key), so the release that cleans up after a dropped acquire runs
/// after that acquire on the server, never before it (on two connections the
/// release could overtake the acquire and leave an orphan grant).
struct Pool {
    pg: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    slots: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    next: AtomicUsize,
}

/// The statements a connection may prepare once and reuse.
#[derive(Debug, Clone, Copy)]
enum Stmt {
    Acquire = 0,
    Release = 1,
    Renew = 2,
    Status = 3,
    Sweep = 4,
}

/// One statement connection and the statements prepared on it.
struct Conn {
    client: PgClient,
    prepared: [tokio::sync::OnceCell<tokio_postgres::Statement>; 5],
}

/// Errors that mean a named prepared statement is not where it was prepared:
/// a transaction-pooling PgBouncer moved us to another server connection.
fn statement_lost(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| matches!(c.code(), "26000" | "42P05" | "08P01"))
}

impl Pool {
    /// The connection for statements about `key`, or any (round-robin) for `None`.
    async fn get(&self, key: Option<&str>) -> Result<Arc<Conn>> {
        let i = match key {
            Some(k) => (fnv1a(k.as_bytes()) % self.slots.len() as u64) as usize,
            None => self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len(),
        };
        let mut slot = self.slots[i].lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(c.clone());
        }
        *slot = None;
        let (client, connection) = self.pg.connect(self.tls.clone()).await.map_err(map_err)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "postgres connection ended");
            }
        });
        let conn = Arc::new(Conn { client, prepared: Default::default() });
        *slot = Some(conn.clone());
        Ok(conn)
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The listener task's handle: readiness, and a guard that stops it.
struct Listener {
    ready: watch::Receiver<bool>,
    _stop: DropGuard,
}

struct Inner {
    config: PostgresConfig,
    sql: sql::Statements,
    channel: String,
    pool: Pool,
    wakeups: Arc<LocalWakeups>,
    waiting: Arc<WaitingKeys>,
    listener: OnceLock<Listener>,
    durability: OnceLock<FenceDurability>,
    /// Use named prepared statements (cleared if a pooler breaks them).
    prepared: std::sync::atomic::AtomicBool,
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
    pub async fn open_url(url: &str) -> Result<Self> {
        Self::open(PostgresConfig::from_url(url)?).await
    }

    /// Connects, creates the schema and tables if missing (unless `create=false`)
    /// and reads the server's durability settings.
    pub async fn open(config: PostgresConfig) -> Result<Self> {
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
        let prepared = config.prepared;
        if let Some(l) = config.listen.as_mut() {
            l.ssl_mode(mode);
        }
        let pool = Pool {
            pg,
            tls,
            slots: (0..config.pool_size).map(|_| tokio::sync::Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        };
        let inner = Inner {
            sql: sql::Statements::new(&config),
            channel: config.channel(),
            config,
            pool,
            wakeups: Arc::default(),
            waiting: Arc::default(),
            listener: OnceLock::new(),
            durability: OnceLock::new(),
            prepared: std::sync::atomic::AtomicBool::new(prepared),
            last_sweep_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        };
        let backend = PostgresBackend { inner: Arc::new(inner) };
        let durability = backend.init().await?;
        let _ = backend.inner.durability.set(durability);
        Ok(backend)
    }

    /// Creates the namespace if needed; returns the fence durability the
    /// server's settings give.
    async fn init(&self) -> Result<FenceDurability> {
        let i = &self.inner;
        let timeout = i.config.op_timeout;
        let fut = async {
            let c = i.pool.get(None).await?;
            let row = c
                .client
                .query_typed_one(
                    "SELECT to_regclass($2) IS NOT NULL AND EXISTS (
                                SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'wanted'),
                            current_setting('fsync'), current_setting('synchronous_commit')",
                    &[(&i.sql.lease_regclass, Type::TEXT), (&i.sql.fence_regclass, Type::TEXT)],
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
                            "tables {} / {} do not exist and create=false; run the migration in the store docs",
                            i.sql.lease_regclass, i.sql.fence_regclass
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
    /// `key` picks the connection (see [`Pool`]); `None` for multi-key statements.
    async fn query(
        &self,
        what: &str,
        key: Option<&str>,
        stmt: Stmt,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        let timeout = self.inner.config.op_timeout;
        let sql = self.inner.sql.get(stmt);
        let fut = async {
            let c = self.inner.pool.get(key).await?;
            if self.inner.prepared.load(Ordering::Relaxed) {
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                let outcome =
                    match c.prepared[stmt as usize].get_or_try_init(|| c.client.prepare_typed(sql, &types)).await {
                        Ok(st) => {
                            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
                            c.client.query(st, &values).await
                        }
                        Err(e) => Err(e),
                    };
                match outcome {
                    Ok(rows) => return Ok(rows),
                    Err(e) if statement_lost(&e) => {
                        // Nothing ran; from now on use unnamed statements.
                        tracing::warn!(error = %e, "prepared statements do not work here (a transaction pooler?); \
                             using unnamed statements (set prepared=false to skip this)");
                        self.inner.prepared.store(false, Ordering::Relaxed);
                    }
                    Err(e) => return Err(map_err(e)),
                }
            }
            c.client.query_typed(sql, params).await.map_err(map_err)
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| timed_out(what, timeout))?
    }

    /// One acquire statement. A waiting attempt (`waiting`) that finds the
    /// key busy marks the row `wanted`, so its release will NOTIFY; if it
    /// could not (the row changed since the statement's snapshot), it asks to
    /// be retried at once rather than sleep through an unannounced release.
    async fn attempt(&self, req: &AcquireRequest, waiting: bool) -> Result<Attempt> {
        let started = Instant::now();
        let token = req.token.to_bytes().to_vec();
        let ttl_ms = req.ttl.as_millis() as i64;
        let register = waiting;
        // Other waiters of this key in this client: the new row starts wanted.
        let others_wait = self.inner.waiting.count(req.key.as_str()) > usize::from(waiting);
        let rows = self
            .query(
                "acquire",
                Some(req.key.as_str()),
                Stmt::Acquire,
                &[
                    (&req.key.as_str(), Type::TEXT),
                    (&token, Type::BYTEA),
                    (&ttl_ms, Type::INT8),
                    (&req.label, Type::TEXT),
                    (&register, Type::BOOL),
                    (&others_wait, Type::BOOL),
                ],
            )
            .await?;
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

    /// Starts the listener on first use; returns whether it is listening now.
    async fn ensure_listener(&self) -> bool {
        let i = &self.inner;
        let Some(cfg) = i.config.listen.clone() else { return false };
        let listener = i.listener.get_or_init(|| {
            let (tx, rx) = watch::channel(false);
            let stop = CancellationToken::new();
            let task = ListenTask {
                pg: cfg,
                tls: i.pool.tls.clone(),
                channel: i.channel.clone(),
                wakeups: i.wakeups.clone(),
                waiting: i.waiting.clone(),
                ready: tx,
                stop: stop.clone(),
                connect_timeout: i.config.op_timeout,
            };
            tokio::spawn(task.run());
            Listener { ready: rx, _stop: stop.drop_guard() }
        });
        let mut ready = listener.ready.clone();
        if *ready.borrow() {
            return true;
        }
        // The first waiter gives the listener a moment to LISTEN, so that
        // the first release is not missed; later ones poll while it reconnects.
        matches!(
            tokio::time::timeout(Duration::from_secs(2).min(i.config.op_timeout), ready.wait_for(|r| *r)).await,
            Ok(Ok(_))
        )
    }

    fn listening(&self) -> bool {
        self.inner.listener.get().is_some_and(|l| *l.ready.borrow())
    }

    /// At most once a minute per client: delete a few rows whose holders
    /// vanished long ago and whose keys nobody took since.
    async fn maybe_sweep(&self) {
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

#[async_trait]
impl Backend for PostgresBackend {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            store_notification: self.inner.config.listen.is_some(),
            fence_durability: self.inner.durability.get().copied().unwrap_or(FenceDurability::Volatile),
            ..Capabilities::minimal()
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        Ok(match self.attempt(req, false).await? {
            Attempt::Granted(g) => Some(g),
            Attempt::Busy { .. } => None,
        })
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        let _waiting = self.inner.waiting.enter(req.key.as_str());
        let wakeup = self.inner.wakeups.subscribe(req.key.as_str());
        if !self.listening() {
            // A free key needs no listener: a client that never meets a busy
            // key never opens one (and never receives every release's NOTIFY).
            if let Attempt::Granted(g) = self.attempt(req, true).await? {
                return Ok(g);
            }
            // Busy: LISTEN first, then attempt again inside the loop, so a
            // release after the attempt above is seen either way.
            self.ensure_listener().await;
        }
        wait::until_granted(&wakeup, self.inner.config.poll, || self.attempt(req, true)).await
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        let token = token.to_bytes().to_vec();
        let rows = self
            .query(
                "release",
                Some(key.as_str()),
                Stmt::Release,
                &[(&key.as_str(), Type::TEXT), (&token, Type::BYTEA), (&self.inner.channel, Type::TEXT)],
            )
            .await?;
        let released = match rows.first() {
            Some(row) => {
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
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<&str> = leases.iter().map(|l| l.key.as_str()).collect();
        let tokens: Vec<Vec<u8>> = leases.iter().map(|l| l.token.to_bytes().to_vec()).collect();
        let ttls: Vec<i64> = leases.iter().map(|l| l.ttl.as_millis() as i64).collect();
        let rows = self
            .query(
                "renew",
                None,
                Stmt::Renew,
                &[(&keys, Type::TEXT_ARRAY), (&tokens, Type::BYTEA_ARRAY), (&ttls, Type::INT8_ARRAY)],
            )
            .await?;
        let mut held = vec![false; leases.len()];
        for row in rows {
            let i: i64 = row.try_get(0).map_err(map_err)?;
            if let Some(h) = usize::try_from(i).ok().and_then(|i| i.checked_sub(1)).and_then(|i| held.get_mut(i)) {
                *h = true;
            }
        }
        Ok(held)
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
                })
            }
            None => None,
        };
        Ok(LockStatus { key: key.to_string(), holder, waiters: None })
    }
}

/// The one LISTEN connection of a client: every notification on the
/// namespace channel wakes one local waiter of the key in its payload.
struct ListenTask {
    pg: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    channel: String,
    wakeups: Arc<LocalWakeups>,
    waiting: Arc<WaitingKeys>,
    ready: watch::Sender<bool>,
    stop: CancellationToken,
    connect_timeout: Duration,
}

impl ListenTask {
    async fn run(self) {
        let mut pause = RECONNECT_MIN;
        loop {
            let was_ready = *self.ready.borrow();
            let outcome = tokio::select! {
                _ = self.stop.cancelled() => return,
                r = self.session() => r,
            };
            if was_ready || *self.ready.borrow() {
                pause = RECONNECT_MIN; // it had been up: reconnect at once
            }
            self.ready.send_replace(false);
            if let Err(e) = outcome {
                tracing::debug!(error = %e, "postgres listener disconnected; waiters poll until it is back");
            }
            // Notifications sent while disconnected are lost: let every
            // waiter look again, now, after each failed reconnect, and once
            // more when LISTEN is back (in `session`).
            self.waiting.poke_all(&self.wakeups);
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(RECONNECT_MAX);
        }
    }

    /// One listening session; returns when the connection fails.
    async fn session(&self) -> Result<()> {
        let (client, mut connection) = tokio::time::timeout(self.connect_timeout, self.pg.connect(self.tls.clone()))
            .await
            .map_err(|_| timed_out("listener connect", self.connect_timeout))?
            .map_err(map_err)?;
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        // The channel name is ours ("holdfast_" + hex), quoted as an identifier.
        let listen = format!("LISTEN \"{}\"", self.channel);
        self.drive(&mut messages, client.batch_execute(&listen)).await?;
        self.ready.send_replace(true);
        // Releases between the last session and this LISTEN were missed.
        self.waiting.poke_all(&self.wakeups);
        let mut ping = tokio::time::interval(LISTENER_PING);
        ping.reset();
        loop {
            tokio::select! {
                m = messages.next() => self.dispatch(m)?,
                _ = ping.tick() => {
                    // A health check; its reply arrives while `messages` is polled.
                    self.drive(&mut messages, client.simple_query("")).await?;
                }
            }
        }
    }

    /// Polls the connection (dispatching notifications) until `request`
    /// completes, within the connect timeout.
    async fn drive<S, T>(
        &self,
        messages: &mut S,
        request: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<()>
    where
        S: futures::Stream<Item = std::result::Result<AsyncMessage, tokio_postgres::Error>> + Unpin,
    {
        let mut request = std::pin::pin!(request);
        let deadline = tokio::time::sleep(self.connect_timeout);
        let mut deadline = std::pin::pin!(deadline);
        loop {
            tokio::select! {
                r = &mut request => return r.map(|_| ()).map_err(map_err),
                m = messages.next() => self.dispatch(m)?,
                _ = &mut deadline => return Err(timed_out("listener request", self.connect_timeout)),
            }
        }
    }

    /// Handles one message of the listening connection.
    fn dispatch(&self, m: Option<std::result::Result<AsyncMessage, tokio_postgres::Error>>) -> Result<()> {
        match m {
            Some(Ok(AsyncMessage::Notification(n))) => {
                self.wakeups.wake_one(n.payload());
                Ok(())
            }
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(map_err(e)),
            None => Err(Error::backend(STORE, true, "listener connection closed")),
        }
    }
}
