//! The etcd store: session leases, a queue of keys per lock, revision fences. See `docs.md`.
#![doc = include_str!("docs.md")]

mod acquire;
mod admin;
mod config;
mod error;
mod grants;
mod holders;
mod ops;
#[cfg(test)]
mod ops_props;
mod session;
mod shares;
mod watch;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use tokio_util::sync::{CancellationToken, DropGuard};

pub use config::EtcdConfig;
#[cfg(test)]
pub(crate) use config::OPTIONS;
use error::map_err;
use grants::Grants;
use ops::Conn;
use session::Sessions;
use watch::KeyWatch;

use crate::backend::wait::{self, LocalWakeups};
use crate::backend::{AcquireRequest, Backend, ForceReleased, Grant, HolderWatch, LeaseMode, LockStatus, RenewRequest};
use crate::vocabulary::capability::{Capabilities, FenceDurability};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

const STORE: &str = "etcd";

/// HTTP/2 pings on the connection while a stream (keep-alive, watch) is
/// open, to find a dead member. etcd answers pings closer than 5 s apart
/// (`--grpc-keepalive-min-time`) with GOAWAY "too_many_pings" and closes the
/// connection, every stream on it included: a keep-alive stream broken that
/// way between two keep-alives once left a revoked session unnoticed for a
/// whole lease TTL.
const PING_INTERVAL: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(5);

struct Shared {
    conn: Conn,
    config: EtcdConfig,
    /// Ends the keep-alive and watch tasks (revoking the session leases)
    /// when the backend is dropped.
    shutdown: CancellationToken,
    sessions: Sessions,
    grants: Arc<Grants>,
    watch: KeyWatch,
    /// Turns of this client's waiters per key: one queued key per key in
    /// etcd, however many tasks wait, unless every key ahead of a share is
    /// this client's (see [`wait::take_lane`], `shares.rs`).
    waiters: LocalWakeups,
}

impl Shared {
    fn prefix(&self, key: &LockKey) -> Vec<u8> {
        ops::lock_prefix(&self.config.prefix, key)
    }
}

/// The etcd store.
pub struct EtcdBackend {
    shared: Arc<Shared>,
    _shutdown: DropGuard,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend").field("config", &self.shared.config).finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connects to the cluster an `etcd://` or `etcds://` URL names.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: connecting takes no lock. A dropped call leaves nothing
    /// the store keeps beyond an idle connection, closed when dropped.
    pub async fn open_url(url: &str) -> Result<Self> {
        Self::open(EtcdConfig::from_url(url)?).await
    }

    /// Connects (lazily: the first request dials) to the cluster.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: connecting takes no lock. A dropped call leaves nothing
    /// the store keeps beyond an idle connection, closed when dropped.
    pub async fn open(config: EtcdConfig) -> Result<Self> {
        let endpoint = config.endpoint();
        Self::open_inner(config).await.map_err(|e| e.at(&endpoint))
    }

    async fn open_inner(config: EtcdConfig) -> Result<Self> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(PING_INTERVAL, PING_TIMEOUT)
            .with_keep_alive_while_idle(false)
            .with_require_leader(true);
        if let Some(user) = &config.user {
            // Tokens expire (5 min idle by default): fetch a new one when told so.
            opts = opts
                .with_user(user.clone(), config.password().unwrap_or_default().to_owned())
                .with_auto_token_refresh(true);
        }
        if config.tls {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &config.ca_file {
                let pem = tokio::fs::read(ca)
                    .await
                    .map_err(|e| Error::invalid("url", format!("cannot read ca_file {}: {e}", ca.display())))?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            if let Some((cert, key)) = &config.client_cert {
                let read = |p: &std::path::PathBuf| {
                    let p = p.clone();
                    async move {
                        tokio::fs::read(&p)
                            .await
                            .map_err(|e| Error::invalid("url", format!("cannot read {}: {e}", p.display())))
                    }
                };
                tls = tls.identity(Identity::from_pem(read(cert).await?, read(key).await?));
            }
            opts = opts.with_tls(tls);
        }
        let client = tokio::time::timeout(config.timeout, etcd_client::Client::connect(&config.endpoints, Some(opts)))
            .await
            .map_err(|_| Error::backend(STORE, true, format!("etcd connect timed out after {:?}", config.timeout)))?
            .map_err(map_err)?;
        let shutdown = CancellationToken::new();
        let conn = Conn { client, timeout: config.timeout };
        let shared = Arc::new(Shared {
            watch: KeyWatch::start(conn.clone(), shutdown.clone()),
            sessions: Sessions::new(config.session_ttl_secs, &config.prefix),
            conn,
            config,
            shutdown: shutdown.clone(),
            grants: Arc::default(),
            waiters: LocalWakeups::default(),
        });
        Ok(EtcdBackend { shared, _shutdown: shutdown.drop_guard() })
    }
}

#[async_trait]
impl Backend for EtcdBackend {
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
            // One keep-alive per session per call, whatever the slice: slices
            // only bound the client work of a call (a lookup per lease).
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
        self.shared.try_acquire(req).await
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        let waiters = self.shared.waiters.subscribe(req.key.as_str());
        // Not a wrapper future around the acquire: the acquire's future
        // starts after the turn's, so the two share their space.
        let _turn = wait::take_lane(&waiters, req).await;
        self.shared.acquire(req).await
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        let s = &self.shared;
        s.grants.release(&s.conn, &s.watch, key, token).await
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        self.shared.grants.renew(leases).await
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        ops::status(&self.shared.conn, key, &self.shared.prefix(key)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        self.shared.list_held(prefix).await // admin.rs
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForceReleased> {
        self.shared.force(key).await // admin.rs
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        self.shared.resize(key, limit).await
    }

    async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        self.shared.shrink(key, token, to).await // shares.rs
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        self.shared.relabel(key, token, label).await
    }

    async fn watch_holders(&self, key: &LockKey) -> Result<Option<HolderWatch>> {
        Ok(Some(holders::watch(self.shared.conn.clone(), self.shared.prefix(key)))) // holders.rs
    }
}
