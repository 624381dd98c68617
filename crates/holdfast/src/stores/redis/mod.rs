//! The Redis store: one Lua script per operation, pub/sub wake-ups, a fair
//! queue with direct hand-off. See `docs.md`.
#![doc = include_str!("docs.md")]

mod admin;
mod cluster;
mod config;
mod error;
mod fair;
mod handover;
mod keys;
#[cfg(test)]
mod keys_props;
mod link;
mod lua;
mod pubsub;
mod replicas;
mod routes;
mod sentinel;
mod shrink;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rand::Rng;
use redis::FromRedisValue;

#[cfg(test)]
pub(crate) use config::OPTIONS;
pub use config::RedisConfig;

use crate::backend::wait::{self, Attempt};
use crate::backend::{
    AcquireRequest, Backend, ForceReleased, Grant, HolderInfo, LeaseMode, LockStatus, RenewRequest, UNLIMITED,
    admission,
};
use crate::vocabulary::capability::{Capabilities, FenceDurability};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};
use error::{map_err, timed_out};
use keys::{E, H, Q, S, hot_path_keys, key_parts, lock_keys, waiter_horizon};
use link::Link;
use lua::{ScriptCall, Scripts};
use pubsub::Notifier;

const STORE: &str = "redis";

/// The Redis store (`redis://`, `rediss://`, `redis+sentinel://`, `redis+cluster://`).
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedisConfig,
    conn: Link,
    /// Renewal's own connection: a renewal never queues behind the
    /// acquires and releases pipelined on `conn`, so load on the client
    /// cannot delay it into a lost lease.
    renew_conn: Link,
    scripts: Scripts,
    notifier: Arc<Notifier>,
    client_id: String,
    durability: FenceDurability,
    /// Offers of this client's waiting tasks to take a key handed over
    /// (handover.rs).
    offers: Arc<crate::lease::handover::Offers>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("config", &self.inner.config)
            .field("client_id", &self.inner.client_id)
            .field("calls", &if self.inner.scripts.uses_functions() { "FCALL" } else { "EVALSHA" })
            .field("direct_masters", &self.inner.conn.direct_masters())
            .finish_non_exhaustive()
    }
}

/// The highest fence floor [`Backend::raise_fence`] takes: 2^52. The
/// scripts count fences in Lua numbers (doubles, exact to 2^53), so a floor
/// up to here leaves 2^52 exact fences above it; the server clock in
/// microseconds, which fences otherwise follow, reaches it in the year 2112.
const MAX_FENCE_FLOOR: u64 = 1 << 52;

fn ms(d: Duration) -> u64 {
    d.as_millis().clamp(1, u64::MAX as u128) as u64
}

impl RedisBackend {
    /// Connects to the server a `redis://` or `rediss://` URL names, to
    /// the master the sentinels of a `redis+sentinel://` URL name, or to the
    /// cluster whose seed nodes a `redis+cluster://` URL names.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: connecting takes no lock. A dropped call leaves nothing
    /// the store keeps beyond an idle connection, closed when dropped.
    pub async fn open_url(url: &str) -> Result<Self> {
        Self::open(RedisConfig::from_url(url)?).await
    }

    /// Connects: one multiplexed connection for commands, one for pub/sub,
    /// both reconnecting on their own.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: connecting takes no lock. A dropped call leaves nothing
    /// the store keeps beyond an idle connection, closed when dropped.
    pub async fn open(config: RedisConfig) -> Result<Self> {
        let endpoint = config.endpoint();
        Self::open_inner(config).await.map_err(|e| e.at(&endpoint))
    }

    async fn open_inner(config: RedisConfig) -> Result<Self> {
        // ".f": this client takes a fair hand-off's grant from the message
        // (fair.rs); the release script tells such clients the fence.
        let client_id = format!("{:016x}.f", rand::rng().random::<u64>());
        let naming = pubsub::Naming::new(&config.prefix, &client_id, config.cluster.is_some());
        let (notifier, handler, pending) = Notifier::new(naming);
        // Connection setup (and following a Sentinel master) lives in link.rs.
        let link::Links { conn, renew_conn, push_conn } = link::open(&config, handler).await?;
        pending.spawn(push_conn, config.timeout);

        let durability = detect_durability(&mut conn.clone(), config.timeout).await;
        let scripts = Scripts::detect(&mut conn.clone(), config.timeout).await;
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                config,
                conn,
                renew_conn,
                scripts,
                notifier,
                client_id,
                durability,
                offers: Arc::default(),
            }),
        })
    }

    /// The settings this store was opened with.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// Runs a script within the operation timeout. Every holdfast script is
    /// idempotent for its token (a repeated acquire returns the same grant, a
    /// repeated renew extends the same lease, a repeated release answers
    /// "released" again and changes nothing more), so a call that failed
    /// on a dead connection (a server restart, a failover) is sent once more
    /// on the connection the manager re-establishes.
    async fn invoke<T: FromRedisValue>(&self, inv: &ScriptCall<'_>) -> Result<T> {
        self.invoke_on(&self.inner.conn, inv).await
    }

    /// [`invoke`](Self::invoke) on a given connection.
    async fn invoke_on<T: FromRedisValue>(&self, conn: &Link, inv: &ScriptCall<'_>) -> Result<T> {
        let mut conn = conn.clone();
        let limit = self.inner.config.timeout;
        let deadline = tokio::time::Instant::now() + limit;
        let call = async {
            let r = match inv.invoke(&mut conn).await {
                Err(e) if e.is_io_error() || e.is_connection_dropped() => {
                    tracing::debug!(error = %e, "redis connection lost; sending again on a new connection");
                    inv.mark_resent();
                    inv.invoke(&mut conn).await
                }
                other => other,
            };
            match r {
                // A master just promoted in a cluster may lack the scripts
                // even after the crate loaded them (on the nodes it knew).
                Err(e) if matches!(conn, Link::Cluster(..)) && inv.is_missing(&e) => {
                    tracing::debug!("a cluster master lacks the scripts; loading them on every master");
                    self.inner.scripts.load_on_every_master(&mut conn).await?;
                    inv.invoke(&mut conn).await
                }
                other => other,
            }
        };
        match tokio::time::timeout_at(deadline, call).await {
            Ok(r) => r.map_err(map_err),
            Err(_) => Err(timed_out("redis script", limit)),
        }
    }

    /// One acquire script call: `Granted` or `Busy` with the holder's time
    /// left. A `waiting` caller is subscribed to the lock's channel: a
    /// refusal marks the lock so that its release publishes there. (The
    /// fair queue's call is in fair.rs.)
    async fn attempt(&self, req: &AcquireRequest, waiting: bool) -> Result<Attempt> {
        let config = &self.inner.config;
        let floor = req.fence_floor_within(MAX_FENCE_FLOOR, STORE)?;
        let which = hot_path_keys(config, &[H, Q, E]);
        let mut inv = self.inner.scripts.acquire.call(which.len());
        for &which in which {
            inv.key_parts(&key_parts(&config.prefix, &req.key, which));
        }
        inv.arg(&req.token.hex_digits()[..]).arg(ms(req.ttl)).arg(&req.label);
        inv.arg(ms(config.fence_keep)).arg(if waiting { waiter_horizon(config) } else { 0 }).arg(floor);
        let started = Instant::now();
        let generation = self.track(&self.inner.conn, &mut inv);
        let (granted, value): (i64, i64) = self.invoke(&inv).await?;
        if granted == 1 {
            self.confirm_grant(&req.key, req.token, generation, inv.client_id()).await?; // replicas=N (replicas.rs)
            return Ok(Attempt::Granted(Grant::new(value.max(0) as u64, started, req.ttl)));
        }
        Ok(Attempt::Busy { expires_in: busy_for(value) })
    }

    /// One attempt of a writer or a share (the lease model's other modes);
    /// a waiting attempt (`reserve`) leaves a reservation when refused.
    async fn attempt_shared(&self, req: &AcquireRequest, reserve: bool) -> Result<Attempt> {
        let [h, _, _, s] = lock_keys(&self.inner.config.prefix, &req.key);
        let (mode, weight, limit) = admission::encode(req.mode);
        let mut inv = self.inner.scripts.shared_acquire.call(2);
        inv.key(h)
            .key(s)
            .arg(req.token.to_hex())
            .arg(ms(req.ttl))
            .arg(&req.label)
            .arg(ms(self.inner.config.fence_keep));
        inv.arg(mode).arg(weight).arg(limit).arg(u8::from(reserve));
        inv.arg(if reserve { waiter_horizon(&self.inner.config) } else { 0 });
        let started = Instant::now();
        let generation = self.track(&self.inner.conn, &mut inv);
        let (outcome, value): (i64, i64) = self.invoke(&inv).await?;
        if outcome == 1 {
            self.confirm_grant(&req.key, req.token, generation, inv.client_id()).await?; // replicas=N (replicas.rs)
        }
        match outcome {
            1 => Ok(Attempt::Granted(Grant::new(value.max(0) as u64, started, req.ttl))),
            2 => Err(Error::Conflict {
                key: req.key.to_string(),
                reason: admission::conflict_reason(req.mode.limit().unwrap_or(UNLIMITED), value.max(0) as u32),
            }),
            _ => Ok(Attempt::Busy { expires_in: busy_for(value) }),
        }
    }

    /// The release script: by token, waking one waiter (the fair queue's
    /// head, or the lock's channel).
    async fn release_plain(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        let config = &self.inner.config;
        let naming = self.inner.notifier.naming();
        let which = hot_path_keys(config, &[H, Q, E, S]);
        let mut inv = self.inner.scripts.release.call(which.len());
        for &which in which {
            inv.key_parts(&key_parts(&config.prefix, key, which));
        }
        inv.arg(&token.hex_digits()[..])
            .arg(ms(config.fence_keep))
            .arg_parts(&naming.lock_channel_parts(key.as_str()))
            .arg_parts(&naming.client_prefix_parts(key.as_str()));
        // 2: the token released the lock before. Per the contract that is
        // "owned none", unless this call re-sent its request after a lost
        // connection: then the release was most likely its own first copy.
        let held: i64 = self.invoke(&inv).await?;
        Ok(held == 1 || (held == 2 && inv.was_resent()))
    }

    async fn acquire_waiting(&self, req: &AcquireRequest) -> Result<Grant> {
        // Fast path: one script call when the key is free.
        let notifier = &self.inner.notifier;
        // Fast path when no waiter of this client waits on the key: one script
        // call when the key is free. When others wait, the channel is
        // subscribed already and the first attempt comes after joining them.
        if !notifier.has_waiters(req.key.as_str()) && req.mode == LeaseMode::Exclusive {
            if let Attempt::Granted(grant) = self.attempt(req, false).await? {
                return Ok(grant);
            }
        }
        // Subscribe (confirmed by the server) before the next attempt, so a
        // release between a busy attempt and here is seen by that attempt.
        let _watch = notifier.watch_key(req.key.as_str(), self.inner.config.timeout).await;
        let wakeup = self.inner.notifier.key_wakeup(req.key.as_str());
        if req.mode == LeaseMode::Writer {
            wait::until_granted(&wakeup, req, self.inner.config.poll, || self.attempt_shared(req, true)).await
        } else {
            // A releasing task of this client may hand the key (or a share
            // of it) over.
            crate::lease::handover::wait_or_take(self, req, &wakeup).await
        }
    }
}

/// The holder's time left from a refusal's reply (negative: unknown).
fn busy_for(ms_left: i64) -> Option<Duration> {
    (ms_left >= 0).then(|| Duration::from_millis(ms_left as u64))
}

/// Fences survive a crash of the server only with `appendonly yes` and
/// `appendfsync always`; anything else (or a server that hides CONFIG) is volatile.
async fn detect_durability(conn: &mut Link, limit: Duration) -> FenceDurability {
    let query = async {
        let aof: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("appendonly").query_async(conn).await?;
        let fsync: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("appendfsync").query_async(conn).await?;
        Ok::<_, redis::RedisError>((aof.get(1).cloned(), fsync.get(1).cloned()))
    };
    match tokio::time::timeout(limit, query).await {
        Ok(Ok((Some(aof), Some(fsync)))) if aof == "yes" && fsync == "always" => FenceDurability::Durable,
        _ => FenceDurability::Volatile,
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: true,
            always_fair: self.inner.config.fair_default,
            store_notification: true,
            counts_waiters: true,
            session_bound: false,
            fence_durability: self.inner.durability,
            // One script call per slice: Redis runs one script at a time, so
            // a slice is as long as any other call may wait for renewal
            // (32 leases, about 0.2 ms of the server; with 64, a probe call
            // of the same client beside 100,000 held leases waited 2.9-3.5x
            // its idle p99, with 32 1.9-2.3x, for 10% more time in calls).
            // The pre-connection capabilities (`stores/deferred.rs`) say the same.
            renew_slice: Some(32),
            shared_leases: true,
            fence_floor: true,
            records: true,
            admin: true,
            shrink: true,
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        // One attempt. A fair attempt would queue the token, so a try uses
        // the non-fair script, which still defers to queued waiters.
        let attempt = if req.mode == LeaseMode::Exclusive {
            self.attempt(req, false).await?
        } else {
            self.attempt_shared(req, false).await?
        };
        Ok(match attempt {
            Attempt::Granted(g) => Some(g),
            Attempt::Busy { .. } => None,
        })
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        // Writers and shares wait in the order of their reservations, not
        // on the fair queue.
        if req.mode == LeaseMode::Exclusive && (req.fair || self.inner.config.fair_default) {
            self.acquire_fair(req).await
        } else {
            self.acquire_waiting(req).await
        }
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        // A task of this client waiting for the key takes it over in the
        // same call (handover.rs); else the plain release.
        crate::lease::handover::release_or_hand_over(self, key, token).await
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        let prefix = &self.inner.config.prefix;
        let keys: Vec<[String; 4]> = leases.iter().map(|lease| lock_keys(prefix, &lease.key)).collect();
        // One script touches one Cluster slot: in a cluster the leases are
        // grouped by the slot of their lock; elsewhere they stay one group.
        let groups = match self.inner.config.cluster {
            Some(_) => cluster::group_by_slot(keys.iter().map(|[h, ..]| h.as_str())),
            None => vec![(0..leases.len()).collect()],
        };
        let keys = &keys;
        let calls =
            groups.iter().flat_map(|group| group.chunks(self.inner.config.renew_batch)).map(|chunk| async move {
                let mut inv = self.inner.scripts.renew.call(2 * chunk.len());
                for &i in chunk {
                    let [h, _, _, s] = &keys[i];
                    inv.key(h).key(s);
                }
                inv.arg(ms(self.inner.config.fence_keep));
                for &i in chunk {
                    inv.arg(&leases[i].token.hex_digits()[..]).arg(ms(leases[i].ttl));
                }
                let generation = self.track(&self.inner.renew_conn, &mut inv);
                let held: Vec<i64> = self.invoke_on(&self.inner.renew_conn, &inv).await?;
                self.confirm_writes(&self.inner.renew_conn, generation, inv.client_id()).await?; // replicas=N (replicas.rs)
                if held.len() != chunk.len() {
                    return Err(Error::backend(STORE, false, "renew script returned the wrong number of results"));
                }
                Ok(chunk.iter().copied().zip(held).collect::<Vec<(usize, i64)>>())
            });
        // The calls go out together on the multiplexed connection (in a
        // cluster: on the connection to each slot's master).
        let results = futures::future::try_join_all(calls).await?;
        let mut held = vec![false; leases.len()];
        for (i, v) in results.into_iter().flatten() {
            held[i] = v == 1;
        }
        Ok(held)
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        let [h, q, e, s] = lock_keys(&self.inner.config.prefix, key);
        let mut inv = self.inner.scripts.status.call(4);
        inv.key(h).key(q).key(e).key(s);
        type Share = (String, i64, i64, i64, i64);
        let (label, fence, ms_left, waiters, shares): (Option<String>, i64, i64, i64, Vec<Share>) =
            self.invoke(&inv).await?;
        let left = |ms: i64| (ms >= 0).then(|| Duration::from_millis(ms as u64));
        let mut status = LockStatus {
            holder: label.map(|label| HolderInfo {
                label,
                fence: fence.max(0) as u64,
                ttl_left: left(ms_left),
                weight: 1,
            }),
            waiters: Some(waiters.max(0) as u64),
            ..LockStatus::free(key)
        };
        for (label, fence, ms_left, weight, limit) in shares {
            status.limit = Some(limit.clamp(0, i64::from(u32::MAX)) as u32);
            status.shared.push(HolderInfo {
                label,
                fence: fence.max(0) as u64,
                ttl_left: left(ms_left),
                weight: weight.clamp(0, i64::from(u32::MAX)) as u32,
            });
        }
        Ok(status)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        self.list_held(prefix).await // admin.rs
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForceReleased> {
        self.force(key).await // admin.rs
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        let [h, _, _, s] = lock_keys(&self.inner.config.prefix, key);
        let mut inv = self.inner.scripts.shared_admin.call(2);
        inv.key(h).key(s).arg("limit").arg(limit);
        let held: i64 = self.invoke(&inv).await?;
        Ok(held.max(0) as u64)
    }

    async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        self.shrink_lease(key, token, to).await // shrink.rs
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        let [h, _, _, s] = lock_keys(&self.inner.config.prefix, key);
        let mut inv = self.inner.scripts.shared_admin.call(2);
        inv.key(h).key(s).arg("label").arg(token.to_hex()).arg(label);
        let held: i64 = self.invoke(&inv).await?;
        Ok(held == 1)
    }

    async fn raise_fence(&self, key: &LockKey, token: OwnerToken, floor: u64) -> Result<bool> {
        if floor > MAX_FENCE_FLOOR {
            return Err(Error::invalid(
                "fence floor",
                format!("{floor} is above 2^52, the highest floor the Redis store takes (fences are Lua numbers)"),
            ));
        }
        // The lock hash and its shares: one hash tag, one Cluster slot.
        let [h, _, _, s] = lock_keys(&self.inner.config.prefix, key);
        let mut inv = self.inner.scripts.raise_fence.call(2);
        inv.key(h).key(s).arg(token.to_hex()).arg(floor).arg(ms(self.inner.config.fence_keep));
        let held: i64 = self.invoke(&inv).await?;
        Ok(held == 1)
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<u64>> {
        let mut inv = self.inner.scripts.read_record.call(1);
        inv.key(keys::record_key(&self.inner.config.prefix, key));
        let value: Option<String> = self.invoke(&inv).await?;
        value
            .map(|v| {
                v.parse().map_err(|_| Error::backend(STORE, false, format!("record of {key} is not a number: {v:?}")))
            })
            .transpose()
    }

    async fn write_record(&self, key: &LockKey, token: OwnerToken, value: u64) -> Result<bool> {
        let [h, _, _, s] = lock_keys(&self.inner.config.prefix, key);
        let mut inv = self.inner.scripts.write_record.call(3);
        inv.key(h).key(s).key(keys::record_key(&self.inner.config.prefix, key)).arg(token.to_hex()).arg(value);
        let held: i64 = self.invoke(&inv).await?;
        Ok(held == 1)
    }
}
