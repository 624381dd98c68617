//! The store's connections: a plain reconnecting `ConnectionManager` for
//! `redis://`, one that follows the master through the sentinels for
//! `redis+sentinel://`, or the `redis` crate's cluster connection for
//! `redis+cluster://` (it routes each command to the master of its key's
//! slot, follows `MOVED` and `ASK`, reconnects, and resubscribes pub/sub
//! channels on its own; see `cluster.rs`), with script calls sent straight
//! to their slot's master where the routes know it (`routes.rs`).
//!
//! A followed connection sends on a `ConnectionManager` to the master the
//! sentinels last named. When a call fails with a connection error,
//! `READONLY` (the server was turned into a replica), `LOADING` or
//! `MASTERDOWN`, it asks the sentinels again before it returns the error;
//! when they name another master, every later call goes to a new manager
//! there. The store's one resend of an idempotent script
//! (`RedisBackend::invoke_on`) then reaches the new master. Until the
//! sentinels have promoted a replica they name the dead master; its lookup
//! fails the `ROLE` check and the connection stays where it is.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, Pipeline, ProtocolVersion, RedisFuture, Value};

use super::config::RedisConfig;
use super::routes::Routes;
use super::sentinel::Resolver;
use super::{map_err, timed_out};
use crate::vocabulary::error::{Error, Result};

/// One of the store's connections (commands, renewal, pub/sub).
#[derive(Clone)]
pub(super) enum Link {
    /// A fixed server (`redis://`, `rediss://`).
    Direct(ConnectionManager),
    /// The master the sentinels name (`redis+sentinel://`).
    Followed(Arc<Followed>),
    /// A Redis Cluster (`redis+cluster://`): each command goes to the
    /// master of its first key's slot; script calls straight there when
    /// the routes know it (routes.rs; not on the pub/sub connection).
    Cluster(ClusterConnection, Option<Arc<Routes>>),
}

/// A connection that follows the master.
pub(super) struct Followed {
    resolver: Arc<Resolver>,
    protocol: ProtocolVersion,
    config: ConnectionManagerConfig,
    connect_limit: Duration,
    /// Shared, so that each call takes it without copying its address.
    current: RwLock<Arc<Current>>,
    /// One lookup at a time; holds when the last one started.
    lookup: tokio::sync::Mutex<Option<tokio::time::Instant>>,
}

struct Current {
    generation: u64,
    addr: String,
    conn: ConnectionManager,
}

/// The shortest time between two lookups of one connection: a failing
/// master fails every call, and each call need not ask the sentinels.
const LOOKUP_SPACING: Duration = Duration::from_millis(100);

/// Errors after which the master may have moved.
fn may_have_moved(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::BusyLoading | ServerErrorKind::MasterDown)
        )
}

impl Followed {
    fn current(&self) -> Arc<Current> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The current generation and a handle of its connection.
    fn current_conn(&self) -> (u64, ConnectionManager) {
        let current = self.current();
        (current.generation, current.conn.clone())
    }

    /// Passes `r` on, after asking the sentinels again if its error says
    /// the master may have moved since generation `seen`.
    ///
    /// # Cancel safety
    ///
    /// As [`follow`](Self::follow): a drop leaves the connection in place.
    async fn after<T>(&self, seen: u64, r: redis::RedisResult<T>) -> redis::RedisResult<T> {
        if let Err(e) = &r {
            if may_have_moved(e) {
                self.follow(seen).await;
            }
        }
        r
    }

    /// Asks the sentinels again after an error seen on generation `seen`,
    /// and moves to the master they name if it is another one.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the move is one assignment after the new connection is
    /// up; a call dropped before leaves the old connection in place.
    async fn follow(&self, seen: u64) {
        let mut last = self.lookup.lock().await;
        if self.current().generation != seen {
            return; // another call moved already
        }
        let now = tokio::time::Instant::now();
        if last.is_some_and(|t| now - t < LOOKUP_SPACING) {
            return;
        }
        *last = Some(now);
        let client = match self.resolver.master(self.protocol).await {
            Ok(client) => client,
            Err(e) => {
                tracing::debug!(master = self.resolver.master_name(), error = %e, "no master from the sentinels yet");
                return;
            }
        };
        let addr = client.get_connection_info().addr().to_string();
        if addr == self.current().addr {
            return; // the manager reconnects to the same master by itself
        }
        let connect = ConnectionManager::new_with_config(client, self.config.clone());
        match tokio::time::timeout(self.connect_limit, connect).await {
            Ok(Ok(conn)) => {
                let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
                tracing::info!(master = self.resolver.master_name(), from = %current.addr, to = %addr,
                    "redis master moved; following it");
                *current = Arc::new(Current { generation: current.generation + 1, addr, conn });
            }
            Ok(Err(e)) => tracing::debug!(%addr, error = %e, "cannot connect to the new master yet"),
            Err(_) => tracing::debug!(%addr, "connecting to the new master timed out"),
        }
    }
}

impl Link {
    /// How many times this connection moved to another master (0 for a
    /// fixed server). A change means the commands sent since went to
    /// another server.
    pub(super) fn generation(&self) -> u64 {
        match self {
            Link::Direct(_) | Link::Cluster(..) => 0,
            Link::Followed(f) => f.current().generation,
        }
    }

    /// In a cluster, how many masters script calls go straight to (0
    /// until the routes are known); `None` elsewhere.
    pub(super) fn direct_masters(&self) -> Option<usize> {
        match self {
            Link::Cluster(_, Some(routes)) => Some(routes.masters()),
            _ => None,
        }
    }

    /// Loads every script on every master of a cluster (`SCRIPT LOAD`,
    /// routed by the current slot map); nothing elsewhere. After a
    /// failover the `redis` crate's own load after a `NOSCRIPT` went to the
    /// nodes it knew before, not to the promoted replica, and the call
    /// failed with `NOSCRIPT` again (`redis_cluster::follows_a_failover_to_the_replica`).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: loading a script twice changes nothing.
    pub(super) async fn load_on_every_master(&mut self, sources: &[String]) -> redis::RedisResult<()> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
        let Link::Cluster(c, _) = self else { return Ok(()) };
        for code in sources {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(code);
            let route =
                RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, Some(ResponsePolicy::OneSucceeded)));
            c.route_command(cmd, route).await?;
        }
        Ok(())
    }

    /// Subscribes the pub/sub connection to `channel`.
    ///
    /// # Cancel safety
    ///
    /// As `ConnectionManager::subscribe`: a dropped call may or may not
    /// have subscribed.
    pub(super) async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        let f = match self {
            Link::Direct(c) => return c.subscribe(channel).await,
            Link::Cluster(c, _) => return c.subscribe(channel).await,
            Link::Followed(f) => f,
        };
        let (seen, mut conn) = f.current_conn();
        let r = conn.subscribe(channel).await;
        let r = f.after(seen, r).await;
        if r.is_err() && f.current().generation != seen {
            // Moved to another master meanwhile: subscribing is idempotent,
            // so subscribe there rather than leave the waiter to its poll.
            return f.current_conn().1.subscribe(channel).await;
        }
        r
    }

    /// Unsubscribes the pub/sub connection from `channel`.
    ///
    /// # Cancel safety
    ///
    /// As `ConnectionManager::unsubscribe`: a dropped call may or may not
    /// have unsubscribed.
    pub(super) async fn unsubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        let f = match self {
            Link::Direct(c) => return c.unsubscribe(channel).await,
            Link::Cluster(c, _) => return c.unsubscribe(channel).await,
            Link::Followed(f) => f,
        };
        let (seen, mut conn) = f.current_conn();
        let r = conn.unsubscribe(channel).await;
        f.after(seen, r).await
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Direct(c) => c.req_packed_command(cmd),
            Link::Cluster(c, None) => c.req_packed_command(cmd),
            Link::Cluster(c, Some(routes)) => Box::pin(async move {
                match routes.send(cmd, c).await {
                    Some(r) => r,
                    None => c.req_packed_command(cmd).await,
                }
            }),
            Link::Followed(f) => Box::pin(async move {
                let (seen, mut conn) = f.current_conn();
                let r = conn.req_packed_command(cmd).await;
                f.after(seen, r).await
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Direct(c) => c.req_packed_commands(cmd, offset, count),
            Link::Cluster(c, _) => c.req_packed_commands(cmd, offset, count),
            Link::Followed(f) => Box::pin(async move {
                let (seen, mut conn) = f.current_conn();
                let r = conn.req_packed_commands(cmd, offset, count).await;
                f.after(seen, r).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Direct(c) => c.get_db(),
            Link::Cluster(c, _) => c.get_db(),
            Link::Followed(f) => f.current().conn.get_db(),
        }
    }
}

/// The three connections of a store: commands, renewal, pub/sub (RESP3,
/// sending pushes to `push`).
pub(super) struct Links {
    pub(super) conn: Link,
    pub(super) renew_conn: Link,
    pub(super) push_conn: Link,
}

/// Opens the three connections `config` asks for; the pub/sub one
/// delivers its pushes to `push`.
///
/// # Cancel safety
///
/// Cancel-safe: connections opened before the drop are closed with it.
pub(super) async fn open(config: &RedisConfig, push: impl redis::aio::AsyncPushSender) -> Result<Links> {
    let base = ConnectionManagerConfig::new()
        .set_response_timeout(Some(config.timeout))
        .set_connection_timeout(Some(config.connect_timeout));
    // A call waits for the manager's reconnect attempts. To a fixed server,
    // several over a second ride out a restart; when the master may have
    // moved, one quick attempt returns the error sooner, and the sentinels
    // are asked (measured: the first grant after a failover came 1.1 s
    // after the promotion with 3 attempts up to 500 ms apart).
    let base = match config.sentinel {
        None => base.set_number_of_retries(3).set_max_delay(Duration::from_millis(500)),
        Some(_) => base.set_number_of_retries(1).set_max_delay(Duration::from_millis(100)),
    };
    let limit = config.connect_timeout + config.timeout;
    let connect = |client: redis::Client, config: ConnectionManagerConfig, what: &'static str| async move {
        tokio::time::timeout(limit, ConnectionManager::new_with_config(client, config))
            .await
            .map_err(|_| timed_out(what, limit))?
            .map_err(map_err)
    };
    if let Some(settings) = &config.cluster {
        let connect = |client: redis::cluster::ClusterClient, what: &'static str, direct: bool| async move {
            let routes = direct.then(|| Arc::new(Routes::new(settings, config.connect_timeout, config.timeout)));
            tokio::time::timeout(limit, client.get_async_connection())
                .await
                .map_err(|_| timed_out(what, limit))?
                .map(|c| Link::Cluster(c, routes))
                .map_err(map_err)
        };
        let none = None::<fn(redis::PushInfo) -> Result<(), redis::aio::SendError>>;
        let commands =
            super::cluster::client(settings, (config.connect_timeout, config.timeout), ProtocolVersion::RESP2, none)?;
        return Ok(Links {
            conn: connect(commands.clone(), "connecting to the cluster", true).await?,
            renew_conn: connect(commands, "connecting the renewal connection to the cluster", true).await?,
            push_conn: connect(
                super::cluster::client(
                    settings,
                    (config.connect_timeout, config.timeout),
                    ProtocolVersion::RESP3,
                    Some(push),
                )?,
                "connecting the pub/sub connection to the cluster",
                false,
            )
            .await?,
        });
    }
    let push_config = base.clone().set_push_sender(push).set_automatic_resubscription();
    let Some(settings) = &config.sentinel else {
        let info = config.server_url.expose().into_connection_info().map_err(|e| {
            Error::invalid(
                "url",
                format!("{}: {e}", crate::vocabulary::url_text::redact_url(config.server_url.expose())),
            )
        })?;
        let push_settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
        let push_info = info.clone().set_redis_settings(push_settings);
        return Ok(Links {
            conn: Link::Direct(connect(direct_client(config, info.clone())?, base.clone(), "connecting").await?),
            renew_conn: Link::Direct(
                connect(direct_client(config, info)?, base, "connecting the renewal connection").await?,
            ),
            push_conn: Link::Direct(
                connect(direct_client(config, push_info)?, push_config, "connecting the pub/sub connection").await?,
            ),
        });
    };
    let resolver = Arc::new(Resolver::new(settings, limit)?);
    let follow = |protocol: ProtocolVersion, config: ConnectionManagerConfig, what: &'static str| {
        let resolver = resolver.clone();
        async move {
            let client = resolver.master(protocol).await.map_err(|e| {
                Error::backend(
                    super::STORE,
                    true,
                    format!("no master {:?} from the sentinels: {e}", resolver.master_name()),
                )
            })?;
            let addr = client.get_connection_info().addr().to_string();
            let conn = connect(client, config.clone(), what).await?;
            Ok::<_, Error>(Link::Followed(Arc::new(Followed {
                resolver,
                protocol,
                config,
                connect_limit: limit,
                current: RwLock::new(Arc::new(Current { generation: 0, addr, conn })),
                lookup: tokio::sync::Mutex::new(None),
            })))
        }
    };
    Ok(Links {
        conn: follow(ProtocolVersion::RESP2, base.clone(), "connecting").await?,
        renew_conn: follow(ProtocolVersion::RESP2, base, "connecting the renewal connection").await?,
        push_conn: follow(ProtocolVersion::RESP3, push_config, "connecting the pub/sub connection").await?,
    })
}

/// A client of a fixed server, with the CA file of `config` if any.
fn direct_client(config: &RedisConfig, info: redis::ConnectionInfo) -> Result<redis::Client> {
    match &config.ca_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| Error::invalid("url", format!("cannot read ca_file {}: {e}", path.display())))?;
            redis::Client::build_with_tls(info, redis::TlsCertificates { client_tls: None, root_cert: Some(pem) })
                .map_err(map_err)
        }
        None => redis::Client::open(info).map_err(map_err),
    }
}
