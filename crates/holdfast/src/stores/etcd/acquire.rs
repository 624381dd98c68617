//! Acquiring: one attempt, or a place in the lock's queue and the wait for
//! the keys before it to go.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{EventType, WatchOptions, WatchResponse};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::error::is_lease_not_found;
use super::grants::Entry;
use super::ops::{self, Failed};
use super::session::{Session, session_lost};
use super::{STORE, Shared};
use crate::backend::{AcquireRequest, Grant};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::OwnerToken;

/// How an attempt's first write ended.
enum FirstWrite {
    /// Applied: the write's own response, and its revision.
    Applied(etcd_client::TxnResponse, i64),
    /// The session lease is gone (etcd refused it, or the epoch key went with it).
    LeaseGone,
    Failed(Failed),
    /// The epoch moved under every one of [`MAX_EPOCH_MOVES`] sends.
    KeepsMoving,
}

/// How many times one first write is sent again because the session's
/// epoch moved under it before the attempt fails (retryably).
const MAX_EPOCH_MOVES: u32 = 16;

/// How long a waiter trusts its watch before it re-reads its position anyway.
const RECHECK: Duration = Duration::from_secs(10);

/// The error of an attempt whose key was deleted while it waited.
pub(super) fn key_deleted() -> Error {
    Error::backend(
        STORE,
        true,
        "this attempt's etcd key was deleted (its session lease revoked or expired, or by hand)",
    )
}

/// An attempt's key just put in its lock's queue.
pub(super) struct Joined {
    pub(super) prefix: Vec<u8>,
    pub(super) own: Vec<u8>,
    pub(super) session: Arc<Session>,
    pub(super) gone: CancellationToken,
    /// The enqueue's response: the two newest keys, or our key if it existed.
    pub(super) resp: etcd_client::TxnResponse,
    pub(super) read_at: i64,
}

impl Shared {
    /// One attempt: put our key if the lock is free.
    pub(super) async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        if !req.mode.is_exclusive() {
            return self.share(req, false).await;
        }
        let started = Instant::now();
        let prefix = self.prefix(&req.key);
        let own = ops::own_key(&prefix, req.token, req.mode);
        let value = ops::entry_value(req.mode, &req.label, false);
        let make = |lease| ops::try_acquire(&prefix, &own, &value, lease);
        let (session, gone, resp, read_at) = self.write_first(req, &own, "try acquire", make).await?;
        let fence = if resp.succeeded() {
            read_at
        } else {
            match ops::kvs(&resp, 0).first() {
                // A retried request whose first try had landed.
                Some(kv) if kv.key() == own.as_slice() => kv.create_revision(),
                _ => {
                    // The put was not made: nothing to release, unless a
                    // copy of it may still be applied later.
                    self.grants.forget(&self.conn, &self.watch, &req.key, req.token).await?;
                    return Ok(None);
                }
            }
        };
        self.grants.watch_from(&self.watch, &req.key, req.token, read_at + 1);
        self.granted(req, &session, &gone, fence, started).map(Some)
    }

    /// Joins the lock's queue and waits until no key older than ours is left.
    pub(super) async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        if !req.mode.is_exclusive() {
            return self.share(req, true).await?.ok_or_else(key_deleted);
        }
        let started = Instant::now();
        let Joined { prefix, own, session, gone, resp, read_at } = self.join_queue(req).await?;
        let read = ops::kvs(&resp, 1);
        let (my_rev, pred) = if resp.succeeded() {
            // Our put is the newest key: the two newest are ours and our predecessor's.
            (read_at, read.get(1).map(|kv| (kv.key().to_vec(), read_at)))
        } else {
            // Our key existed: find our place again.
            let kv = read.first().ok_or_else(key_deleted)?;
            (kv.create_revision(), None)
        };
        let started = if pred.is_some() || !resp.succeeded() {
            self.wait_turn(&prefix, &own, my_rev, &session, &gone, pred).await?
        } else {
            started
        };
        self.granted(req, &session, &gone, my_rev, started)
    }

    /// Puts this attempt's key at the end of the lock's queue and starts
    /// watching it. A new attempt of the same token (after its session was
    /// lost while it waited) replaces the old one, whose key, if it still
    /// exists, the enqueue puts on the new session, keeping its place.
    pub(super) async fn join_queue(&self, req: &AcquireRequest) -> Result<Joined> {
        let prefix = self.prefix(&req.key);
        let own = ops::own_key(&prefix, req.token, req.mode);
        let value = ops::entry_value(req.mode, &req.label, false);
        let make = |lease| ops::enqueue(&prefix, &own, &value, lease);
        let (session, gone, resp, read_at) = self.write_first(req, &own, "enqueue", make).await?;
        // From now on, a deletion of our key (the session revoked, or the key
        // deleted by hand) cancels `gone` within milliseconds.
        self.grants.watch_from(&self.watch, &req.key, req.token, read_at + 1);
        Ok(Joined { prefix, own, session, gone, resp, read_at })
    }

    /// Tracks the attempt and sends its first request (the one that writes
    /// our key, made by `make` for a session lease) on the session for its
    /// TTL. A request refused because that lease is gone (revoked before the
    /// keep-alive could tell) wrote nothing: the session is lost, and the
    /// request is made once more on a new one. The response of the request
    /// made by `make`, and the revision it was applied at.
    pub(super) async fn write_first(
        &self,
        req: &AcquireRequest,
        own: &[u8],
        what: &'static str,
        make: impl Fn(i64) -> etcd_client::Txn,
    ) -> Result<(Arc<Session>, CancellationToken, etcd_client::TxnResponse, i64)> {
        for _ in 0..2 {
            let session = self.sessions.for_ttl(&self.conn, req.ttl, &self.shutdown).await?;
            let entry = Entry::new(own.to_vec(), session.clone());
            let gone = entry.gone.clone();
            self.grants.track(&self.watch, &req.key, req.token, entry);
            if let Some((resp, at)) = self.first_write(req.token, &session, what, make(session.lease)).await? {
                return Ok((session, gone, resp, at));
            }
        }
        Err(session_lost())
    }

    /// Runs the first request of an attempt on its own task, registered as
    /// in flight until it is answered, under the session's epoch (sent
    /// again under the new one if a release moved it meanwhile); `None` if
    /// etcd refused it because the session lease is gone (the session is
    /// then lost).
    async fn first_write(
        &self,
        token: OwnerToken,
        session: &Arc<Session>,
        what: &'static str,
        txn: etcd_client::Txn,
    ) -> Result<Option<(etcd_client::TxnResponse, i64)>> {
        let (done_tx, done_rx) = watch::channel(false);
        self.grants.in_flight(token, done_rx);
        let (conn, grants, session_of_task) = (self.conn.clone(), Arc::clone(&self.grants), Arc::clone(session));
        let task = tokio::spawn(async move {
            let session = session_of_task;
            // Whether every copy sent was answered: none can be applied later.
            let mut certain = true;
            let mut moves = 0;
            let r = loop {
                let guarded = ops::in_epoch(&session.epoch_key, session.epoch(), txn.clone());
                let mut sent = 0u32;
                let r = conn
                    .call_raw(what, |mut c| {
                        sent += 1;
                        let t = guarded.clone();
                        async move { c.txn(t).await }
                    })
                    .await;
                certain &= sent == 1 && !matches!(r, Err(Failed::TimedOut));
                let resp = match r {
                    Ok(resp) => resp,
                    Err(Failed::Etcd(e)) if is_lease_not_found(&e) => break FirstWrite::LeaseGone,
                    Err(e) => break FirstWrite::Failed(e),
                };
                let at = ops::revision(&resp);
                match ops::epoch_outcome(resp) {
                    Ok(inner) => break FirstWrite::Applied(inner, at),
                    // The epoch key went with the session's lease.
                    Err(0) => break FirstWrite::LeaseGone,
                    // Another attempt's release moved the epoch after this
                    // copy was made: nothing was written; again, under the
                    // new epoch. Moves come only from this client's own
                    // releases of uncertain attempts, so they are few.
                    Err(now) if moves < MAX_EPOCH_MOVES => {
                        session.epoch_seen(now);
                        moves += 1;
                    }
                    Err(_) => break FirstWrite::KeepsMoving,
                }
            };
            grants.landed(token, certain);
            let _ = done_tx.send(true);
            r
        });
        match task.await.map_err(|e| Error::backend(STORE, false, e))? {
            FirstWrite::Applied(resp, at) => Ok(Some((resp, at))),
            FirstWrite::LeaseGone => {
                tracing::warn!(lease = session.lease, "etcd refused the session lease: session lost");
                session.lost.cancel();
                Ok(None)
            }
            FirstWrite::Failed(failed) => Err(self.conn.error(what, failed)),
            FirstWrite::KeepsMoving => Err(Error::backend(
                STORE,
                true,
                format!("etcd {what}: the session's epoch moved {MAX_EPOCH_MOVES} times under it; try again"),
            )),
        }
    }

    /// The grant of an attempt whose key holds the lock, believed only while
    /// the key and its session are there. The store keeps it `req.ttl` from
    /// `started`, or less if the session lease runs out sooner (it was last
    /// confirmed a while ago, and nothing renews it in between).
    pub(super) fn granted(
        &self,
        req: &AcquireRequest,
        session: &Session,
        gone: &CancellationToken,
        fence: i64,
        started: Instant,
    ) -> Result<Grant> {
        if gone.is_cancelled() || self.grants.grant(&req.key, req.token).is_none() {
            return Err(key_deleted());
        }
        let session_left = session.confirmed_until().into_std().saturating_duration_since(started);
        if session_left.is_zero() {
            // The session may already be gone on the server: no grant to vouch for.
            return Err(session_lost());
        }
        Ok(Grant {
            fence: fence as u64,
            attempt_started: started,
            valid_for: req.ttl.min(session_left),
            session_lost: Some(gone.clone()),
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
        gone: &CancellationToken,
        mut pred: Option<(Vec<u8>, i64)>,
    ) -> Result<Instant> {
        loop {
            if let Some((pred_key, read_at)) = pred.take() {
                match self.wait_deleted(pred_key, read_at, gone).await {
                    Err(e) if gone.is_cancelled() => return Err(self.key_gone(session, e).await),
                    other => other?,
                }
            }
            let sent = Instant::now();
            let resp = self.conn.txn("queue position", ops::position(prefix, own, my_rev)).await?;
            if ops::kvs(&resp, 0).is_empty() {
                return Err(self.key_gone(session, key_deleted()).await);
            }
            match ops::kvs(&resp, 1).into_iter().next() {
                None => return Ok(sent),
                Some(kv) => pred = Some((kv.key().to_vec(), ops::revision(&resp))),
            }
        }
    }

    /// Our key is gone while we waited. If it went with the session lease
    /// (revoked, or expired while this process was paused), make sure the
    /// session knows before the client's next attempt picks one: ask etcd
    /// now rather than at the next keep-alive.
    pub(super) async fn key_gone(&self, session: &Session, e: Error) -> Error {
        if !session.lost.is_cancelled() {
            let _ = tokio::time::timeout(self.conn.timeout, session.confirm()).await;
        }
        e
    }

    /// Resolves when `key`, seen at revision `read_at`, is deleted or shrunk, when the
    /// watch fails, or after [`RECHECK`]; errors if our own key is gone.
    pub(super) async fn wait_deleted(&self, key: Vec<u8>, read_at: i64, gone: &CancellationToken) -> Result<()> {
        // Or shrunk to a share (a downgraded writer): the shares behind it
        // may now be admitted.
        let deleted = |resp: &WatchResponse| {
            resp.events()
                .iter()
                .any(|e| e.event_type() == EventType::Delete || e.kv().is_some_and(|kv| ops::is_shrunk(kv.value())))
        };
        let (conn, k) = (&self.conn, &key);
        let missed = || async move { Ok(!conn.exists(k).await?.0) };
        self.watch_until(key.clone(), None, read_at, gone, deleted, missed).await
    }

    /// Watches `key` (a prefix, with `opts`) until a response `wakes` us,
    /// the watch fails, or after [`RECHECK`]; errors if our own key is gone.
    ///
    /// The watch starts at the current revision rather than at `read_at + 1`:
    /// etcd delivers events to a watch that starts in the past only from its
    /// 100 ms catch-up loop, which would add up to 100 ms to hand-offs. If the
    /// store moved on between our read and the watch, one read (`missed`:
    /// did what we wait for happen meanwhile?) closes the gap.
    pub(super) async fn watch_until<Missed: Future<Output = Result<bool>>>(
        &self,
        key: Vec<u8>,
        opts: Option<WatchOptions>,
        read_at: i64,
        gone: &CancellationToken,
        wakes: impl Fn(&WatchResponse) -> bool,
        missed: impl Fn() -> Missed,
    ) -> Result<()> {
        let watching = self.conn.call("watch", |mut c| {
            let (k, o) = (key.clone(), opts.clone());
            async move { c.watch(k, o).await }
        });
        let mut stream = tokio::select! {
            _ = gone.cancelled() => return Err(key_deleted()),
            s = watching => s?,
        };
        let recheck = tokio::time::sleep(RECHECK);
        tokio::pin!(recheck);
        loop {
            tokio::select! {
                _ = gone.cancelled() => return Err(key_deleted()),
                _ = &mut recheck => return Ok(()),
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        if resp.canceled() || resp.compact_revision() > 0 || wakes(&resp) {
                            return Ok(());
                        }
                        let watched_from = resp.header().map_or(i64::MAX, |h| h.revision());
                        if resp.created() && watched_from > read_at && missed().await? {
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
}
