//! SQLite floor: one `INSERT ... ON CONFLICT DO UPDATE ... WHERE expired` to
//! acquire, one `DELETE ... WHERE token` to release, with plain rusqlite on the
//! same file and the same connection setup as holdfast's SQLite store (WAL,
//! `synchronous` from the URL, busy timeout, one connection on the blocking pool).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use holdfast::stores::sqlite::SqliteConfig;
use holdfast::{Error, OwnerToken, Result};
use rusqlite::{Connection, params};

use super::{Floor, OP_TIMEOUT};

const STORE: &str = "sqlite";

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS holdfast_bench_floor (
    key           TEXT PRIMARY KEY,
    token         BLOB NOT NULL,
    expires_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS holdfast_bench_floor_rw (
    key           TEXT NOT NULL,
    token         BLOB NOT NULL,
    writer        INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (key, token)
) WITHOUT ROWID;";

/// A read share unless an unexpired writer holds the key (one statement;
/// SQLite runs one writer at a time, so the check and the insert are atomic).
const ACQUIRE_READ: &str = "INSERT INTO holdfast_bench_floor_rw (key, token, writer, expires_at_ms)
    SELECT ?1, ?2, 0, ?3 + ?4 WHERE NOT EXISTS
      (SELECT 1 FROM holdfast_bench_floor_rw WHERE key = ?1 AND writer = 1 AND expires_at_ms > ?3)";

/// The write side if nobody holds the key.
const ACQUIRE_WRITE: &str = "INSERT INTO holdfast_bench_floor_rw (key, token, writer, expires_at_ms)
    SELECT ?1, ?2, 1, ?3 + ?4 WHERE NOT EXISTS
      (SELECT 1 FROM holdfast_bench_floor_rw WHERE key = ?1 AND expires_at_ms > ?3)";

const RELEASE_RW: &str = "DELETE FROM holdfast_bench_floor_rw WHERE key = ?1 AND token = ?2";

const ACQUIRE: &str = "INSERT INTO holdfast_bench_floor (key, token, expires_at_ms) VALUES (?1, ?2, ?3 + ?4)
    ON CONFLICT (key) DO UPDATE SET token = excluded.token, expires_at_ms = excluded.expires_at_ms
    WHERE holdfast_bench_floor.expires_at_ms <= ?3";

const RELEASE: &str = "DELETE FROM holdfast_bench_floor WHERE key = ?1 AND token = ?2";

fn map_err(e: rusqlite::Error) -> Error {
    let retryable =
        matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked));
    Error::backend(STORE, retryable, e)
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The SQLite floor.
pub struct SqliteFloor {
    conn: Arc<Mutex<Connection>>,
}

impl SqliteFloor {
    /// Opens the file of a `sqlite://` URL and creates the floor's table.
    pub async fn connect(url: &str) -> Result<Self> {
        let cfg = SqliteConfig::from_url(url)?;
        let conn = tokio::task::spawn_blocking(move || -> Result<Connection> {
            if let Some(dir) = cfg.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| Error::backend(STORE, false, e))?;
            }
            let conn = Connection::open(&cfg.path).map_err(map_err)?;
            conn.busy_timeout(cfg.busy_timeout).map_err(map_err)?;
            conn.pragma_update(None, "journal_mode", "WAL").map_err(map_err)?;
            conn.pragma_update(None, "synchronous", if cfg.synchronous_full { "FULL" } else { "NORMAL" })
                .map_err(map_err)?;
            conn.execute_batch(SCHEMA).map_err(map_err)?;
            Ok(conn)
        })
        .await
        .map_err(|e| Error::backend(STORE, false, e))??;
        Ok(SqliteFloor { conn: Arc::new(Mutex::new(conn)) })
    }

    async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let conn = self.conn.clone();
        let work = tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&conn).map_err(map_err)
        });
        match tokio::time::timeout(OP_TIMEOUT, work).await {
            Ok(joined) => joined.map_err(|e| Error::backend(STORE, false, e))?,
            Err(_) => Err(Error::backend(STORE, true, format!("no reply within {OP_TIMEOUT:?}"))),
        }
    }
}

#[async_trait]
impl Floor for SqliteFloor {
    fn describe(&self) -> &'static str {
        "rusqlite, one connection: INSERT .. ON CONFLICT DO UPDATE .. WHERE expired + DELETE .. WHERE token"
    }

    async fn acquire(&self, key: &str, token: OwnerToken, ttl: Duration) -> Result<bool> {
        let key = key.to_owned();
        let ttl_ms = ttl.as_millis() as i64;
        self.with_conn(move |c| {
            c.prepare_cached(ACQUIRE)?
                .execute(params![key, token.to_bytes().to_vec(), now_ms(), ttl_ms])
                .map(|n| n == 1)
        })
        .await
    }

    async fn release(&self, key: &str, token: OwnerToken) -> Result<bool> {
        let key = key.to_owned();
        self.with_conn(move |c| {
            c.prepare_cached(RELEASE)?.execute(params![key, token.to_bytes().to_vec()]).map(|n| n == 1)
        })
        .await
    }

    async fn acquire_rw(&self, key: &str, token: OwnerToken, ttl: Duration, write: bool) -> Result<bool> {
        let key = key.to_owned();
        let ttl_ms = ttl.as_millis() as i64;
        self.with_conn(move |c| {
            c.prepare_cached(if write { ACQUIRE_WRITE } else { ACQUIRE_READ })?
                .execute(params![key, token.to_bytes().to_vec(), now_ms(), ttl_ms])
                .map(|n| n == 1)
        })
        .await
    }

    async fn release_rw(&self, key: &str, token: OwnerToken) -> Result<bool> {
        let key = key.to_owned();
        self.with_conn(move |c| {
            c.prepare_cached(RELEASE_RW)?.execute(params![key, token.to_bytes().to_vec()]).map(|n| n == 1)
        })
        .await
    }
}
