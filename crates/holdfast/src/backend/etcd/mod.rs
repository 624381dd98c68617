//! The etcd store: session leases, a queue of keys per lock, revision fences. See `docs.md`.
#![doc = include_str!("docs.md")]

mod config;
mod ops;
mod session;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{Certificate, ConnectOptions, EventType, GetOptions, Identity, SortOrder, SortTarget, TlsOptions};
use tokio::sync::{Notify, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

pub use config::EtcdConfig;
use session::{Session, session_lost};

use crate::backend::{AcquireRequest, Backend, Grant, HolderInfo, LockStatus, RenewRequest};
use crate::capability::{Capabilities, FenceDurability};
use crate::error::{Error, Result};
use crate::key::{LockKey, OwnerToken};

const STORE: &str = "etcd";

/// How long a waiter trusts its watch before it re-reads its position anyway.
const RECHECK: Duration = Duration::from_secs(10);

fn is_retryable(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => true,
        // gRPC codes: 1 Cancelled, 2 Unknown, 4 DeadlineExceeded, 10 Aborted, 14 Unavailable.
        E::GRpcStatus(s) => matches!(s.code() as i32, 1 | 2 | 4 | 10 | 14) || s.message().contains("leader"),
        _ => false,
    }
}

fn map_err(e: etcd_client::Error) -> Error {
    Error::backend(STORE, is_retryable(&e), e)
}

/// The etcd client and the per-operation time budget, with retries on the
/// other endpoints: etcd-client keeps sending some requests to a dead
/// endpoint after a member dies, so a transport error or `Unavailable` is
/// retried (each request here is idempotent) until the budget is spent.
#[derive(Clone)]
pub(super) struct Conn {
    client: etcd_client::Client,
    timeout: Duration,
}

impl Conn {
    async fn call<T, F, Fut>(&self, what: &str, mut f: F) -> Result<T>
    where
        F: FnMut(etcd_client::Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut backoff = Duration::from_millis(10);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let per_try = left.min((self.timeout / 2).max(Duration::from_millis(500)));
            match tokio::time::timeout(per_try, f(self.client.clone())).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if is_retryable(&e) && tokio::time::Instant::now() + backoff < deadline => {
                    tracing::debug!(what, error = %e, "etcd request failed; retrying");
                }
                Ok(Err(e)) => return Err(map_err(e)),
                Err(_) if tokio::time::Instant::now() + backoff < deadline => {
                    tracing::debug!(what, "etcd request timed out; retrying");
                }
                Err(_) => {
                    return Err(Error::backend(STORE, true, format!("etcd {what} timed out after {:?}", self.timeout)));
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(200));
        }
    }

    async fn txn(&self, what: &str, txn: etcd_client::Txn) -> Result<etcd_client::TxnResponse> {
        self.call(what, |mut c| {
            let t = txn.clone();
            async move { c.txn(t).await }
        })
        .await
    }
}

/// A grant this client holds, with the deadline after which the store deletes
/// it unless renewed (the lock's own TTL, shorter than the session lease).
struct Held {
    own: Vec<u8>,
    deadline: tokio::time::Instant,
    session: Arc<Session>,
}

struct Shared {
    conn: Conn,
    config: EtcdConfig,
    shutdown: CancellationToken,
    /// Session leases by TTL in seconds.
    sessions: tokio::sync::Mutex<HashMap<i64, Arc<Session>>>,
    held: Mutex<HashMap<(String, u128), Held>>,
    held_changed: Notify,
    /// Queue puts still in flight, by token: a release waits for them, so a
    /// put that lands after an aborted acquire cannot leave a key behind.
    inflight: Mutex<HashMap<u128, watch::Receiver<bool>>>,
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
    pub async fn open_url(url: &str) -> Result<Self> {
        Self::open(EtcdConfig::from_url(url)?).await
    }

    /// Connects (lazily: the first request dials) to the cluster.
    pub async fn open(config: EtcdConfig) -> Result<Self> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_keep_alive_while_idle(true)
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
        let shared = Arc::new(Shared {
            conn: Conn { client, timeout: config.timeout },
            config,
            shutdown: shutdown.clone(),
            sessions: tokio::sync::Mutex::default(),
            held: Mutex::default(),
            held_changed: Notify::new(),
            inflight: Mutex::default(),
        });
        tokio::spawn(expire_held(shared.clone()));
        Ok(EtcdBackend { shared, _shutdown: shutdown.drop_guard() })
    }

    /// The session lease for a lock TTL: `max(ceil(ttl), session_ttl)` seconds.
    async fn session(&self, ttl: Duration) -> Result<Arc<Session>> {
        let secs = (ttl.as_millis().div_ceil(1000) as i64).max(self.shared.config.session_ttl_secs);
        let mut sessions = self.shared.sessions.lock().await;
        if let Some(s) = sessions.get(&secs).filter(|s| !s.lost.is_cancelled()) {
            return Ok(s.clone());
        }
        let s = Session::start(&self.shared.conn, secs, self.shared.shutdown.clone()).await?;
        sessions.insert(secs, s.clone());
        Ok(s)
    }

    fn lock_prefix(&self, key: &LockKey) -> Vec<u8> {
        ops::lock_prefix(&self.shared.config.prefix, key)
    }

    /// Runs the first request of an attempt (the one that writes our key) on
    /// its own task, registered as in flight until it is answered.
    async fn first_write(
        &self,
        token: OwnerToken,
        what: &'static str,
        txn: etcd_client::Txn,
    ) -> Result<etcd_client::TxnResponse> {
        let (done_tx, done_rx) = watch::channel(false);
        lock(&self.shared.inflight).insert(token.as_u128(), done_rx);
        let shared = self.shared.clone();
        let task = tokio::spawn(async move {
            let r = shared.conn.txn(what, txn).await;
            lock(&shared.inflight).remove(&token.as_u128());
            let _ = done_tx.send(true);
            r
        });
        task.await.map_err(|e| Error::backend(STORE, false, e))?
    }

    fn remember(&self, key: &LockKey, token: OwnerToken, own: Vec<u8>, session: Arc<Session>, deadline: Instant) {
        let deadline = tokio::time::Instant::from_std(deadline);
        lock(&self.shared.held).insert((key.as_str().to_owned(), token.as_u128()), Held { own, deadline, session });
        self.shared.held_changed.notify_one();
    }

    fn granted(
        &self,
        req: &AcquireRequest,
        own: Vec<u8>,
        session: &Arc<Session>,
        fence: i64,
        started: Instant,
    ) -> Result<Grant> {
        // A grant is believed only while our own session is alive.
        if session.lost.is_cancelled() {
            return Err(session_lost());
        }
        self.remember(&req.key, req.token, own, session.clone(), started + req.ttl);
        Ok(Grant {
            fence: fence as u64,
            attempt_started: started,
            valid_for: req.ttl,
            session_lost: Some(session.lost.clone()),
        })
    }

    /// Waits until no key older than ours remains under the prefix; returns
    /// when the read that found us first in line was sent. The lock's TTL
    /// runs from then: until that read, the session lease alone kept our key.
    async fn wait_turn(
        &self,
        prefix: &[u8],
        own: &[u8],
        my_rev: i64,
        session: &Session,
        mut pred: Option<(Vec<u8>, i64)>,
    ) -> Result<Instant> {
        loop {
            if let Some((pred_key, read_at)) = pred.take() {
                self.wait_deleted(pred_key, read_at, session).await?;
            }
            let sent = Instant::now();
            let resp = self.shared.conn.txn("queue position", ops::position(prefix, own, my_rev)).await?;
            if ops::kvs(&resp, 0).is_empty() {
                // Our key is gone: the session lease expired, or it was deleted.
                return Err(session_lost());
            }
            match ops::kvs(&resp, 1).into_iter().next() {
                None => return Ok(sent),
                Some(kv) => pred = Some((kv.key().to_vec(), ops::revision(&resp))),
            }
        }
    }

    /// Resolves when `key`, seen at revision `read_at`, is deleted, when the
    /// watch fails, or after [`RECHECK`]; errors if the session is lost.
    ///
    /// The watch starts at the current revision rather than at `read_at + 1`:
    /// etcd delivers events to a watch that starts in the past only from its
    /// 100 ms catch-up loop, which would add up to 100 ms to hand-offs. If the
    /// store moved on between our read and the watch, one read of the key
    /// closes the gap.
    async fn wait_deleted(&self, key: Vec<u8>, read_at: i64, session: &Session) -> Result<()> {
        let watching = self.shared.conn.call("watch", |mut c| {
            let k = key.clone();
            async move { c.watch(k, None).await }
        });
        let mut stream = tokio::select! {
            _ = session.lost.cancelled() => return Err(session_lost()),
            s = watching => s?,
        };
        let recheck = tokio::time::sleep(RECHECK);
        tokio::pin!(recheck);
        loop {
            tokio::select! {
                _ = session.lost.cancelled() => return Err(session_lost()),
                _ = &mut recheck => return Ok(()),
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        if resp.canceled() || resp.compact_revision() > 0
                            || resp.events().iter().any(|e| e.event_type() == EventType::Delete)
                        {
                            return Ok(());
                        }
                        let watched_from = resp.header().map_or(i64::MAX, |h| h.revision());
                        if resp.created() && watched_from > read_at && !self.exists(&key).await? {
                            return Ok(());
                        }
                    }
                    other => {
                        tracing::debug!(?other, "etcd watch ended; re-reading the queue");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        return Ok(());
                    }
                },
            }
        }
    }

    async fn exists(&self, key: &[u8]) -> Result<bool> {
        let resp = self
            .shared
            .conn
            .call("get", |mut c| {
                let k = key.to_vec();
                async move { c.get(k, Some(GetOptions::new().with_count_only())).await }
            })
            .await?;
        Ok(resp.count() > 0)
    }

    async fn acquire_waiting(&self, req: &AcquireRequest, session: Arc<Session>, started: Instant) -> Result<Grant> {
        let prefix = self.lock_prefix(&req.key);
        let own = ops::own_key(&prefix, req.token);
        let resp =
            self.first_write(req.token, "enqueue", ops::enqueue(&prefix, &own, &req.label, session.lease)).await?;
        let read_at = ops::revision(&resp);
        let (my_rev, pred) = if resp.succeeded() {
            // Our put is the newest key: the two newest are ours and our predecessor's.
            let newest = ops::kvs(&resp, 1);
            (read_at, newest.get(1).map(|kv| (kv.key().to_vec(), read_at)))
        } else {
            // A retried request whose first try had landed: find our place again.
            let mine = ops::kvs(&resp, 0);
            let kv = mine.first().ok_or_else(session_lost)?;
            (kv.create_revision(), None)
        };
        let started = if pred.is_some() || !resp.succeeded() {
            self.wait_turn(&prefix, &own, my_rev, &session, pred).await?
        } else {
            started
        };
        self.granted(req, own, &session, my_rev, started)
    }

    async fn acquire_once(
        &self,
        req: &AcquireRequest,
        session: Arc<Session>,
        started: Instant,
    ) -> Result<Option<Grant>> {
        let prefix = self.lock_prefix(&req.key);
        let own = ops::own_key(&prefix, req.token);
        let resp = self
            .first_write(req.token, "try acquire", ops::try_acquire(&prefix, &own, &req.label, session.lease))
            .await?;
        if resp.succeeded() {
            return self.granted(req, own, &session, ops::revision(&resp), started).map(Some);
        }
        match ops::kvs(&resp, 0).first() {
            // A retried request whose first try had landed.
            Some(kv) if kv.key() == own.as_slice() => {
                let fence = kv.create_revision();
                self.granted(req, own, &session, fence, started).map(Some)
            }
            _ => Ok(None),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Deletes the keys of grants whose lock TTL ran out without a renewal (a
/// guard forgotten or not renewed), so a lock lives no longer than its TTL
/// while the client lives; if the client dies, the session lease frees them.
async fn expire_held(shared: Arc<Shared>) {
    // Keys whose delete failed (store unreachable): retried every second,
    // since their session lease is kept alive and would keep them forever.
    let mut retry: Vec<Vec<u8>> = Vec::new();
    let mut retry_at = tokio::time::Instant::now();
    loop {
        let next = lock(&shared.held).values().map(|h| h.deadline).min();
        let far = if retry.is_empty() { tokio::time::Instant::now() + Duration::from_secs(3600) } else { retry_at };
        let wake = next.map_or(far, |n| n.min(far));
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = shared.held_changed.notified() => continue,
            _ = tokio::time::sleep_until(wake) => {}
        }
        let now = tokio::time::Instant::now();
        let mut expired: Vec<Vec<u8>> = {
            let mut held = lock(&shared.held);
            let keys: Vec<_> = held.iter().filter(|(_, h)| h.deadline <= now).map(|(k, _)| k.clone()).collect();
            keys.into_iter().filter_map(|k| held.remove(&k)).map(|h| h.own).collect()
        };
        if !retry.is_empty() && retry_at <= now {
            expired.append(&mut retry);
        }
        for own in expired {
            tracing::debug!(key = %String::from_utf8_lossy(&own), "etcd lock TTL ran out without renewal; deleting");
            let r = shared
                .conn
                .call("expire", |mut c| {
                    let k = own.clone();
                    async move { c.delete(k, None).await }
                })
                .await;
            if let Err(e) = r {
                tracing::warn!(error = %e, "could not delete an expired etcd lock key; retrying");
                retry.push(own);
                retry_at = tokio::time::Instant::now() + Duration::from_secs(1);
            }
        }
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
            fence_durability: FenceDurability::Durable,
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        let started = Instant::now();
        let session = self.session(req.ttl).await?;
        self.acquire_once(req, session, started).await
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        let started = Instant::now();
        let session = self.session(req.ttl).await?;
        self.acquire_waiting(req, session, started).await
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        let pending = lock(&self.shared.inflight).get(&token.as_u128()).cloned();
        if let Some(mut done) = pending {
            // Let an aborted attempt's put land (or fail) before deleting.
            let _ = tokio::time::timeout(self.shared.conn.timeout, done.wait_for(|d| *d)).await;
        }
        // Only granted keys are in `held`, so a delete of one that is there
        // releases a grant; any other delete removes a queue entry (or nothing).
        let was_held = lock(&self.shared.held).remove(&(key.as_str().to_owned(), token.as_u128())).is_some();
        let own = ops::own_key(&self.lock_prefix(key), token);
        let resp = self
            .shared
            .conn
            .call("release", |mut c| {
                let k = own.clone();
                async move { c.delete(k, None).await }
            })
            .await?;
        Ok(was_held && resp.deleted() > 0)
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        let sent = tokio::time::Instant::now();
        let sessions: Vec<Arc<Session>> = {
            let held = lock(&self.shared.held);
            let mut v: Vec<Arc<Session>> = Vec::new();
            for l in leases {
                if let Some(h) = held.get(&(l.key.as_str().to_owned(), l.token.as_u128())) {
                    if !v.iter().any(|s| s.lease == h.session.lease) {
                        v.push(h.session.clone());
                    }
                }
            }
            v
        };
        // One keep-alive per session lease renews every key on it.
        let confirmed = futures::future::join_all(sessions.iter().map(|s| s.confirm())).await;
        for (s, r) in sessions.iter().zip(&confirmed) {
            if let Err(e) = r {
                if !s.lost.is_cancelled() {
                    return Err(Error::backend(STORE, true, e.to_string()));
                }
            }
        }
        let mut held = lock(&self.shared.held);
        Ok(leases
            .iter()
            .map(|l| match held.get_mut(&(l.key.as_str().to_owned(), l.token.as_u128())) {
                Some(h) if !h.session.lost.is_cancelled() && h.deadline > sent => {
                    h.deadline = h.deadline.max(sent + l.ttl);
                    true
                }
                _ => false,
            })
            .collect())
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        let prefix = self.lock_prefix(key);
        let opts = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1);
        let resp = self
            .shared
            .conn
            .call("status", |mut c| {
                let (p, o) = (prefix.clone(), opts.clone());
                async move { c.get(p, Some(o)).await }
            })
            .await?;
        let count = resp.count().max(0) as u64;
        let holder = match resp.kvs().first() {
            None => None,
            Some(kv) => {
                let lease = kv.lease();
                let ttl = if lease == 0 {
                    None
                } else {
                    let r = self
                        .shared
                        .conn
                        .call("lease ttl", |mut c| async move { c.lease_time_to_live(lease, None).await })
                        .await?;
                    (r.ttl() >= 0).then(|| Duration::from_secs(r.ttl() as u64))
                };
                Some(HolderInfo {
                    label: String::from_utf8_lossy(kv.value()).into_owned(),
                    fence: kv.create_revision().max(0) as u64,
                    ttl_left: ttl,
                })
            }
        };
        Ok(LockStatus { key: key.to_string(), holder, waiters: Some(count.saturating_sub(1)) })
    }
}
