//! PostgreSQL floor: holdfast's own two statements (the acquire CTE that
//! takes over the key's released or expired row with its fence + 1, or for
//! a key without a row bumps the namespace's fence counter and inserts, and
//! the owner-checked release that keeps the row), prepared once and sent by a
//! plain tokio-postgres client on one connection with the same connection
//! settings as the URL gives holdfast. So `holdfast / floor` is the cost of
//! the client around the statements (renewal, cancel safety, waiting), not of
//! the SQL. TLS modes other than `disable`/`prefer` are not supported here.
//!
//! Its read-write lock is the least a hand-written one costs on PostgreSQL:
//! a share is a row of `holdfast_bench_floor_rw` (key, token, writer,
//! expiry); one call of a PL/pgSQL function takes the key's transaction
//! advisory lock, so that attempts on a key run one at a time, then, in a
//! statement whose snapshot is taken after that lock (READ COMMITTED takes
//! one per statement), grants unless an unexpired writer (for a reader) or
//! any unexpired holder (for a writer) is there; the release deletes the
//! token's row.

use std::time::Duration;

use async_trait::async_trait;
use holdfast::stores::postgres::{PostgresBackend, PostgresConfig, SslMode};
use holdfast::{Error, OwnerToken, Result};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls, Statement};

use super::{Floor, OP_TIMEOUT};

const STORE: &str = "postgres";

fn map_err(e: tokio_postgres::Error) -> Error {
    let retryable = e.code().is_none();
    Error::backend(STORE, retryable, e)
}

async fn timed<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(OP_TIMEOUT, f)
        .await
        .map_err(|_| Error::backend(STORE, true, format!("no reply within {OP_TIMEOUT:?}")))?
}

/// The PostgreSQL floor.
pub struct PostgresFloor {
    client: Client,
    acquire: Statement,
    release: Statement,
    acquire_rw: Statement,
    release_rw: Statement,
}

/// The read-write floor's table and function in schema `s` (quoted).
fn rw_ddl(s: &str) -> String {
    format!(
        "SELECT pg_advisory_xact_lock(hashtextextended('holdfast_bench_floor_rw ddl', 0));
         CREATE TABLE IF NOT EXISTS {s}.holdfast_bench_floor_rw (
             key text NOT NULL, token bytea NOT NULL, writer bool NOT NULL, expires_at timestamptz NOT NULL,
             PRIMARY KEY (key, token));
         CREATE OR REPLACE FUNCTION {s}.holdfast_bench_floor_rw_acquire(k text, tok bytea, w bool, ttl_ms int8)
         RETURNS bool LANGUAGE plpgsql VOLATILE AS $f$
         BEGIN
             PERFORM pg_advisory_xact_lock(hashtextextended(k, 0));
             IF EXISTS (SELECT 1 FROM {s}.holdfast_bench_floor_rw r
                        WHERE r.key = k AND r.expires_at > clock_timestamp() AND (r.writer OR w)) THEN
                 RETURN false;
             END IF;
             INSERT INTO {s}.holdfast_bench_floor_rw AS r (key, token, writer, expires_at)
             VALUES (k, tok, w, clock_timestamp() + ttl_ms * interval '1 millisecond')
             ON CONFLICT (key, token) DO UPDATE SET writer = excluded.writer, expires_at = excluded.expires_at;
             RETURN true;
         END $f$;"
    )
}

impl PostgresFloor {
    /// Connects with the settings of a `postgres://` URL (holdfast's options
    /// such as `schema` and `table` are honoured), creating holdfast's tables
    /// if needed.
    pub async fn connect(url: &str) -> Result<Self> {
        let cfg = PostgresConfig::from_url(url)?;
        if !matches!(cfg.ssl_mode, SslMode::Disable | SslMode::Prefer) {
            return Err(Error::Unsupported { store: "holdfast-bench", what: "a postgres floor over TLS" });
        }
        // Creates the namespace exactly as holdfast would.
        drop(PostgresBackend::open(cfg.clone()).await?);
        let (t, f) =
            (format!("\"{}\".\"{}\"", cfg.schema, cfg.table), format!("\"{}\".\"{}_fence\"", cfg.schema, cfg.table));
        // Per-key fences: a key with a row takes its fence + 1 under the
        // row's lock; only a key without one draws from the counter (row 1).
        let acquire_sql = format!(
            "WITH cur AS (
                 SELECT token, fence, expires_at, wanted FROM {t} WHERE key = $1
             ), f AS (
                 UPDATE {f} SET value = value + 1
                 WHERE id = 1 AND NOT EXISTS (SELECT 1 FROM cur)
                 RETURNING value
             ), ins AS (
                 INSERT INTO {t} AS l (key, token, fence, label, acquired_at, expires_at, wanted)
                 SELECT $1, $2, f.value, 'floor', clock_timestamp(),
                        clock_timestamp() + $3::int8 * interval '1 millisecond', false
                 FROM f
                 ON CONFLICT (key) DO UPDATE
                     SET token = excluded.token, fence = greatest(l.fence + 1, excluded.fence),
                         label = excluded.label, acquired_at = excluded.acquired_at,
                         expires_at = excluded.expires_at, wanted = excluded.wanted
                     WHERE l.expires_at <= clock_timestamp()
                 RETURNING l.fence
             ), up AS (
                 UPDATE {t} AS l SET token = $2, fence = l.fence + 1, label = 'floor',
                     acquired_at = clock_timestamp(),
                     expires_at = clock_timestamp() + $3::int8 * interval '1 millisecond', wanted = false
                 WHERE key = $1 AND expires_at <= clock_timestamp() AND EXISTS (SELECT 1 FROM cur)
                 RETURNING l.fence
             )
             SELECT coalesce((SELECT fence FROM ins), (SELECT fence FROM up))"
        );
        // The release keeps the row (its fence) as the released marker.
        let release_sql = format!(
            "UPDATE {t} SET token = '\\x'::bytea, label = '', expires_at = least(expires_at, clock_timestamp())
             WHERE key = $1 AND token = $2"
        );
        timed(async {
            let (client, connection) = cfg.connection_config().connect(NoTls).await.map_err(map_err)?;
            tokio::spawn(connection);
            let acquire =
                client.prepare_typed(&acquire_sql, &[Type::TEXT, Type::BYTEA, Type::INT8]).await.map_err(map_err)?;
            let release = client.prepare_typed(&release_sql, &[Type::TEXT, Type::BYTEA]).await.map_err(map_err)?;
            let s = format!("\"{}\"", cfg.schema);
            client.batch_execute(&format!("BEGIN; {}; COMMIT", rw_ddl(&s))).await.map_err(map_err)?;
            let acquire_rw = client
                .prepare_typed(
                    &format!("SELECT {s}.holdfast_bench_floor_rw_acquire($1, $2, $3, $4)"),
                    &[Type::TEXT, Type::BYTEA, Type::BOOL, Type::INT8],
                )
                .await
                .map_err(map_err)?;
            let release_rw = client
                .prepare_typed(
                    &format!("DELETE FROM {s}.holdfast_bench_floor_rw WHERE key = $1 AND token = $2"),
                    &[Type::TEXT, Type::BYTEA],
                )
                .await
                .map_err(map_err)?;
            Ok(PostgresFloor { client, acquire, release, acquire_rw, release_rw })
        })
        .await
    }
}

#[async_trait]
impl Floor for PostgresFloor {
    fn describe(&self) -> &'static str {
        "tokio-postgres, one connection, prepared: holdfast's acquire statement (the row's fence + 1, or the \
         counter + INSERT .. ON CONFLICT DO UPDATE .. WHERE expired) + UPDATE .. WHERE token (row kept); \
         read-write: one PL/pgSQL call (the key's advisory lock, a check, an INSERT) + DELETE .. WHERE token"
    }

    async fn acquire(&self, key: &str, token: OwnerToken, ttl: Duration) -> Result<bool> {
        let token = token.to_bytes().to_vec();
        let ttl_ms = ttl.as_millis() as i64;
        timed(async {
            let row = self.client.query_one(&self.acquire, &[&key, &token, &ttl_ms]).await.map_err(map_err)?;
            Ok(row.try_get::<_, Option<i64>>(0).map_err(map_err)?.is_some())
        })
        .await
    }

    async fn release(&self, key: &str, token: OwnerToken) -> Result<bool> {
        let token = token.to_bytes().to_vec();
        timed(async { Ok(self.client.execute(&self.release, &[&key, &token]).await.map_err(map_err)? == 1) }).await
    }

    async fn acquire_rw(&self, key: &str, token: OwnerToken, ttl: Duration, write: bool) -> Result<bool> {
        let token = token.to_bytes().to_vec();
        let ttl_ms = ttl.as_millis() as i64;
        timed(async {
            let row =
                self.client.query_one(&self.acquire_rw, &[&key, &token, &write, &ttl_ms]).await.map_err(map_err)?;
            row.try_get::<_, bool>(0).map_err(map_err)
        })
        .await
    }

    async fn release_rw(&self, key: &str, token: OwnerToken) -> Result<bool> {
        let token = token.to_bytes().to_vec();
        timed(async { Ok(self.client.execute(&self.release_rw, &[&key, &token]).await.map_err(map_err)? == 1) }).await
    }
}
