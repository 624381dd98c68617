//! Shared leases (semaphore permits, readers) on etcd: a share is a key in
//! the lock's queue like a mutex's, and is admitted by the lease model's
//! queue rule (`admission::admitted_in_queue`) over the keys ahead of it.
//! Writers are exclusive keys (suffix `~w`) and wait as a mutex's do.

use std::time::Instant;

use etcd_client::{Compare, CompareOp, EventType, KeyValue, PutOptions, Txn, TxnOp, WatchOptions, WatchResponse};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::acquire::{Joined, key_deleted};
use super::ops;
use crate::backend::admission::{self, Shrink, admitted_in_queue, conflict_in_queue, holding_in_queue};
use crate::backend::{AcquireRequest, Grant, LeaseMode};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

/// Keys rewritten by one `resize` transaction: etcd refuses transactions of
/// more than `--max-txn-ops` (128 by default) operations.
const RESIZE_CHUNK: usize = 64;

impl Shared {
    /// A share of the lock: joins the queue, then is admitted, waits (if
    /// `wait`) until it is, or leaves the queue (refused, or in conflict
    /// with the limit of the shares ahead).
    pub(super) async fn share(&self, req: &AcquireRequest, wait: bool) -> Result<Option<Grant>> {
        let started = Instant::now();
        let Joined { prefix, own, session, gone, resp, read_at } = self.join_queue(req).await?;
        // Alone in the queue at the join's own revision (the join reads the
        // two newest keys, ours the newest, in the same transaction as its
        // put): nothing ahead to wait for or conflict with, nobody behind to
        // wake (a share that joins later reads us as admitted). Granted from
        // that read, as a mutex first in line is, its TTL counted from the
        // join's send: one request where the position read made two.
        if resp.succeeded() && ops::kvs(&resp, 1).len() == 1 && admitted_in_queue([req.mode]) == 1 {
            self.note_queue(req, &prefix, &[]);
            return self.granted(req, &session, &gone, read_at, started).map(Some);
        }
        let my_rev = if resp.succeeded() {
            read_at
        } else {
            ops::kvs(&resp, 1).first().map(|kv| kv.create_revision()).ok_or_else(key_deleted)?
        };
        let mut joined = true;
        loop {
            let sent = Instant::now();
            let resp = self.conn.txn("queue position", ops::ahead(&prefix, &own, my_rev)).await?;
            let Some(mine) = ops::kvs(&resp, 0).into_iter().next() else {
                return Err(self.key_gone(&session, key_deleted()).await);
            };
            // Our own mode as stored: a resize may have rewritten its limit.
            let mode = ops::entry_of(&mine).mode;
            let ahead: Vec<KeyValue> = ops::kvs(&resp, 1);
            self.note_queue(req, &prefix, &ahead);
            let modes = || ahead.iter().map(|kv| ops::entry_of(kv).mode);
            if std::mem::take(&mut joined) {
                if let Some(reason) = conflict_in_queue(mode, modes()) {
                    self.leave(req).await?;
                    return Err(Error::Conflict { key: req.key.to_string(), reason });
                }
            }
            if admitted_in_queue(modes().chain([mode])) > ahead.len() {
                let grant = self.granted(req, &session, &gone, my_rev, sent)?;
                if ops::behind(&resp, my_rev) && !ops::entry_of(&mine).marked {
                    // A share behind us may be waiting for our turn to come
                    // (one that joins later reads us as admitted).
                    self.mark_holding(&mine).await;
                }
                return Ok(Some(grant));
            }
            if !wait {
                self.leave(req).await?;
                return Ok(None);
            }
            let read_at = ops::revision(&resp);
            // Behind an exclusive key, only its deletion can admit us (no
            // herd: the readers behind a writer wake when it goes). Behind
            // shares only, the first share that waits (the head waiter)
            // wakes when any key ahead goes; each share behind it waits for
            // its predecessor alone, which marks its key when it is admitted
            // (or goes), so a release wakes the head waiter and the shares
            // it admits one after another, not every waiter of the key.
            let holding = holding_in_queue(ahead.iter().map(|kv| {
                let e = ops::entry_of(kv);
                (e.mode, e.marked)
            }));
            let writer = ahead.iter().rev().find(|kv| ops::entry_of(kv).mode.is_exclusive());
            let waiting_pred = ahead.last().filter(|_| holding < ahead.len());
            let outcome = match (writer, waiting_pred) {
                (Some(kv), _) => self.wait_deleted(kv.key().to_vec(), read_at, &gone).await,
                (None, Some(pred)) => self.wait_rewritten(pred, read_at, &gone).await,
                (None, None) => {
                    let seen = ahead.iter().map(|kv| (kv.key().to_vec(), kv.mod_revision())).collect();
                    self.wait_queue_change(&prefix, &own, my_rev, seen, read_at, &gone).await
                }
            };
            match outcome {
                Err(e) if gone.is_cancelled() => return Err(self.key_gone(&session, e).await),
                other => other?,
            }
        }
    }

    /// After a share's read of the keys `ahead` of its own: the lock's next
    /// waiting shares of this client may wait side by side only while every
    /// key ahead is this client's (an attempt it tracks, or one it forgot
    /// lately); another client's key makes them take turns again, one
    /// queued key per client ([`wait::take_lane`]; the rule and its figures
    /// are ZooKeeper's, `stores/zookeeper/lanes.rs`).
    ///
    /// [`wait::take_lane`]: crate::backend::wait::take_lane
    fn note_queue(&self, req: &AcquireRequest, prefix: &[u8], ahead: &[KeyValue]) {
        let own = ahead.iter().all(|kv| {
            kv.key()
                .get(prefix.len()..prefix.len() + 32)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u128::from_str_radix(hex, 16).ok())
                .is_some_and(|token| self.grants.is_own(&req.key, token))
        });
        self.waiters.note_queue(req.key.as_str(), own, !ahead.is_empty());
    }

    /// Deletes this attempt's key (a refused try, or a conflict).
    async fn leave(&self, req: &AcquireRequest) -> Result<()> {
        self.grants.release(&self.conn, &self.watch, &req.key, req.token).await.map(|_| ())
    }

    /// Marks our share's key as holding (a put that keeps its lease, only
    /// if the key is as read), which wakes the share waiting behind it.
    /// Best effort: that share re-reads the queue after `RECHECK` anyway.
    async fn mark_holding(&self, mine: &KeyValue) {
        let e = ops::entry_of(mine);
        let same = Compare::mod_revision(mine.key().to_vec(), CompareOp::Equal, mine.mod_revision());
        let opts = PutOptions::new().with_ignore_lease();
        let put = TxnOp::put(mine.key().to_vec(), ops::rewritten_value(mine.key(), e.mode, &e.label, true), Some(opts));
        if let Err(err) = self.conn.txn("mark holding", Txn::new().when([same]).and_then([put])).await {
            tracing::debug!(%err, "could not mark a share as holding; the share behind it re-reads later");
        }
    }

    /// Resolves when the share `pred` ahead of us is rewritten (marked as
    /// holding, or resized) or deleted after revision `read_at`, when the
    /// watch fails, or after the recheck interval; errors if our own key is
    /// gone.
    async fn wait_rewritten(&self, pred: &KeyValue, read_at: i64, gone: &CancellationToken) -> Result<()> {
        let (key, seen) = (pred.key().to_vec(), pred.mod_revision());
        let any = |resp: &WatchResponse| !resp.events().is_empty();
        let (conn, k) = (&self.conn, &key);
        let missed = || async move {
            let now = conn.txn("get", Txn::new().and_then([TxnOp::get(k.clone(), None)])).await?;
            Ok(ops::kvs(&now, 0).first().is_none_or(|kv| kv.mod_revision() != seen))
        };
        self.watch_until(key.clone(), None, read_at, gone, any, missed).await
    }

    /// Resolves when a key under `prefix` is deleted or rewritten by a
    /// resize after revision `read_at`, when the watch fails, or after the recheck
    /// interval; errors if our own key is gone. New keys (behind us) do not
    /// wake it. A gap between `read_at` and the watch is closed by one read
    /// of the keys ahead, compared with `seen` (key and mod revision).
    async fn wait_queue_change(
        &self,
        prefix: &[u8],
        own: &[u8],
        my_rev: i64,
        seen: Vec<(Vec<u8>, i64)>,
        read_at: i64,
        gone: &CancellationToken,
    ) -> Result<()> {
        // A rewrite that marks a share as holding changes nobody's turn; a
        // resize rewrites our own key unmarked, which wakes us, and a shrink
        // changes a key's mode (read against the key before the event).
        let changed = |resp: &WatchResponse| {
            resp.events().iter().any(|e| {
                let shrunk = match (e.prev_kv(), e.kv()) {
                    (Some(before), Some(after)) => ops::entry_of(before).mode != ops::entry_of(after).mode,
                    _ => false,
                };
                e.event_type() == EventType::Delete
                    || shrunk
                    || e.kv().is_some_and(|kv| kv.mod_revision() != kv.create_revision() && !ops::entry_of(kv).marked)
            })
        };
        let (conn, seen) = (&self.conn, &seen);
        let missed = || async move {
            let now = conn.txn("queue position", ops::ahead(prefix, own, my_rev)).await?;
            let ahead = ops::kvs(&now, 1);
            let same = ahead.len() == seen.len()
                && ahead.iter().zip(seen).all(|(kv, (k, m))| kv.key() == k.as_slice() && kv.mod_revision() == *m);
            Ok(!same || ops::kvs(&now, 0).is_empty())
        };
        let opts = Some(WatchOptions::new().with_prefix().with_prev_key());
        self.watch_until(prefix.to_vec(), opts, read_at, gone, changed, missed).await
    }

    /// Rewrites the limit of every share of `key` (held or waiting) and
    /// returns the weight held. Each transaction checks that the keys it
    /// rewrites are as read; one that lost a race reads the queue again.
    pub(super) async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        let prefix = self.prefix(key);
        for _ in 0..8 {
            let resp = self.conn.txn("status", ops::queue(&prefix)).await?;
            let queue: Vec<(ops::Entry, KeyValue)> =
                ops::kvs(&resp, 0).into_iter().map(|kv| (ops::entry_of(&kv), kv)).collect();
            let holding = holding_in_queue(queue.iter().map(|(e, _)| (e.mode, e.marked)));
            let shares_of = |q: &[(ops::Entry, KeyValue)]| -> u64 {
                q.iter().filter(|(e, _)| !e.mode.is_exclusive()).map(|(e, _)| u64::from(e.mode.weight())).sum()
            };
            let held = shares_of(&queue[..holding]);
            // The shares to rewrite, each with whether it holds now (marked).
            let shares: Vec<_> = queue
                .iter()
                .enumerate()
                .filter(|(_, (e, _))| !e.mode.is_exclusive())
                .map(|(i, (e, kv))| (e, kv, i < holding))
                .collect();
            let mut raced = false;
            for chunk in shares.chunks(RESIZE_CHUNK) {
                let same = chunk
                    .iter()
                    .map(|(_, kv, _)| Compare::mod_revision(kv.key().to_vec(), CompareOp::Equal, kv.mod_revision()));
                let puts = chunk.iter().map(|(e, kv, holds)| {
                    let mode = LeaseMode::Shared { weight: e.mode.weight(), limit };
                    let opts = PutOptions::new().with_ignore_lease();
                    TxnOp::put(kv.key().to_vec(), ops::rewritten_value(kv.key(), mode, &e.label, *holds), Some(opts))
                });
                let txn = Txn::new().when(same.collect::<Vec<_>>()).and_then(puts.collect::<Vec<_>>());
                if !self.conn.txn("resize", txn).await?.succeeded() {
                    raced = true;
                    break;
                }
            }
            if !raced {
                return Ok(held);
            }
        }
        Err(Error::backend(super::STORE, true, "the lock's queue kept changing while it was resized"))
    }

    /// [`Backend::shrink`](crate::backend::Backend::shrink): our key takes
    /// the smaller mode in place (a put that keeps its lease and its
    /// creation revision, so its place in the queue and its fence), only if
    /// it is as read. Marked as holding: it was admitted, and holds.
    ///
    /// # Cancel safety
    ///
    /// One transaction per try: dropped, the key was rewritten or not.
    pub(super) async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        let Some(own) = self.grants.granted_key(key, token) else { return Ok(false) };
        for _ in 0..8 {
            let read = Txn::new().and_then([TxnOp::get(own.clone(), None)]);
            let Some(kv) = ops::kvs(&self.conn.txn("get", read).await?, 0).into_iter().next() else {
                return Ok(false);
            };
            let entry = ops::entry_of(&kv);
            let smaller = match admission::shrunk(entry.mode, to) {
                Ok(mode) => mode,
                Err(reason) => return Shrink::NotSmaller(reason).answer(),
            };
            let value = ops::rewritten_value(&own, smaller, &entry.label, true);
            let put = TxnOp::put(own.clone(), value, Some(PutOptions::new().with_ignore_lease()));
            let txn = Txn::new()
                .when([Compare::mod_revision(own.clone(), CompareOp::Equal, kv.mod_revision())])
                .and_then([put]);
            if self.conn.txn("shrink", txn).await?.succeeded() {
                return Ok(true);
            }
        }
        Err(Error::backend(super::STORE, true, "the grant's key kept changing while it was shrunk"))
    }

    /// Replaces the label of `token`'s live grant of `key`, keeping its mode.
    pub(super) async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        let Some(own) = self.grants.granted_key(key, token) else { return Ok(false) };
        for _ in 0..8 {
            let read = Txn::new().and_then([TxnOp::get(own.clone(), None)]);
            let Some(kv) = ops::kvs(&self.conn.txn("get", read).await?, 0).into_iter().next() else {
                return Ok(false);
            };
            let entry = ops::entry_of(&kv);
            let value = ops::rewritten_value(&own, entry.mode, label, entry.marked);
            let put = TxnOp::put(own.clone(), value, Some(PutOptions::new().with_ignore_lease()));
            let txn = Txn::new()
                .when([Compare::mod_revision(own.clone(), CompareOp::Equal, kv.mod_revision())])
                .and_then([put]);
            if self.conn.txn("relabel", txn).await?.succeeded() {
                return Ok(true);
            }
        }
        Err(Error::backend(super::STORE, true, "the grant's key kept changing while it was relabelled"))
    }
}
