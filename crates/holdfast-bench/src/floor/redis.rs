//! Redis floor: `SET key token NX PX ttl` to acquire, `EVALSHA` of a
//! compare-and-delete script to release, on one multiplexed connection of the
//! plain `redis` crate (for `redis+cluster://`: the crate's cluster
//! connection, which sends each command to the master of its key's slot).

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use holdfast::{Error, OwnerToken, Result};

use super::{Floor, OP_TIMEOUT};

const STORE: &str = "redis";

/// Deletes KEYS[1] if it holds ARGV[1].
const COMPARE_AND_DELETE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// A read share (ARGV[3] = "r": unless the writer key KEYS[2] exists, add the
/// token to the readers' sorted set KEYS[1], scored by expiry) or the write
/// side ("w": if no unexpired reader, SET KEYS[2] NX PX); one script call.
const ACQUIRE_RW: &str = "
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if ARGV[3] == 'r' then
  if redis.call('exists', KEYS[2]) == 1 then return 0 end
  redis.call('zadd', KEYS[1], now + ttl, ARGV[1])
  redis.call('pexpire', KEYS[1], ttl)
  return 1
end
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
if redis.call('zcard', KEYS[1]) > 0 then return 0 end
if redis.call('set', KEYS[2], ARGV[1], 'NX', 'PX', ttl) then return 1 end
return 0";

/// Releases the token's write side or read share.
const RELEASE_RW: &str = "
if redis.call('get', KEYS[2]) == ARGV[1] then return redis.call('del', KEYS[2]) end
return redis.call('zrem', KEYS[1], ARGV[1])";

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

/// The seed nodes of a holdfast `redis+cluster://[user:password@]h:p,h:p`
/// URL as `redis://` URLs the plain cluster client takes (holdfast's
/// options dropped).
fn cluster_nodes(url: &str) -> Result<Vec<String>> {
    let bad = || Error::invalid("url", "not a redis+cluster://HOST:PORT,HOST:PORT URL");
    let base = url.split_once('?').map_or(url, |(b, _)| b);
    let rest = base.split_once("://").map(|(_, r)| r).ok_or_else(bad)?;
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), rest),
    };
    let hosts = hosts.split_once('/').map_or(hosts, |(h, _)| h);
    let nodes: Vec<String> = hosts.split(',').map(|h| format!("redis://{userinfo}{h}")).collect();
    if nodes.iter().any(|n| n.ends_with('@') || n.ends_with("//")) {
        return Err(bad());
    }
    Ok(nodes)
}

/// A cluster connection to the nodes of a holdfast `redis+cluster://` URL.
///
/// # Cancel safety
///
/// Cancel-safe: a dropped call leaves only connections, closed with it.
pub(crate) async fn cluster_connection(url: &str) -> Result<redis::cluster_async::ClusterConnection> {
    let client = redis::cluster::ClusterClient::new(cluster_nodes(url)?)
        .map_err(|e| Error::invalid("url", format!("not a cluster URL the plain client accepts: {:?}", e.kind())))?;
    timed(client.get_async_connection()).await
}

/// A connection of the floor: to one server, or to a cluster.
#[derive(Clone)]
enum Conn {
    Plain(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Plain(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Plain(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Plain(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The Redis floor.
pub struct RedisFloor {
    conn: Conn,
    release: redis::Script,
    acquire_rw: redis::Script,
    release_rw: redis::Script,
}

/// The readers' set and the writer's key of a read-write lock, in one slot.
fn rw_keys(key: &str) -> [String; 2] {
    [format!("{{{key}}}:r"), format!("{{{key}}}:w")]
}

impl RedisFloor {
    /// Connects and loads the release script (on every node of a cluster).
    pub async fn connect(url: &str) -> Result<Self> {
        let cluster = url.split_once("://").is_some_and(|(s, _)| s.eq_ignore_ascii_case("redis+cluster"));
        let mut conn = match cluster {
            true => Conn::Cluster(cluster_connection(url).await?),
            false => Conn::Plain(plain_connection(url).await?),
        };
        let release = redis::Script::new(COMPARE_AND_DELETE);
        let (acquire_rw, release_rw) = (redis::Script::new(ACQUIRE_RW), redis::Script::new(RELEASE_RW));
        for script in [&release, &acquire_rw, &release_rw] {
            let _: String = timed(script.prepare_invoke().load_async(&mut conn)).await?;
        }
        Ok(RedisFloor { conn, release, acquire_rw, release_rw })
    }
}

#[async_trait]
impl Floor for RedisFloor {
    fn describe(&self) -> &'static str {
        match self.conn {
            Conn::Plain(_) => "redis-rs multiplexed connection: SET NX PX + EVALSHA compare-and-delete",
            Conn::Cluster(_) => "redis-rs cluster connection: SET NX PX + EVALSHA compare-and-delete",
        }
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

    async fn acquire_rw(&self, key: &str, token: OwnerToken, ttl: Duration, write: bool) -> Result<bool> {
        let mut conn = self.conn.clone();
        let [r, w] = rw_keys(key);
        let mut call = self.acquire_rw.key(r);
        call.key(w).arg(token.to_hex()).arg(ttl.as_millis() as u64).arg(if write { "w" } else { "r" });
        let taken: i64 = timed(call.invoke_async(&mut conn)).await?;
        Ok(taken == 1)
    }

    async fn release_rw(&self, key: &str, token: OwnerToken) -> Result<bool> {
        let mut conn = self.conn.clone();
        let [r, w] = rw_keys(key);
        let mut call = self.release_rw.key(r);
        call.key(w).arg(token.to_hex());
        let released: i64 = timed(call.invoke_async(&mut conn)).await?;
        Ok(released == 1)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cluster_nodes_of_a_holdfast_url() {
        assert_eq!(
            super::cluster_nodes("redis+cluster://u:pw@a:1,b:2/?timeout_ms=5").unwrap(),
            ["redis://u:pw@a:1", "redis://u:pw@b:2"]
        );
        assert_eq!(super::cluster_nodes("redis+cluster://a:1").unwrap(), ["redis://a:1"]);
        assert!(super::cluster_nodes("redis+cluster://a:1,").is_err());
    }
}
