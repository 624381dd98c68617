//! MySQL/MariaDB floor: the statements holdfast's store sends (per-key
//! fences), issued with a plain `mysql_async` pool set up as holdfast sets up
//! its own (same pool size, no reset on return, READ COMMITTED sessions): to
//! acquire a key that has a row, one autocommit `UPDATE` that takes over a
//! free row with its fence + 1 (`LAST_INSERT_ID(fence + 1)`, expiry on the
//! server's `UTC_TIMESTAMP(6)`); for a key without a row, one transaction of
//! `UPDATE fence SET value = LAST_INSERT_ID(value + 1)`, `INSERT ... ON
//! DUPLICATE KEY UPDATE lock_key = lock_key` and `COMMIT` (or `ROLLBACK`);
//! to release, one owner-checked `UPDATE` that leaves the row (its fence) as
//! the released marker. The fence is part of the floor because it is what
//! the store must do for the same work.
//!
//! Its read-write lock is the least a hand-written one costs there: a share
//! is a row of `holdfast_bench_floor_rw`; one `CALL` of a procedure locks
//! the key's row of `holdfast_bench_floor_rw_gate` in a transaction, so that
//! attempts on a key run one at a time, reads the key's shares after that
//! lock (READ COMMITTED reads each statement's latest commits), inserts
//! unless an unexpired writer (for a reader) or any unexpired holder (for a
//! writer) is there, and commits; the release deletes the token's row.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use holdfast::stores::mysql::MysqlConfig;
use holdfast::{Error, OwnerToken, Result};
use mysql_async::prelude::Queryable;
use mysql_async::{OptsBuilder, Pool, PoolConstraints, PoolOpts, TxOpts};

use super::{Floor, OP_TIMEOUT};

const STORE: &str = "mysql";

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS holdfast_bench_floor (
        lock_key   VARBINARY(256) NOT NULL PRIMARY KEY,
        token      BINARY(16) NOT NULL,
        fence      BIGINT UNSIGNED NOT NULL,
        expires_at DATETIME(6) NOT NULL
    ) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS holdfast_bench_floor_fence (
        id TINYINT UNSIGNED NOT NULL PRIMARY KEY, value BIGINT UNSIGNED NOT NULL
    ) ENGINE=InnoDB",
    "INSERT IGNORE INTO holdfast_bench_floor_fence (id, value) VALUES (0, 0)",
    "CREATE TABLE IF NOT EXISTS holdfast_bench_floor_rw_gate (
        lock_key VARBINARY(256) NOT NULL PRIMARY KEY
    ) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS holdfast_bench_floor_rw (
        lock_key   VARBINARY(256) NOT NULL,
        token      BINARY(16) NOT NULL,
        writer     BOOLEAN NOT NULL,
        expires_at DATETIME(6) NOT NULL,
        PRIMARY KEY (lock_key, token)
    ) ENGINE=InnoDB",
    "CREATE PROCEDURE IF NOT EXISTS holdfast_bench_floor_rw_acquire(
        IN k VARBINARY(256), IN tok BINARY(16), IN w BOOLEAN, IN us BIGINT)
    BEGIN
        DECLARE busy INT DEFAULT 0;
        START TRANSACTION;
        -- An exclusive lock on the key's gate row whether it is new or not
        -- (INSERT IGNORE then a locking read took a shared lock first, and
        -- two callers upgrading theirs deadlocked).
        INSERT INTO holdfast_bench_floor_rw_gate (lock_key) VALUES (k) ON DUPLICATE KEY UPDATE lock_key = lock_key;
        SELECT COUNT(*) INTO busy FROM holdfast_bench_floor_rw
            WHERE lock_key = k AND token <> tok AND expires_at > UTC_TIMESTAMP(6) AND (writer OR w);
        IF busy = 0 THEN
            INSERT INTO holdfast_bench_floor_rw (lock_key, token, writer, expires_at)
                VALUES (k, tok, w, UTC_TIMESTAMP(6) + INTERVAL us MICROSECOND)
                ON DUPLICATE KEY UPDATE writer = VALUES(writer), expires_at = VALUES(expires_at);
        END IF;
        COMMIT;
        SELECT busy = 0;
    END",
];

const ACQUIRE_RW: &str = "CALL holdfast_bench_floor_rw_acquire(?, ?, ?, ?)";

const RELEASE_RW: &str = "DELETE FROM holdfast_bench_floor_rw WHERE lock_key = ? AND token = ?";

const FENCE: &str = "UPDATE holdfast_bench_floor_fence SET value = LAST_INSERT_ID(value + 1) WHERE id = 0";

const TAKE_OVER: &str = "UPDATE holdfast_bench_floor SET
      fence = IF(expires_at <= UTC_TIMESTAMP(6), LAST_INSERT_ID(fence + 1), fence),
      token = IF(expires_at <= UTC_TIMESTAMP(6), ?, token),
      expires_at = IF(expires_at <= UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, expires_at)
    WHERE lock_key = ?";

const INSERT: &str = "INSERT INTO holdfast_bench_floor (lock_key, token, fence, expires_at)
    VALUES (?, ?, LAST_INSERT_ID(), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
    ON DUPLICATE KEY UPDATE lock_key = lock_key";

const RELEASE: &str = "UPDATE holdfast_bench_floor SET token = X'FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF',
      expires_at = UTC_TIMESTAMP(6) WHERE lock_key = ? AND token = ?";

fn map_err(e: mysql_async::Error) -> Error {
    let retryable = match &e {
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => true,
        mysql_async::Error::Server(s) => matches!(s.code, 1205 | 1213),
        _ => false,
    };
    Error::backend(STORE, retryable, e)
}

async fn timed<T>(f: impl Future<Output = mysql_async::Result<T>>) -> Result<T> {
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(r) => r.map_err(map_err),
        Err(_) => Err(Error::backend(STORE, true, format!("no reply within {OP_TIMEOUT:?}"))),
    }
}

/// The MySQL/MariaDB floor.
pub struct MysqlFloor {
    pool: Pool,
}

impl MysqlFloor {
    /// Connects to the server of a holdfast `mysql://` URL and creates the floor's tables.
    pub async fn connect(url: &str) -> Result<Self> {
        let c = MysqlConfig::from_url(url)?;
        let opts = OptsBuilder::default()
            .ip_or_hostname(c.host.clone())
            .tcp_port(c.port)
            .user(Some(c.user.clone()))
            .pass(c.password().map(str::to_owned))
            .db_name(Some(c.database.clone()))
            .stmt_cache_size(64)
            .init(vec!["SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"])
            .pool_opts(
                PoolOpts::default()
                    .with_constraints(PoolConstraints::new(0, c.pool_max).unwrap_or_default())
                    .with_inactive_connection_ttl(Duration::from_secs(60))
                    .with_reset_connection(false),
            );
        let pool = Pool::new(opts);
        timed(async {
            let mut conn = pool.get_conn().await?;
            for s in SCHEMA {
                conn.query_drop(*s).await?;
            }
            Ok(())
        })
        .await?;
        Ok(MysqlFloor { pool })
    }
}

#[async_trait]
impl Floor for MysqlFloor {
    fn describe(&self) -> &'static str {
        "mysql_async pool: UPDATE row SET fence = LAST_INSERT_ID(fence + 1) if free (a key without a row: BEGIN + \
         UPDATE counter + INSERT + COMMIT); UPDATE row to the released marker WHERE token; read-write: one CALL \
         (the key's gate row locked, a read, an INSERT, COMMIT) + DELETE .. WHERE token"
    }

    async fn acquire(&self, key: &str, token: OwnerToken, ttl: Duration) -> Result<bool> {
        let us = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
        timed(async {
            let mut conn = self.pool.get_conn().await?;
            let tok = token.to_bytes();
            conn.exec_drop(TAKE_OVER, (&tok[..], us, key.as_bytes())).await?;
            if conn.last_insert_id().is_some() {
                return Ok(true);
            }
            if !conn.info().contains("Rows matched: 0") {
                return Ok(false);
            }
            let mut tx = conn.start_transaction(TxOpts::default()).await?;
            tx.exec_drop(FENCE, ()).await?;
            tx.exec_drop(INSERT, (key.as_bytes(), &tok[..], us)).await?;
            if tx.affected_rows() == 0 {
                tx.rollback().await?;
                return Ok(false);
            }
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    async fn release(&self, key: &str, token: OwnerToken) -> Result<bool> {
        timed(async {
            let mut conn = self.pool.get_conn().await?;
            conn.exec_drop(RELEASE, (key.as_bytes(), &token.to_bytes()[..])).await?;
            Ok(conn.affected_rows() == 1)
        })
        .await
    }

    async fn acquire_rw(&self, key: &str, token: OwnerToken, ttl: Duration, write: bool) -> Result<bool> {
        let us = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
        timed(async {
            let mut conn = self.pool.get_conn().await?;
            let granted: Option<i64> =
                conn.exec_first(ACQUIRE_RW, (key.as_bytes(), &token.to_bytes()[..], write, us)).await?;
            Ok(granted == Some(1))
        })
        .await
    }

    async fn release_rw(&self, key: &str, token: OwnerToken) -> Result<bool> {
        timed(async {
            let mut conn = self.pool.get_conn().await?;
            conn.exec_drop(RELEASE_RW, (key.as_bytes(), &token.to_bytes()[..])).await?;
            Ok(conn.affected_rows() == 1)
        })
        .await
    }
}
