//! The ZooKeeper store: ephemeral sequential nodes, one session per client. See `docs.md`.
#![doc = include_str!("docs.md")]

mod admin;
mod config;
mod error;
mod holders;
mod lanes;
mod nodes;
#[cfg(test)]
mod nodes_props;
mod ops;
mod session;
mod shares;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use zookeeper_client as zk;

#[cfg(test)]
pub(crate) use config::OPTIONS;
pub use config::{ZkAuth, ZkConfig, ZkTls};

use crate::backend::wait::{self, LocalWakeups};
use crate::backend::{AcquireRequest, Backend, ForceReleased, Grant, HolderWatch, LeaseMode, LockStatus, RenewRequest};
use crate::vocabulary::capability::{Capabilities, FenceDurability};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};
use error::map_err;
use ops::Attempt;
use session::{Session, Sessions};

const STORE: &str = "zookeeper";

/// Runs one request with a time limit; a request that outlasts it is a
/// retryable error.
async fn timed<T>(
    limit: Duration,
    what: &str,
    f: impl Future<Output = std::result::Result<T, zk::Error>>,
) -> Result<std::result::Result<T, zk::Error>> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| Error::backend(STORE, true, format!("ZooKeeper {what} timed out after {limit:?}")))
}

#[derive(Debug)]
struct Inner {
    config: ZkConfig,
    sessions: Arc<Sessions>,
    /// Every token this client has asked for a queue node, until the store
    /// confirmed the node gone or its session ended: token -> attempt.
    attempts: Mutex<HashMap<u128, Attempt>>,
    /// Picks which held node a renewal asks about, in turn.
    renewals: AtomicUsize,
    /// Turns of this client's waiters per key: one queue node per key in
    /// the store, however many tasks wait, unless the key's queue holds
    /// this client's nodes alone (see `lanes.rs`, [`wait::take_lane`]).
    waiters: LocalWakeups,
    /// The tokens this client forgot last (`lanes.rs`).
    forgotten: Mutex<VecDeque<u128>>,
}

/// The ZooKeeper store.
#[derive(Debug, Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

impl ZkBackend {
    /// Opens the ensemble a `zk://` URL names.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: connecting takes no lock. A dropped call leaves nothing
    /// the store keeps beyond an idle connection, closed when dropped.
    pub async fn open_url(url: &str) -> Result<Self> {
        Self::open(ZkConfig::from_url(url)?).await
    }

    /// Opens one session and creates the root path if missing.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: connecting takes no lock. A dropped call leaves nothing
    /// the store keeps beyond an idle connection, closed when dropped.
    pub async fn open(config: ZkConfig) -> Result<Self> {
        let endpoint = config.endpoint();
        Self::connect_inner(config).await.map_err(|e| e.at(&endpoint))
    }

    async fn connect_inner(config: ZkConfig) -> Result<Self> {
        let backend = ZkBackend {
            inner: Arc::new(Inner {
                config,
                sessions: Arc::default(),
                attempts: Mutex::default(),
                renewals: AtomicUsize::new(0),
                waiters: LocalWakeups::default(),
                forgotten: Mutex::default(),
            }),
        };
        backend.session().await?;
        Ok(backend)
    }

    /// The negotiated session timeout of the current session: how long after
    /// a crash a holder's nodes stay (see `docs.md`).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it may open the client's session, which is kept for later calls.
    pub async fn session_timeout(&self) -> Result<Duration> {
        Ok(self.session().await?.client.session_timeout())
    }

    /// The id of the current ZooKeeper session (for tests and diagnostics).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it may open the client's session, which is kept for later calls.
    pub async fn session_id(&self) -> Result<i64> {
        Ok(self.session().await?.id)
    }

    fn cfg(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The current session, or a new one if there is none or it was lost.
    async fn session(&self) -> Result<Arc<Session>> {
        self.inner.sessions.get(&self.inner.config).await
    }
}

#[async_trait]
impl Backend for ZkBackend {
    fn name(&self) -> &'static str {
        STORE
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: true,
            always_fair: true,
            store_notification: true,
            counts_waiters: true,
            session_bound: true,
            // One node check per call: slices bound the client work of a
            // call (a lookup per lease) and add a cheap round trip each.
            renew_slice: Some(4096),
            shared_leases: true,
            fence_durability: FenceDurability::Durable,
            // Fences are log positions (revisions, zxids): no floor can move them.
            fence_floor: false,
            // Grants live on sessions: not an arbiter, so no records.
            records: false,
            admin: true,
            shrink: true,
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        self.attempt(req, false).await
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        let waiters = self.inner.waiters.subscribe(req.key.as_str());
        let _turn = wait::take_lane(&waiters, req).await;
        self.attempt(req, true)
            .await?
            .ok_or_else(|| Error::backend(STORE, false, "a waiting acquire ended without a grant"))
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        self.release_token(key, token).await
    }

    async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        self.shrink_node(key, token, to).await // ops/shrink.rs
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        self.renew_leases(leases).await
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        self.status_of(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        self.list_held(prefix).await // admin.rs
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForceReleased> {
        self.force(key).await // admin.rs
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        self.resize_shares(key, limit).await
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        self.relabel_node(key, token, label).await
    }

    async fn watch_holders(&self, key: &LockKey) -> Result<Option<HolderWatch>> {
        Ok(Some(holders::watch(self.clone(), key))) // holders.rs
    }
}
