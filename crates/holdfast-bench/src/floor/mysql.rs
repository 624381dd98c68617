//! MySQL/MariaDB floor: the statements holdfast's store sends, issued with a
//! plain `mysql_async` pool set up as holdfast sets up its own (same pool
//! size, no reset on return, READ COMMITTED sessions): to acquire, one
//! transaction of `UPDATE fence SET value = LAST_INSERT_ID(value + 1)`, the
//! conditional `INSERT ... ON DUPLICATE KEY UPDATE` (free or expired rows
//! only, expiry on the server's `UTC_TIMESTAMP(6)`) and `COMMIT` (or
//! `ROLLBACK` when busy); to release, one owner-checked `DELETE`. The fence is
//! part of the floor because it is what the store must do for the same work.

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
];

const FENCE: &str = "UPDATE holdfast_bench_floor_fence SET value = LAST_INSERT_ID(value + 1) WHERE id = 0";

const ACQUIRE: &str = "INSERT INTO holdfast_bench_floor (lock_key, token, fence, expires_at)
    VALUES (?, ?, LAST_INSERT_ID(), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
    ON DUPLICATE KEY UPDATE
      token = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(token), token),
      fence = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(fence), fence),
      expires_at = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(expires_at), expires_at)";

const RELEASE: &str = "DELETE FROM holdfast_bench_floor WHERE lock_key = ? AND token = ?";

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
        "mysql_async pool: BEGIN + UPDATE fence LAST_INSERT_ID + INSERT .. ON DUPLICATE KEY UPDATE if expired + COMMIT; DELETE .. WHERE token"
    }

    async fn acquire(&self, key: &str, token: OwnerToken, ttl: Duration) -> Result<bool> {
        let us = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
        timed(async {
            let mut conn = self.pool.get_conn().await?;
            let mut tx = conn.start_transaction(TxOpts::default()).await?;
            tx.exec_drop(FENCE, ()).await?;
            tx.exec_drop(ACQUIRE, (key.as_bytes(), &token.to_bytes()[..], us)).await?;
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
}
