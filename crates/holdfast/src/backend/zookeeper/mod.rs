//! The ZooKeeper store: ephemeral sequential nodes, one session per client. See `docs.md`.
#![doc = include_str!("docs.md")]

mod config;
mod nodes;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

pub use config::ZkConfig;

use crate::backend::{AcquireRequest, Backend, Grant, HolderInfo, LockStatus, RenewRequest};
use crate::capability::{Capabilities, FenceDurability};
use crate::error::{Error, Result};
use crate::key::{LockKey, OwnerToken};

const STORE: &str = "zookeeper";

fn map_err(e: zk::Error) -> Error {
    use zk::Error as E;
    let retryable = matches!(
        e,
        E::ConnectionLoss
            | E::Timeout
            | E::SessionExpired
            | E::SessionMoved
            | E::Throttled
            | E::NoHosts
            | E::ClientClosed
            | E::NotReadOnly
    );
    Error::backend(STORE, retryable, e)
}

/// One ZooKeeper session: the lease behind every grant this client holds.
#[derive(Debug)]
struct Session {
    client: zk::Client,
    /// Cancelled once this session can no longer vouch for its grants:
    /// expired, closed, auth failed, or disconnected for longer than
    /// `session timeout / 4` (see `docs.md` for why that is before the
    /// ensemble can expire it).
    lost: CancellationToken,
}

impl Session {
    /// True if a grant observed now can be believed: connected, not lost.
    fn vouches(&self) -> bool {
        !self.lost.is_cancelled() && self.client.state() == zk::SessionState::SyncConnected
    }
}

/// A grant this client holds, with its local lease deadline.
#[derive(Debug)]
struct LocalGrant {
    key: String,
    /// The node's full path.
    path: String,
    deadline: Instant,
    /// Cancelled on release, so the expiry task stops.
    done: CancellationToken,
}

#[derive(Debug)]
struct Inner {
    config: ZkConfig,
    /// The current session; a std mutex held only to clone or swap the Arc.
    session: Mutex<Option<Arc<Session>>>,
    /// Held while a new session is opened, so only one is.
    connecting: tokio::sync::Mutex<()>,
    grants: Mutex<HashMap<u128, LocalGrant>>,
    shutdown: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(s) = self.session.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            s.lost.cancel();
        }
    }
}

/// The ZooKeeper store.
#[derive(Debug, Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

/// A queue node just created (or found again after a lost reply).
struct Created {
    name: String,
    czxid: i64,
    /// The queue listed right behind the create, if that succeeded.
    queue: Option<Vec<String>>,
    /// Taken before the create was sent.
    sent: Instant,
}

/// Why a waiting acquire starts over.
enum Step {
    Done(Option<Grant>),
    /// The session was lost while waiting: start again on a new one.
    Restart,
}

impl ZkBackend {
    /// Connects to the ensemble a `zk://` URL names.
    pub async fn connect_url(url: &str) -> Result<Self> {
        Self::connect(ZkConfig::from_url(url)?).await
    }

    /// Connects (one session) and creates the root path if missing.
    pub async fn connect(config: ZkConfig) -> Result<Self> {
        let backend = ZkBackend {
            inner: Arc::new(Inner {
                config,
                session: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                grants: Mutex::default(),
                shutdown: CancellationToken::new(),
            }),
        };
        backend.session().await?;
        Ok(backend)
    }

    /// The negotiated session timeout of the current session: how long after
    /// a crash a holder's nodes stay (see `docs.md`).
    pub async fn session_timeout(&self) -> Result<Duration> {
        Ok(self.session().await?.client.session_timeout())
    }

    /// The id of the current ZooKeeper session (for tests and diagnostics).
    pub async fn session_id(&self) -> Result<i64> {
        Ok(self.session().await?.client.session_id().0)
    }

    fn cfg(&self) -> &ZkConfig {
        &self.inner.config
    }

    fn authenticated(&self) -> bool {
        self.cfg().credentials.is_some()
    }

    /// Runs one request with the configured time limit.
    async fn op<T>(
        &self,
        what: &str,
        f: impl Future<Output = std::result::Result<T, zk::Error>>,
    ) -> Result<std::result::Result<T, zk::Error>> {
        let limit = self.cfg().timeout;
        tokio::time::timeout(limit, f)
            .await
            .map_err(|_| Error::backend(STORE, true, format!("ZooKeeper {what} timed out after {limit:?}")))
    }

    /// The current session, or a new one if there is none or it was lost
    /// (the lost one is closed once nothing uses it, which deletes its nodes).
    async fn session(&self) -> Result<Arc<Session>> {
        if let Some(s) = self.live_session() {
            return Ok(s);
        }
        let _one = self.inner.connecting.lock().await;
        if let Some(s) = self.live_session() {
            return Ok(s);
        }
        // Drop the lost session first, so it closes (deleting its nodes) as
        // soon as nothing else uses it.
        self.drop_lost_session();
        let s = Arc::new(self.open_session().await?);
        *self.inner.session.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.clone());
        Ok(s)
    }

    /// The current session if it is not lost.
    fn live_session(&self) -> Option<Arc<Session>> {
        let current = self.inner.session.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().filter(|s| !s.lost.is_cancelled()).cloned()
    }

    /// Forgets the current session if it is lost.
    fn drop_lost_session(&self) {
        let mut current = self.inner.session.lock().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|s| s.lost.is_cancelled()) {
            current.take();
        }
    }

    async fn open_session(&self) -> Result<Session> {
        let cfg = self.cfg();
        let mut connector = zk::Client::connector().with_session_timeout(cfg.session_timeout).with_fail_eagerly();
        if let Some((user, pass)) = &cfg.credentials {
            connector = connector.with_auth("digest", format!("{user}:{}", pass.expose()).as_bytes());
        }
        let hosts = cfg.connect_string();
        let client = self.op("connect", connector.connect(&hosts)).await?.map_err(map_err)?;
        let lost = CancellationToken::new();
        watch_session(&client, lost.clone(), self.inner.shutdown.clone());
        let options = zk::CreateMode::Persistent.with_acls(nodes::acls(self.authenticated()));
        // Look first: an identity with read-only rights (status, monitoring)
        // must not need the right to create the root.
        if self.op("stat root", client.check_stat(&cfg.root)).await?.map_err(map_err)?.is_none() {
            match self.op("create root", client.mkdir(&cfg.root, &options)).await? {
                Ok(()) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(map_err(e)),
            }
        }
        tracing::debug!(session = ?client.session_id(), timeout = ?client.session_timeout(), "zookeeper session");
        Ok(Session { client, lost })
    }

    /// Creates `token`'s queue node under `parent` (creating the parent
    /// container if the server removed it) and, pipelined behind the create
    /// on the same session (so it sees it), lists the queue: one round trip.
    /// Returns the node name, its czxid, the queue if listed, and the instant
    /// before the requests were sent.
    async fn create_node(&self, s: &Session, parent: &str, req: &AcquireRequest) -> Result<Created> {
        let acls = nodes::acls(self.authenticated());
        let node = zk::CreateMode::EphemeralSequential.with_acls(acls);
        let container = zk::CreateMode::Container.with_acls(acls);
        let prefix = nodes::node_prefix(parent, req.token);
        let data = nodes::node_data(req.token, &req.label);
        let limit = self.cfg().timeout;
        for _ in 0..5 {
            let sent = Instant::now();
            // Both requests leave now, in this order.
            let create = s.client.create(&prefix, &data, &node);
            let list = s.client.list_children(parent);
            let (created, listed) = tokio::time::timeout(limit, async { tokio::join!(create, list) })
                .await
                .map_err(|_| Error::backend(STORE, true, format!("ZooKeeper create timed out after {limit:?}")))?;
            match created {
                Ok((stat, seq)) => {
                    let name = format!("{}{seq}", nodes::node_name_prefix(req.token));
                    let queue = listed.ok().map(nodes::queue).filter(|q| q.contains(&name));
                    return Ok(Created { name, czxid: stat.czxid, queue, sent });
                }
                Err(zk::Error::NoNode) => {
                    match self.op("create parent", s.client.create(parent, &[], &container)).await? {
                        Ok(_) | Err(zk::Error::NodeExists) => {}
                        Err(zk::Error::NoNode) => {
                            let root = zk::CreateMode::Persistent.with_acls(acls);
                            match self.op("create root", s.client.mkdir(&self.cfg().root, &root)).await? {
                                Ok(()) | Err(zk::Error::NodeExists) => {}
                                Err(e) => return Err(map_err(e)),
                            }
                        }
                        Err(e) => return Err(map_err(e)),
                    }
                }
                Err(e) => return Err(map_err(e)),
            }
        }
        Err(Error::backend(STORE, true, format!("lock node {parent:?} kept vanishing while creating a waiter")))
    }

    /// The queue of `parent`, lowest first; empty if the parent is gone.
    async fn queue(&self, s: &Session, parent: &str) -> Result<Vec<String>> {
        match self.op("list", s.client.list_children(parent)).await? {
            Ok(children) => Ok(nodes::queue(children)),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(map_err(e)),
        }
    }

    async fn delete(&self, s: &Session, path: &str) -> Result<bool> {
        match self.op("delete", s.client.delete(path, None)).await? {
            Ok(()) => Ok(true),
            Err(zk::Error::NoNode | zk::Error::NoAuth) => Ok(false),
            Err(e) => Err(map_err(e)),
        }
    }

    /// One acquisition on one session: create the node, then wait for every
    /// node before it to go, watching only the one just before.
    /// On a `retry`, first looks for the node an earlier attempt on the same
    /// session may have created (its reply lost), so a token never has two.
    async fn acquire_on(&self, s: &Arc<Session>, req: &AcquireRequest, wait: bool, retry: bool) -> Result<Step> {
        let parent = nodes::parent_path(&self.cfg().root, req.key.as_str());
        let mut existing = None;
        if !wait || retry {
            let queue = self.queue(s, &parent).await?;
            let prefix = nodes::node_name_prefix(req.token);
            existing = queue.iter().find(|n| n.starts_with(&prefix)).cloned();
            if existing.is_none() && !wait && !queue.is_empty() {
                // Busy: answered without writing anything.
                return Ok(Step::Done(None));
            }
        }
        let existing = match existing {
            Some(name) => {
                let path = format!("{parent}/{name}");
                match self.op("stat", s.client.check_stat(&path)).await?.map_err(map_err)? {
                    Some(st) if st.ephemeral_owner == s.client.session_id().0 => {
                        Some(Created { name, czxid: st.czxid, queue: None, sent: Instant::now() })
                    }
                    Some(_) => {
                        // Left by this client's previous, lost session: it goes
                        // when that session closes; never adopt it.
                        self.delete(s, &path).await?;
                        None
                    }
                    None => None,
                }
            }
            None => None,
        };
        let created = match existing {
            Some(c) => c,
            None => self.create_node(s, &parent, req).await?,
        };
        let (mine, czxid) = (created.name, created.czxid);
        let mut listed = created.queue.map(|q| (created.sent, q));
        loop {
            if s.lost.is_cancelled() {
                return Ok(Step::Restart);
            }
            let (observed, queue) = match listed.take() {
                Some(l) => l,
                None => (Instant::now(), self.queue(s, &parent).await?),
            };
            let Some(pos) = queue.iter().position(|n| *n == mine) else {
                // Our node is gone: the session ended under us.
                return if wait {
                    Ok(Step::Restart)
                } else {
                    Err(Error::backend(STORE, true, "the ZooKeeper session ended during the attempt"))
                };
            };
            if pos == 0 {
                // A waiter checks its session before it believes a grant.
                if !s.vouches() {
                    if !wait {
                        self.delete(s, &format!("{parent}/{mine}")).await?;
                        return Err(Error::backend(STORE, true, "ZooKeeper session not connected"));
                    }
                    tokio::select! {
                        _ = s.lost.cancelled() => return Ok(Step::Restart),
                        _ = tokio::time::sleep(Duration::from_millis(20)) => continue,
                    }
                }
                let fence = u64::try_from(czxid).map_err(|_| Error::backend(STORE, false, "negative czxid"))?;
                self.track(s, req, &format!("{parent}/{mine}"));
                return Ok(Step::Done(Some(Grant {
                    fence,
                    attempt_started: observed,
                    valid_for: req.ttl,
                    session_lost: Some(s.lost.clone()),
                })));
            }
            if !wait {
                self.delete(s, &format!("{parent}/{mine}")).await?;
                return Ok(Step::Done(None));
            }
            let before = format!("{parent}/{}", queue[pos - 1]);
            let (stat, watcher) = self.op("watch", s.client.check_and_watch_stat(&before)).await?.map_err(map_err)?;
            if stat.is_none() {
                continue;
            }
            tokio::select! {
                _ = watcher.changed() => {}
                _ = s.lost.cancelled() => return Ok(Step::Restart),
                _ = tokio::time::sleep(self.cfg().poll) => {}
            }
        }
    }

    /// One acquisition, waiting or not, across sessions.
    async fn acquire_with(&self, req: &AcquireRequest, wait: bool) -> Result<Option<Grant>> {
        let mut retry = false;
        let mut backoff = Duration::from_millis(50);
        loop {
            let step = match self.session().await {
                Ok(s) => self.acquire_on(&s, req, wait, retry).await,
                Err(e) => Err(e),
            };
            match step {
                Ok(Step::Done(grant)) => return Ok(grant),
                Ok(Step::Restart) if wait => {
                    tracing::warn!(key = %req.key, "zookeeper session lost while waiting; queueing again");
                }
                Ok(Step::Restart) => return Err(Error::backend(STORE, true, "ZooKeeper session lost")),
                // A waiter rides out connection loss and failover until the
                // caller's deadline drops this future.
                Err(e) if wait && e.is_retryable() => {
                    tracing::warn!(key = %req.key, error = %e, "zookeeper error while waiting; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
            retry = true;
        }
    }

    /// Starts the local lease of a new grant: unless renewed, its node is
    /// deleted when the TTL runs out (see `docs.md`).
    fn track(&self, s: &Arc<Session>, req: &AcquireRequest, path: &str) {
        let done = CancellationToken::new();
        let grant = LocalGrant {
            key: req.key.as_str().to_owned(),
            path: path.to_owned(),
            deadline: Instant::now() + req.ttl,
            done: done.clone(),
        };
        let token = req.token.as_u128();
        self.inner.grants.lock().unwrap_or_else(|p| p.into_inner()).insert(token, grant);
        let weak = Arc::downgrade(&self.inner);
        let (s, path, shutdown) = (s.clone(), path.to_owned(), self.inner.shutdown.clone());
        tokio::spawn(expire_when_due(weak, s, token, path, done, shutdown));
    }

    fn untrack(&self, token: OwnerToken) -> Option<LocalGrant> {
        let g = self.inner.grants.lock().unwrap_or_else(|p| p.into_inner()).remove(&token.as_u128());
        if let Some(g) = &g {
            g.done.cancel();
        }
        g
    }
}

/// Deletes a grant's node when its local lease runs out without renewal.
async fn expire_when_due(
    inner: Weak<Inner>,
    s: Arc<Session>,
    token: u128,
    path: String,
    done: CancellationToken,
    shutdown: CancellationToken,
) {
    loop {
        let deadline = {
            let Some(inner) = inner.upgrade() else { return };
            let grants = inner.grants.lock().unwrap_or_else(|p| p.into_inner());
            match grants.get(&token) {
                Some(g) => g.deadline,
                None => return,
            }
        };
        tokio::select! {
            _ = done.cancelled() => return,
            _ = shutdown.cancelled() => return,
            _ = s.lost.cancelled() => {
                if let Some(inner) = inner.upgrade() {
                    inner.grants.lock().unwrap_or_else(|p| p.into_inner()).remove(&token);
                }
                return;
            }
            _ = tokio::time::sleep_until(deadline.into()) => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        {
            let mut grants = inner.grants.lock().unwrap_or_else(|p| p.into_inner());
            match grants.get(&token) {
                Some(g) if g.deadline <= Instant::now() => {
                    grants.remove(&token);
                }
                Some(_) => continue,
                None => return,
            }
        }
        tracing::debug!(path = %path, "lease ran out without renewal; deleting the lock node");
        let limit = inner.config.timeout;
        drop(inner);
        if let Ok(Err(e)) = tokio::time::timeout(limit, s.client.delete(&path, None)).await {
            if !matches!(e, zk::Error::NoNode) {
                tracing::warn!(path = %path, error = %e, "could not delete an expired lock node");
            }
        }
        return;
    }
}

/// Follows the session's state: terminal states, or a disconnection longer
/// than a quarter of the negotiated session timeout, cancel `lost`.
fn watch_session(client: &zk::Client, lost: CancellationToken, shutdown: CancellationToken) {
    let mut watcher = client.state_watcher();
    let grace = client.session_timeout() / 4;
    let mut since = (client.state() != zk::SessionState::SyncConnected).then(Instant::now);
    tokio::spawn(async move {
        loop {
            let disconnected_too_long = async {
                match since {
                    Some(t) => tokio::time::sleep_until((t + grace).into()).await,
                    None => std::future::pending().await,
                }
            };
            let state = tokio::select! {
                s = watcher.changed() => s,
                _ = lost.cancelled() => return,
                _ = shutdown.cancelled() => { lost.cancel(); return }
                _ = disconnected_too_long => {
                    tracing::warn!(?grace, "zookeeper session disconnected too long; its grants are lost");
                    lost.cancel();
                    return;
                }
            };
            match state {
                zk::SessionState::SyncConnected => since = None,
                zk::SessionState::Disconnected | zk::SessionState::ConnectedReadOnly => {
                    since.get_or_insert_with(Instant::now);
                }
                other => {
                    tracing::warn!(state = ?other, "zookeeper session ended; its grants are lost");
                    lost.cancel();
                    return;
                }
            }
        }
    });
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
            fence_durability: FenceDurability::Durable,
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        self.acquire_with(req, false).await
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        self.acquire_with(req, true)
            .await?
            .ok_or_else(|| Error::backend(STORE, false, "a waiting acquire ended without a grant"))
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        let local = self.untrack(token);
        let held = local.as_ref().is_some_and(|g| g.key == key.as_str() && g.deadline > Instant::now());
        let Some(s) = self.live_session() else {
            // A lost session's nodes go when it closes: close it now (once
            // nothing else uses it) rather than at the next acquire.
            self.drop_lost_session();
            return Ok(false);
        };
        if let Some(g) = local.as_ref().filter(|g| g.key == key.as_str()) {
            // A grant of this client: its path is known, one round trip.
            let deleted = self.delete(&s, &g.path).await?;
            return Ok(deleted && held && !s.lost.is_cancelled());
        }
        let parent = nodes::parent_path(&self.cfg().root, key.as_str());
        let prefix = nodes::node_name_prefix(token);
        let queue = self.queue(&s, &parent).await?;
        let mut deleted = false;
        // Normally one node; two only if a waiter moved to a new session
        // before its old one closed.
        for name in queue.iter().filter(|n| n.starts_with(&prefix)) {
            deleted |= self.delete(&s, &format!("{parent}/{name}")).await?;
        }
        Ok(deleted && held && !s.lost.is_cancelled())
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        // The session is kept alive by the client's pings; a lease is held
        // while its session vouches for it and its local deadline has not
        // passed. No round trip.
        let live = self.live_session().is_some();
        let now = Instant::now();
        let mut grants = self.inner.grants.lock().unwrap_or_else(|p| p.into_inner());
        Ok(leases
            .iter()
            .map(|l| match grants.get_mut(&l.token.as_u128()) {
                Some(g) if live && g.key == l.key.as_str() && g.deadline > now => {
                    g.deadline = now + l.ttl;
                    true
                }
                _ => false,
            })
            .collect())
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        let s = self.session().await?;
        let parent = nodes::parent_path(&self.cfg().root, key.as_str());
        let queue = self.queue(&s, &parent).await?;
        let mut holder = None;
        let mut waiters = 0;
        for (i, name) in queue.iter().enumerate() {
            match self.op("get", s.client.get_data(&format!("{parent}/{name}"))).await? {
                Ok((data, stat)) => {
                    holder = Some(HolderInfo {
                        label: nodes::label_of(&data),
                        fence: u64::try_from(stat.czxid).unwrap_or(0),
                        ttl_left: None,
                    });
                    waiters = (queue.len() - i - 1) as u64;
                    break;
                }
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(map_err(e)),
            }
        }
        Ok(LockStatus { key: key.to_string(), holder, waiters: Some(waiters) })
    }
}
