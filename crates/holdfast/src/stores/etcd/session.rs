//! Session leases: one etcd lease per lease TTL in use, kept alive by one
//! keep-alive stream, whose loss cancels the session's token.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::STORE;
use super::error::is_lease_not_found;
use super::ops::Conn;
use crate::lease::drift_margin;
use crate::vocabulary::error::{Error, Result};

type Confirm = oneshot::Sender<Result<()>>;

/// One session lease. Every key the client writes with this lease TTL is
/// attached to it, so one keep-alive message renews all of them.
#[derive(Debug)]
pub(super) struct Session {
    /// The etcd lease id.
    pub(super) lease: i64,
    /// The session's epoch key (`{namespace}%session/{lease hex}`, on the
    /// lease): every attempt's first write is applied only while the key's
    /// mod revision is the one the client knew when it sent the write, and
    /// the release of an attempt whose write may still have a copy in the
    /// network writes the key in the same transaction as its delete. So a
    /// late copy of that write finds the epoch moved and writes nothing
    /// (`ops::in_epoch`; model 17, `etcd_late_copy`). `%` never starts an
    /// escaped lock key, so no lock's prefix covers it.
    pub(super) epoch_key: Vec<u8>,
    /// The epoch key's mod revision as this client last knew it (0: not
    /// written yet); only ever raised.
    epoch: AtomicI64,
    /// Cancelled when the lease may have expired on the server: the server
    /// said it is gone, or no keep-alive was confirmed within its TTL.
    pub(super) lost: CancellationToken,
    /// Until when the server is known to keep the lease (client clock, less
    /// the drift margin).
    confirmed_until: Arc<Mutex<Instant>>,
    confirm_tx: mpsc::Sender<Confirm>,
}

impl Session {
    /// Grants a lease of `ttl_secs` and starts its keep-alive task, which
    /// ends (revoking the lease) when `shutdown` is cancelled.
    async fn start(conn: &Conn, namespace: &str, ttl_secs: i64, shutdown: CancellationToken) -> Result<Arc<Session>> {
        let sent = Instant::now();
        let granted = conn.call("lease grant", |mut c| async move { c.lease_grant(ttl_secs, None).await }).await?;
        if granted.ttl() <= 0 || !granted.error().is_empty() {
            return Err(Error::backend(STORE, true, format!("lease grant refused: {}", granted.error())));
        }
        let ttl = Duration::from_secs(granted.ttl() as u64);
        let (confirm_tx, confirm_rx) = mpsc::channel(64);
        let confirmed_until = Arc::new(Mutex::new(sent + ttl - drift_margin(ttl)));
        let session = Arc::new(Session {
            lease: granted.id(),
            epoch_key: epoch_key(namespace, granted.id()),
            epoch: AtomicI64::new(0),
            lost: CancellationToken::new(),
            confirmed_until: confirmed_until.clone(),
            confirm_tx,
        });
        let task = KeepAlive {
            conn: conn.clone(),
            lease: granted.id(),
            ttl,
            confirmed_until,
            lost: session.lost.clone(),
            shutdown,
            rx: confirm_rx,
        };
        tokio::spawn(task.run());
        Ok(session)
    }

    /// Sends one keep-alive now and waits for the server's answer: `Ok` means
    /// the lease was extended to its full TTL from a moment after this call.
    /// If the server says the lease is gone, the session is lost.
    pub(super) async fn confirm(&self) -> Result<()> {
        if self.lost.is_cancelled() {
            return Err(session_lost());
        }
        let (tx, rx) = oneshot::channel();
        self.confirm_tx.send(tx).await.map_err(|_| session_lost())?;
        rx.await.map_err(|_| session_lost())?
    }

    /// The epoch the session's next first write is sent under.
    pub(super) fn epoch(&self) -> i64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Records that the epoch key was written (or read) at `revision`.
    pub(super) fn epoch_seen(&self, revision: i64) {
        self.epoch.fetch_max(revision, Ordering::AcqRel);
    }

    /// Until when the server keeps the lease, and so every key on it, if no
    /// further keep-alive gets through.
    pub(super) fn confirmed_until(&self) -> Instant {
        *self.confirmed_until.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The error of an operation whose session lease is gone.
pub(super) fn session_lost() -> Error {
    Error::backend(STORE, true, "the etcd session lease expired or was revoked")
}

/// The epoch key of the session on `lease` under `namespace`.
pub(super) fn epoch_key(namespace: &str, lease: i64) -> Vec<u8> {
    format!("{namespace}{EPOCH_DIR}{lease:016x}").into_bytes()
}

/// Where the sessions' epoch keys live under the namespace: `%` begins no
/// escaped lock key (`ops::lock_prefix` writes `%` as `%25`), so this is
/// no lock's prefix, and the admin calls skip it.
pub(super) const EPOCH_DIR: &str = "%session/";

/// The client's session leases, one per lease TTL in use.
pub(super) struct Sessions {
    /// The shortest session lease, in seconds.
    min_secs: i64,
    /// The store's namespace, for the sessions' epoch keys.
    namespace: String,
    /// Held while a session is started: one opener at a time.
    by_ttl: tokio::sync::Mutex<HashMap<i64, Arc<Session>>>,
}

impl Sessions {
    pub(super) fn new(min_secs: i64, namespace: &str) -> Self {
        Sessions { min_secs, namespace: namespace.to_owned(), by_ttl: tokio::sync::Mutex::default() }
    }

    /// The live session for a lock TTL (`max(ceil(ttl), min)` seconds),
    /// started if there is none or the last one was lost.
    pub(super) async fn for_ttl(
        &self,
        conn: &Conn,
        ttl: Duration,
        shutdown: &CancellationToken,
    ) -> Result<Arc<Session>> {
        let secs = (ttl.as_millis().div_ceil(1000) as i64).max(self.min_secs);
        let mut sessions = self.by_ttl.lock().await;
        if let Some(s) = sessions.get(&secs).filter(|s| !s.lost.is_cancelled()) {
            return Ok(s.clone());
        }
        let s = Session::start(conn, &self.namespace, secs, shutdown.clone()).await?;
        sessions.insert(secs, s.clone());
        Ok(s)
    }
}

struct KeepAlive {
    conn: Conn,
    lease: i64,
    ttl: Duration,
    confirmed_until: Arc<Mutex<Instant>>,
    lost: CancellationToken,
    shutdown: CancellationToken,
    rx: mpsc::Receiver<Confirm>,
}

#[derive(Debug, PartialEq, Eq)]
enum Ended {
    Lost,
    Shutdown,
}

impl KeepAlive {
    async fn run(mut self) {
        let outcome = self.keep_alive().await;
        self.lost.cancel();
        if outcome == Ended::Shutdown {
            // Best effort: free every key of this session now rather than at expiry.
            let lease = self.lease;
            let conn = self.conn.clone();
            let _ = tokio::time::timeout(Duration::from_secs(1), async move {
                conn.call("lease revoke", |mut c| async move { c.lease_revoke(lease).await }).await
            })
            .await;
        }
        self.rx.close();
        while let Ok(tx) = self.rx.try_recv() {
            let _ = tx.send(Err(session_lost()));
        }
    }

    fn confirmed_until(&self) -> Instant {
        *self.confirmed_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn keep_alive(&mut self) -> Ended {
        let interval = (self.ttl / 3).max(Duration::from_millis(100));
        // A keep-alive answers in milliseconds; one sent on a connection to a
        // dead member never does. Give up on a stream well before the lease
        // runs out, so there is time to reopen it on another endpoint. Never
        // longer than the operation timeout, even one below 250 ms (`clamp`
        // panicked there, in this task, and the session died unrenewed).
        let per_try = (self.ttl / 4).max(Duration::from_millis(250)).min(self.conn.timeout);
        loop {
            let left = self.confirmed_until().saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(lease = self.lease, "etcd session lease not confirmed within its TTL: session lost");
                return Ended::Lost;
            }
            let mut client = self.conn.client.clone();
            let opened = tokio::select! {
                _ = self.shutdown.cancelled() => return Ended::Shutdown,
                r = tokio::time::timeout(left.min(per_try), client.lease_keep_alive(self.lease)) => r,
            };
            let (mut keeper, mut stream) = match opened {
                Ok(Ok(pair)) => pair,
                // Opening a stream sends a first keep-alive; etcd-client turns
                // its "no such lease" answer into this error. Retrying it until
                // the lease's deadline would leave lost() that much late.
                Ok(Err(e)) if is_lease_not_found(&e) => {
                    tracing::warn!(lease = self.lease, "etcd session lease revoked or expired: session lost");
                    return Ended::Lost;
                }
                other => {
                    tracing::debug!(lease = self.lease, ?other, "etcd keep-alive stream failed to open; retrying");
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return Ended::Shutdown,
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                    continue;
                }
            };
            let mut next = Instant::now();
            loop {
                let mut waiting = Vec::new();
                tokio::select! {
                    _ = self.shutdown.cancelled() => return Ended::Shutdown,
                    _ = tokio::time::sleep_until(next) => {}
                    Some(tx) = self.rx.recv() => waiting.push(tx),
                }
                while let Ok(tx) = self.rx.try_recv() {
                    waiting.push(tx);
                }
                let sent = Instant::now();
                let left = self.confirmed_until().saturating_duration_since(sent);
                let answer = tokio::time::timeout(left.min(per_try), async {
                    keeper.keep_alive().await?;
                    stream.message().await
                })
                .await;
                match answer {
                    Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                        let ttl = Duration::from_secs(resp.ttl() as u64);
                        *self.confirmed_until.lock().unwrap_or_else(|p| p.into_inner()) =
                            sent + ttl - drift_margin(ttl);
                        next = sent + interval;
                        for tx in waiting {
                            let _ = tx.send(Ok(()));
                        }
                    }
                    Ok(Ok(Some(_))) => {
                        tracing::warn!(lease = self.lease, "etcd session lease expired or revoked: session lost");
                        // Mark the session lost before answering: a renewal
                        // reading this answer must find every grant on it gone,
                        // not a retryable error.
                        self.lost.cancel();
                        for tx in waiting {
                            let _ = tx.send(Err(session_lost()));
                        }
                        return Ended::Lost;
                    }
                    other => {
                        tracing::debug!(lease = self.lease, ?other, "etcd keep-alive failed; reopening the stream");
                        for tx in waiting {
                            let _ = tx.send(Err(Error::backend(STORE, true, "etcd keep-alive failed")));
                        }
                        break;
                    }
                }
            }
        }
    }
}
