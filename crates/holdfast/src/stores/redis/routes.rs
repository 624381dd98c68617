//! Script calls straight to the master of their slot, in a Redis Cluster.
//!
//! The `redis` crate's cluster connection passes every request to a task of
//! its own, which picks the node and sends it on that node's connection
//! (another task), with a copy of the command: two task hand-offs and a copy
//! per request, which measured as a third of the lock cycle in a cluster
//! (uncontended, 0.64-0.65x of one server on the same machine). For script
//! calls (`FCALL`, `EVALSHA`), this keeps a map of slot to master (`CLUSTER
//! SLOTS`) and one multiplexed connection per master, and sends the call on
//! the connection of its first key's slot.
//!
//! The cluster connection stays the authority: a call with no map yet (it is
//! built in the background, after the first call asks for it), and a call a
//! node answers with a redirect (`MOVED`, `ASK`: a slot that moves),
//! `TRYAGAIN`, `CLUSTERDOWN` or `READONLY` (not run by that node), goes
//! through it, and the map is dropped and built again. After a connection
//! error (the call may have run) the map is dropped and the error returned,
//! as from any connection: the store's one resend of an idempotent script
//! then goes through the cluster connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, ServerErrorKind, Value};

use super::cluster::ClusterSettings;

/// The slot map and a connection to each master.
struct SlotMap {
    node_of: HashMap<Slot, usize>,
    nodes: Vec<MultiplexedConnection>,
}

/// Direct routes of one cluster connection's script calls.
pub(super) struct Routes {
    username: Option<String>,
    password: Option<String>,
    connect_timeout: Duration,
    response_timeout: Duration,
    map: RwLock<Option<Arc<SlotMap>>>,
    building: AtomicBool,
}

/// The number of slots of a cluster.
const SLOTS: u16 = 16384;

/// Whether a node did not run a call it answered with `e`: the slot is not
/// (or not only) its own, or it is not a master now.
fn not_run_here(e: &redis::RedisError) -> bool {
    e.is_cluster_error() || matches!(e.kind(), ErrorKind::Server(ServerErrorKind::ReadOnly))
}

/// The key whose slot a script call goes to: its first (`FCALL`/`EVALSHA`
/// name numkeys key ...); `None` for any other command.
fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().map(|a| match a {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()??;
    if !(name.eq_ignore_ascii_case(b"FCALL") || name.eq_ignore_ascii_case(b"EVALSHA")) {
        return None;
    }
    let numkeys = args.nth(1)??;
    if numkeys.is_empty() || numkeys == b"0" {
        return None;
    }
    args.next()?
}

impl Routes {
    /// Routes for a cluster whose nodes log in as `settings` says.
    pub(super) fn new(settings: &ClusterSettings, connect_timeout: Duration, response_timeout: Duration) -> Self {
        Routes {
            username: settings.username.clone(),
            password: settings.password.as_ref().map(|p| p.expose().to_owned()),
            connect_timeout,
            response_timeout,
            map: RwLock::new(None),
            building: AtomicBool::new(false),
        }
    }

    /// Sends `cmd` straight to its slot's master if it is a script call and
    /// the map is known; `None` if it must go through `cluster` (the map is
    /// then built in the background if it is missing).
    ///
    /// # Cancel safety
    ///
    /// As a command on a multiplexed connection: a dropped call may have run.
    pub(super) async fn send(
        self: &Arc<Self>,
        cmd: &Cmd,
        cluster: &ClusterConnection,
    ) -> Option<redis::RedisResult<Value>> {
        let key = first_key(cmd)?;
        let map = self.map.read().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(map) = map else {
            self.build_later(cluster.clone());
            return None;
        };
        let mut node = map.nodes[*map.node_of.get(&Slot::for_key(key))?].clone();
        // A server's error reply comes as a value; as an error here.
        match node.req_packed_command(cmd).await.and_then(Value::extract_error) {
            Err(e) if not_run_here(&e) => {
                self.forget(&map);
                None
            }
            Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => {
                self.forget(&map);
                Some(Err(e))
            }
            other => Some(other),
        }
    }

    /// Drops `map` if it is still the current one.
    fn forget(&self, map: &Arc<SlotMap>) {
        let mut current = self.map.write().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, map)) {
            *current = None;
        }
    }

    /// Builds the map on a task of its own unless one is at it.
    fn build_later(self: &Arc<Self>, cluster: ClusterConnection) {
        if self.building.swap(true, Ordering::AcqRel) {
            return;
        }
        let routes = self.clone();
        tokio::spawn(async move {
            match routes.build(cluster).await {
                Ok(map) => *routes.map.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(map)),
                Err(e) => {
                    tracing::debug!(error = %e, "no direct routes to the cluster's masters; calls go through the cluster connection")
                }
            }
            // A failed build is tried again by a later call, not before a second.
            tokio::time::sleep(Duration::from_secs(1)).await;
            routes.building.store(false, Ordering::Release);
        });
    }

    /// Reads the slot map (`CLUSTER SLOTS`) and connects to every master.
    async fn build(&self, mut cluster: ClusterConnection) -> redis::RedisResult<SlotMap> {
        let slots: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut cluster).await?;
        let mut addrs: Vec<(String, u16)> = Vec::new();
        let mut node_of = HashMap::with_capacity(usize::from(SLOTS));
        for range in slots {
            let Value::Array(fields) = range else { continue };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                continue;
            };
            let host = match master.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => continue,
            };
            let Some(&Value::Int(port)) = master.get(1) else { continue };
            let (Ok(port), false) = (u16::try_from(port), host.is_empty()) else { continue };
            let index = match addrs.iter().position(|a| a.0 == host && a.1 == port) {
                Some(i) => i,
                None => {
                    addrs.push((host, port));
                    addrs.len() - 1
                }
            };
            for slot in (*start).max(0)..=(*end).min(i64::from(SLOTS) - 1) {
                if let Some(slot) = u16::try_from(slot).ok().and_then(Slot::new) {
                    node_of.insert(slot, index);
                }
            }
        }
        let mut nodes = Vec::with_capacity(addrs.len());
        for (host, port) in addrs {
            nodes.push(self.connect(host, port).await?);
        }
        Ok(SlotMap { node_of, nodes })
    }

    /// A connection to the node at `host:port`, logged in as the cluster's nodes are.
    async fn connect(&self, host: String, port: u16) -> redis::RedisResult<MultiplexedConnection> {
        let info = ConnectionAddr::Tcp(host, port).into_connection_info()?;
        let mut login = info.redis_settings().clone();
        if let Some(user) = &self.username {
            login = login.set_username(user);
        }
        if let Some(password) = &self.password {
            login = login.set_password(password);
        }
        let client = redis::Client::open(info.set_redis_settings(login))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout));
        client.get_multiplexed_async_connection_with_config(&config).await
    }

    /// How many masters the current map routes to (0: none known).
    pub(super) fn masters(&self) -> usize {
        self.map.read().unwrap_or_else(|p| p.into_inner()).as_ref().map_or(0, |m| m.nodes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_script_calls_have_a_first_key() {
        let mut fcall = redis::cmd("FCALL");
        fcall.arg("holdfast_x_acquire").arg(3).arg("{p:k}").arg("{p:k}:q").arg("tok");
        assert_eq!(first_key(&fcall), Some(&b"{p:k}"[..]));
        let mut evalsha = redis::cmd("evalsha");
        evalsha.arg("abc").arg(1).arg("{p:j}");
        assert_eq!(first_key(&evalsha), Some(&b"{p:j}"[..]));
        let mut no_keys = redis::cmd("FCALL");
        no_keys.arg("f").arg(0).arg("not-a-key");
        assert_eq!(first_key(&no_keys), None);
        let mut get = redis::cmd("GET");
        get.arg("{p:k}");
        assert_eq!(first_key(&get), None);
    }
}
