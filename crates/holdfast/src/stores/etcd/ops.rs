//! The etcd requests of the lock recipe: the connection with its retries,
//! the key layout, the transactions, and the status read.
//!
//! Layout: a lock `K` owns the prefix `{prefix}{enc(K)}/` and each waiter or
//! holder one key under it, `{prefix}{enc(K)}/{token hex}`, attached to the
//! client's session lease, with the holder's label as value. `enc` escapes
//! `%` and `/`, so that the prefix of lock `a` never covers lock `a/b`.
//! The key with the lowest create revision holds the lock; its create
//! revision is the fence (etcd's revision is global and never reused).
//! Beside the locks, each session has an epoch key, `{prefix}%session/{lease}`
//! (see `session::Session::epoch_key`), under which first writes are made.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

use super::STORE;
use super::error::{is_retryable, map_err};
use crate::backend::{HolderInfo, LeaseMode, LockStatus};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

/// The etcd client and the per-operation time budget, with retries on the
/// other endpoints: etcd-client keeps sending some requests to a dead
/// endpoint after a member dies, so a transport error or `Unavailable` is
/// retried (each request here is idempotent) until the budget is spent.
#[derive(Clone)]
pub(super) struct Conn {
    pub(super) client: etcd_client::Client,
    pub(super) timeout: Duration,
}

/// The outcome of a call that gave up: the last error from etcd, or none
/// if every try timed out.
pub(super) enum Failed {
    Etcd(etcd_client::Error),
    TimedOut,
}

impl Conn {
    /// Calls `f` until it succeeds, fails for good, or the budget is spent.
    pub(super) async fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T>
    where
        F: FnMut(etcd_client::Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.call_raw(what, f).await.map_err(|failed| self.error(what, failed))
    }

    /// The error of a call `what` that gave up.
    pub(super) fn error(&self, what: &str, failed: Failed) -> Error {
        match failed {
            Failed::Etcd(e) => map_err(e),
            Failed::TimedOut => Error::backend(STORE, true, format!("etcd {what} timed out after {:?}", self.timeout)),
        }
    }

    /// As [`call`](Self::call), keeping etcd's own error for the caller to inspect.
    pub(super) async fn call_raw<T, F, Fut>(&self, what: &str, mut f: F) -> std::result::Result<T, Failed>
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
                Ok(Err(e)) => return Err(Failed::Etcd(e)),
                Err(_) if tokio::time::Instant::now() + backoff < deadline => {
                    tracing::debug!(what, "etcd request timed out; retrying");
                }
                Err(_) => return Err(Failed::TimedOut),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(200));
        }
    }

    pub(super) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.call(what, |mut c| {
            let t = txn.clone();
            async move { c.txn(t).await }
        })
        .await
    }

    /// Deletes `key`; the number of keys deleted, and whether an earlier try
    /// of this call may have been applied (its reply was lost).
    pub(super) async fn delete(&self, key: &[u8]) -> Result<(i64, bool)> {
        let mut tries = 0u32;
        let resp = self
            .call("release", |mut c| {
                tries += 1;
                let k = key.to_vec();
                async move { c.delete(k, None).await }
            })
            .await?;
        Ok((resp.deleted(), tries > 1))
    }

    /// Deletes `own` and writes the session's epoch key (on `lease`) in one
    /// transaction: after it, no copy of a first write sent under an earlier
    /// epoch writes anything ([`in_epoch`]). The number of keys deleted,
    /// whether an earlier try may have been applied, and the revision;
    /// `None` if etcd refused the lease (gone, and every key on it).
    pub(super) async fn delete_in_new_epoch(
        &self,
        own: &[u8],
        epoch_key: &[u8],
        lease: i64,
    ) -> Result<Option<(i64, bool, i64)>> {
        let txn = Txn::new().and_then([
            TxnOp::put(epoch_key.to_vec(), "", Some(PutOptions::new().with_lease(lease))),
            TxnOp::delete(own.to_vec(), None),
        ]);
        let mut tries = 0u32;
        let sent = self
            .call_raw("release", |mut c| {
                tries += 1;
                let t = txn.clone();
                async move { c.txn(t).await }
            })
            .await;
        let resp = match sent {
            Ok(resp) => resp,
            Err(Failed::Etcd(e)) if super::error::is_lease_not_found(&e) => return Ok(None),
            Err(failed) => return Err(self.error("release", failed)),
        };
        let deleted = match resp.op_responses().into_iter().nth(1) {
            Some(TxnOpResponse::Delete(d)) => d.deleted(),
            _ => 0,
        };
        Ok(Some((deleted, tries > 1, revision(&resp))))
    }

    /// Whether `key` exists, and the revision of the read.
    pub(super) async fn exists(&self, key: &[u8]) -> Result<(bool, i64)> {
        let resp = self
            .call("get", |mut c| {
                let k = key.to_vec();
                async move { c.get(k, Some(GetOptions::new().with_count_only())).await }
            })
            .await?;
        Ok((resp.count() > 0, resp.header().map_or(0, |h| h.revision())))
    }
}

/// The prefix under which the waiters of `key` live.
pub(super) fn lock_prefix(namespace: &str, key: &LockKey) -> Vec<u8> {
    let mut p = String::with_capacity(namespace.len() + key.as_str().len() + 1);
    p.push_str(namespace);
    for c in key.as_str().chars() {
        match c {
            '%' => p.push_str("%25"),
            '/' => p.push_str("%2F"),
            c => p.push(c),
        }
    }
    p.push('/');
    p.into_bytes()
}

/// The key of one waiter (or holder) under a lock prefix: the token, and
/// for a writer or a share a suffix naming the mode (`~w`, `~s`), so that
/// a mutex's keys and values are what they were and any key read tells
/// its mode.
pub(super) fn own_key(prefix: &[u8], token: OwnerToken, mode: LeaseMode) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(token.to_hex().as_bytes());
    k.extend_from_slice(match mode {
        LeaseMode::Shared { .. } => b"~s",
        LeaseMode::Writer => b"~w",
        _ => b"",
    });
    k
}

/// The value of a queue key: the label, after `weight limit\n` for a share
/// (`weight limit held\n` once marked as holding: by the share itself when
/// it was admitted with a key behind it, or by a resize; see
/// `admission::holding_in_queue`).
pub(super) fn entry_value(mode: LeaseMode, label: &str, marked: bool) -> String {
    match mode {
        LeaseMode::Shared { weight, limit } if marked => format!("{weight} {limit} held\n{label}"),
        LeaseMode::Shared { weight, limit } => format!("{weight} {limit}\n{label}"),
        _ => label.to_owned(),
    }
}

/// The value of an existing queue key rewritten to `mode`: as
/// [`entry_value`], but a writer's or a mutex's key that was shrunk to a
/// share ([`Backend::shrink`](crate::backend::Backend::shrink)) keeps its
/// name, and so its place (etcd orders the queue by creation), and says
/// "share" in its value instead, after a NUL that no label contains.
pub(super) fn rewritten_value(key: &[u8], mode: LeaseMode, label: &str, marked: bool) -> String {
    let value = entry_value(mode, label, marked);
    if key.ends_with(b"~s") || mode.is_exclusive() { value } else { format!("\0{value}") }
}

/// Whether a queue key's value says it was shrunk from exclusive to a share
/// (see [`rewritten_value`]): what a waiter behind an exclusive key waits
/// for besides its deletion.
pub(super) fn is_shrunk(value: &[u8]) -> bool {
    value.first() == Some(&0)
}

/// A queue key as [`own_key`] and [`entry_value`] wrote it.
pub(super) struct Entry {
    pub(super) mode: LeaseMode,
    pub(super) label: String,
    /// Marked as holding (admitted with a key behind it, or by a resize).
    pub(super) marked: bool,
}

/// The mode, label and mark of a queue key. A share whose value does not
/// parse reads as exclusive, the mode that admits least.
pub(super) fn entry_of(kv: &KeyValue) -> Entry {
    entry_from(kv.key(), kv.value())
}

/// [`entry_of`] on a key and value as bytes (a `KeyValue` cannot be made
/// outside etcd-client, so tests read entries through this).
pub(super) fn entry_from(key: &[u8], value: &[u8]) -> Entry {
    let shrunk = !key.ends_with(b"~s") && is_shrunk(value);
    let text = String::from_utf8_lossy(if shrunk { &value[1..] } else { value });
    let plain = |mode| Entry { mode, label: text.clone().into_owned(), marked: false };
    if key.ends_with(b"~w") && !shrunk {
        return plain(LeaseMode::Writer);
    }
    if !key.ends_with(b"~s") && !shrunk {
        return plain(LeaseMode::Exclusive);
    }
    let parsed = text.split_once('\n').and_then(|(head, label)| {
        let mut fields = head.split(' ');
        let weight = fields.next()?.parse().ok()?;
        let limit = fields.next()?.parse().ok()?;
        let marked = fields.next() == Some("held");
        Some(Entry { mode: LeaseMode::Shared { weight, limit }, label: label.to_owned(), marked })
    });
    parsed.unwrap_or_else(|| plain(LeaseMode::Exclusive))
}

fn by_create(order: SortOrder) -> GetOptions {
    GetOptions::new().with_prefix().with_sort(SortTarget::Create, order)
}

/// One attempt without waiting: put our key only if the lock's prefix is
/// empty; otherwise read the holder (which may be us, on a retried request).
pub(super) fn try_acquire(prefix: &[u8], own: &[u8], value: &str, lease: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(prefix.to_vec(), CompareOp::Equal, 0).with_prefix()])
        .and_then([TxnOp::put(own.to_vec(), value, Some(PutOptions::new().with_lease(lease)))])
        .or_else([TxnOp::get(prefix.to_vec(), Some(by_create(SortOrder::Ascend).with_limit(1)))])
}

/// Joins the queue: put our key and read the two newest keys, which are ours
/// and our predecessor's. If our key exists already (a retried request, or
/// an attempt made again after its session was lost while the key lived
/// on), it is put again on `lease`, keeping its place, and read back.
pub(super) fn enqueue(prefix: &[u8], own: &[u8], value: &str, lease: i64) -> Txn {
    let put = || TxnOp::put(own.to_vec(), value, Some(PutOptions::new().with_lease(lease)));
    Txn::new()
        .when([Compare::create_revision(own.to_vec(), CompareOp::Equal, 0)])
        .and_then([put(), TxnOp::get(prefix.to_vec(), Some(by_create(SortOrder::Descend).with_limit(2)))])
        .or_else([put(), TxnOp::get(own.to_vec(), None)])
}

/// `txn` (an attempt's first write), applied only if the session's epoch
/// key was last written at `epoch` (0: never); otherwise the epoch key is
/// read, and nothing written. A copy of the write that reaches etcd after
/// the attempt's release moved the epoch writes nothing, whatever the
/// branches of `txn` would have written (model 17: an epoch compare added
/// to `txn`'s own guard is not enough, since `enqueue`'s other branch
/// writes too).
pub(super) fn in_epoch(epoch_key: &[u8], epoch: i64, txn: Txn) -> Txn {
    Txn::new()
        .when([Compare::mod_revision(epoch_key.to_vec(), CompareOp::Equal, epoch)])
        .and_then([TxnOp::txn(txn)])
        .or_else([TxnOp::get(epoch_key.to_vec(), Some(GetOptions::new().with_keys_only()))])
}

/// What a first write sent by [`in_epoch`] did: `Ok` with `txn`'s own
/// response if it was applied, `Err` with the epoch key's mod revision now
/// (0 if it is gone, with the session) if the epoch had moved.
pub(super) fn epoch_outcome(resp: TxnResponse) -> std::result::Result<TxnResponse, i64> {
    let mut ops = resp.op_responses().into_iter();
    match (resp.succeeded(), ops.next()) {
        (true, Some(TxnOpResponse::Txn(inner))) => Ok(inner),
        (_, Some(TxnOpResponse::Get(g))) => Err(g.kvs().first().map_or(0, |kv| kv.mod_revision())),
        _ => Err(0),
    }
}

/// Our key (does it still exist?) and our predecessor: the newest key
/// created before ours.
pub(super) fn position(prefix: &[u8], own: &[u8], my_rev: i64) -> Txn {
    Txn::new().and_then([
        TxnOp::get(own.to_vec(), None),
        TxnOp::get(
            prefix.to_vec(),
            Some(by_create(SortOrder::Descend).with_max_create_revision(my_rev - 1).with_limit(1)),
        ),
    ])
}

/// Our key (does it still exist, in which mode?), every key created before
/// ours, oldest first (what a share's admission depends on), and the newest
/// key's name and revisions (created after ours: a share admitted now may
/// have a waiter behind it to wake; see [`behind`]).
pub(super) fn ahead(prefix: &[u8], own: &[u8], my_rev: i64) -> Txn {
    Txn::new().and_then([
        TxnOp::get(own.to_vec(), None),
        TxnOp::get(prefix.to_vec(), Some(by_create(SortOrder::Ascend).with_max_create_revision(my_rev - 1))),
        TxnOp::get(prefix.to_vec(), Some(by_create(SortOrder::Descend).with_limit(1).with_keys_only())),
    ])
}

/// Whether [`ahead`]'s answer shows a key created after ours (revision
/// `my_rev`). Read from the newest key itself: etcd's count of a range
/// ignores its revision filters (a count of the keys created after ours
/// counted ours too, so every admitted share rewrote its key to wake a
/// waiter that was not there: a third write per cycle).
pub(super) fn behind(resp: &TxnResponse, my_rev: i64) -> bool {
    kvs(resp, 2).first().is_some_and(|kv| kv.create_revision() > my_rev)
}

/// Every key of a lock, oldest first.
pub(super) fn queue(prefix: &[u8]) -> Txn {
    Txn::new().and_then([TxnOp::get(prefix.to_vec(), Some(by_create(SortOrder::Ascend)))])
}

/// The header revision of a transaction's response.
pub(super) fn revision(resp: &TxnResponse) -> i64 {
    resp.header().map(|h| h.revision()).unwrap_or(0)
}

/// The key-values read by the `n`-th operation of a transaction, if it was a get.
pub(super) fn kvs(resp: &TxnResponse, n: usize) -> Vec<KeyValue> {
    match resp.op_responses().into_iter().nth(n) {
        Some(TxnOpResponse::Get(mut g)) => g.take_kvs(),
        _ => Vec::new(),
    }
}

/// The holders of the lock under `prefix` (label, fence, and their session
/// lease's time left) and the number of waiters. A key whose head is
/// exclusive is answered from its head and a count; a shared key's queue
/// is read whole, to tell the admitted prefix from the waiters.
pub(super) async fn status(conn: &Conn, key: &LockKey, prefix: &[u8]) -> Result<LockStatus> {
    let read = |limit: i64| {
        let (p, o) = (prefix.to_vec(), by_create(SortOrder::Ascend).with_limit(limit));
        conn.call("status", move |mut c| {
            let (p, o) = (p.clone(), o.clone());
            async move { c.get(p, Some(o)).await }
        })
    };
    let mut resp = read(1).await?;
    let count = resp.count().max(0) as u64;
    let head_shared = resp.kvs().first().is_some_and(|kv| !entry_of(kv).mode.is_exclusive());
    if head_shared && count > 1 {
        resp = read(0).await?;
    }
    let queue: Vec<(Entry, &KeyValue)> = resp.kvs().iter().map(|kv| (entry_of(kv), kv)).collect();
    let admitted = crate::backend::admission::holding_in_queue(queue.iter().map(|(e, _)| (e.mode, e.marked)));
    let mut status = LockStatus { waiters: Some(count.saturating_sub(admitted as u64)), ..LockStatus::free(key) };
    let mut ttls: Vec<(i64, Option<Duration>)> = Vec::new();
    for (Entry { mode, label, .. }, kv) in queue.into_iter().take(admitted) {
        let lease = kv.lease();
        let ttl_left = match ttls.iter().find(|(l, _)| *l == lease) {
            Some((_, t)) => *t,
            None if lease == 0 => None,
            None => {
                let r = conn.call("lease ttl", |mut c| async move { c.lease_time_to_live(lease, None).await }).await?;
                let t = (r.ttl() >= 0).then(|| Duration::from_secs(r.ttl() as u64));
                ttls.push((lease, t));
                t
            }
        };
        let info = HolderInfo { label, fence: kv.create_revision().max(0) as u64, ttl_left, weight: mode.weight() };
        if mode.is_exclusive() {
            status.holder = Some(info);
        } else {
            status.limit = mode.limit();
            status.shared.push(info);
        }
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_never_nest() {
        let a = lock_prefix("holdfast/", &LockKey::new("a").unwrap());
        let ab = lock_prefix("holdfast/", &LockKey::new("a/b").unwrap());
        let pct = lock_prefix("holdfast/", &LockKey::new("a%2Fb").unwrap());
        assert_eq!(a, b"holdfast/a/");
        assert_eq!(ab, b"holdfast/a%2Fb/");
        assert_eq!(pct, b"holdfast/a%252Fb/");
        assert!(!ab.starts_with(&a) && !pct.starts_with(&ab));
    }
}
