//! Redis floor: `SET key token NX PX ttl` to acquire, `EVALSHA` of a
//! compare-and-delete script to release, on one multiplexed connection of the
//! plain `redis` crate.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use holdfast::{Error, OwnerToken, Result};

use super::{Floor, OP_TIMEOUT};

const STORE: &str = "redis";

/// Deletes KEYS[1] if it holds ARGV[1].
const COMPARE_AND_DELETE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

fn map_err(e: redis::RedisError) -> Error {
    let retryable = e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal();
    Error::backend(STORE, retryable, e)
}

/// Runs a redis call with [`OP_TIMEOUT`].
pub(crate) async fn timed<T>(f: impl Future<Output = redis::RedisResult<T>>) -> Result<T> {
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(r) => r.map_err(map_err),
        Err(_) => Err(Error::backend(STORE, true, format!("no reply within {OP_TIMEOUT:?}"))),
    }
}

/// A plain multiplexed connection to the server of a holdfast `redis://` URL
/// (holdfast's own `?options` are dropped; the password never appears in errors).
pub(crate) async fn plain_connection(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    let base = url.split_once('?').map_or(url, |(b, _)| b);
    let client = redis::Client::open(base)
        .map_err(|e| Error::invalid("url", format!("not a redis URL the plain client accepts: {:?}", e.kind())))?;
    timed(client.get_multiplexed_async_connection()).await
}

/// The Redis floor.
pub struct RedisFloor {
    conn: redis::aio::MultiplexedConnection,
    release: redis::Script,
}

impl RedisFloor {
    /// Connects and loads the release script.
    pub async fn connect(url: &str) -> Result<Self> {
        let mut conn = plain_connection(url).await?;
        let release = redis::Script::new(COMPARE_AND_DELETE);
        let _: String = timed(release.prepare_invoke().load_async(&mut conn)).await?;
        Ok(RedisFloor { conn, release })
    }
}

#[async_trait]
impl Floor for RedisFloor {
    fn describe(&self) -> &'static str {
        "redis-rs multiplexed connection: SET NX PX + EVALSHA compare-and-delete"
    }

    async fn acquire(&self, key: &str, token: OwnerToken, ttl: Duration) -> Result<bool> {
        let mut conn = self.conn.clone();
        let reply: Option<String> = timed(
            redis::cmd("SET")
                .arg(key)
                .arg(token.to_hex())
                .arg("NX")
                .arg("PX")
                .arg(ttl.as_millis() as u64)
                .query_async(&mut conn),
        )
        .await?;
        Ok(reply.is_some())
    }

    async fn release(&self, key: &str, token: OwnerToken) -> Result<bool> {
        let mut conn = self.conn.clone();
        let deleted: i64 = timed(self.release.key(key).arg(token.to_hex()).invoke_async(&mut conn)).await?;
        Ok(deleted == 1)
    }
}
