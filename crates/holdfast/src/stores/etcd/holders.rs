//! The holder watch of one key ([`Backend::watch_holders`](crate::backend::Backend::watch_holders)):
//! one etcd watch on the key's range, from the revision of a read of the
//! whole queue, so that the queue is known at every revision and every
//! holder is seen, however short its grant.
//!
//! The queue is the lock's keys by create revision (`ops.rs`); it is
//! replayed from the watch's puts and deletes, one revision at a time (a
//! revision is one transaction: a holder seen between two of its events
//! never held). A broken stream resumes from the revision after the last
//! one applied, so nothing is lost. A watch whose start was compacted away
//! reads the queue afresh and, unless the holder it knew is still there
//! (it held throughout, so nobody else can have), first yields an error:
//! holders may have come and gone in the lost history.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use etcd_client::{EventType, GetOptions, SortOrder, SortTarget, WatchOptions, WatchResponse, WatchStream};
use futures::StreamExt;

use super::STORE;
use super::ops::{Conn, entry_of};
use crate::backend::{HolderInfo, HolderWatch, LeaseMode};
use crate::vocabulary::error::{Error, Result};

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const LAST_BACKOFF: Duration = Duration::from_secs(1);

/// The holder watch of the lock whose keys live under `prefix`.
pub(super) fn watch(conn: Conn, prefix: Vec<u8>) -> HolderWatch {
    let feed = Feed {
        conn,
        prefix,
        queue: BTreeMap::new(),
        created: HashMap::new(),
        revision: 0,
        stream: None,
        read: true,
        gap: false,
        head: None,
        yielded: 0,
        pending: VecDeque::new(),
        wait: None,
        backoff: FIRST_BACKOFF,
    };
    futures::stream::unfold(feed, |mut feed| async move {
        let item = feed.next().await;
        Some((item, feed))
    })
    .boxed()
}

/// One key of the queue.
struct Queued {
    mode: LeaseMode,
    marked: bool,
    label: String,
}

struct Feed {
    conn: Conn,
    prefix: Vec<u8>,
    /// The lock's keys as of `revision`, by create revision.
    queue: BTreeMap<i64, Queued>,
    /// The create revision of each key in `queue` (a delete event names
    /// only the key).
    created: HashMap<Vec<u8>, i64>,
    /// Every revision up to this one is applied to `queue`.
    revision: i64,
    stream: Option<WatchStream>,
    /// `queue` is to be read afresh (at the start, or after the watch's
    /// history was compacted away).
    read: bool,
    /// The fresh read follows history that was lost.
    gap: bool,
    /// The create revision of the holder as of `revision`.
    head: Option<i64>,
    /// The fence of the last holder yielded: each is yielded once.
    yielded: u64,
    pending: VecDeque<Result<HolderInfo>>,
    /// Wait this long before the next call to etcd (after a failure).
    wait: Option<Duration>,
    backoff: Duration,
}

impl Feed {
    async fn next(&mut self) -> Result<HolderInfo> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return item;
            }
            if let Some(wait) = self.wait.take() {
                tokio::time::sleep(wait).await;
            }
            if self.read {
                if let Err(e) = self.read_queue().await {
                    self.failed();
                    return Err(e);
                }
                continue;
            }
            let Some(stream) = self.stream.as_mut() else {
                if let Err(e) = self.open().await {
                    self.failed();
                    return Err(e);
                }
                continue;
            };
            match stream.message().await {
                Ok(Some(resp)) => {
                    self.backoff = FIRST_BACKOFF;
                    self.apply(resp);
                }
                other => {
                    // Resumed from the revision after the last one applied:
                    // nothing is lost while etcd keeps that history.
                    tracing::debug!(?other, "etcd holder watch stream ended; resuming it");
                    self.stream = None;
                    self.failed();
                }
            }
        }
    }

    /// Waits before the next call, longer after each failure in a row.
    fn failed(&mut self) {
        self.wait = Some(self.backoff);
        self.backoff = (self.backoff * 2).min(LAST_BACKOFF);
    }

    /// Reads the whole queue, at one revision, and watches from the next.
    async fn read_queue(&mut self) -> Result<()> {
        let options = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend);
        let prefix = self.prefix.clone();
        let resp = self
            .conn
            .call("holder watch read", |mut c| {
                let (p, o) = (prefix.clone(), options.clone());
                async move { c.get(p, Some(o)).await }
            })
            .await?;
        let known = self.head;
        self.queue.clear();
        self.created.clear();
        for kv in resp.kvs() {
            self.put(kv.key(), kv.create_revision(), kv);
        }
        self.revision = resp.header().map_or(0, |h| h.revision());
        self.stream = None;
        self.read = false;
        if std::mem::take(&mut self.gap) && !known.is_some_and(|rev| self.queue.contains_key(&rev)) {
            self.pending.push_back(Err(Error::backend(
                STORE,
                true,
                format!(
                    "etcd compacted the history this watch needed (up to revision {}): lock holders may have been missed",
                    self.revision
                ),
            )));
        }
        self.note_holder();
        Ok(())
    }

    /// Opens the watch from the revision after the last one applied.
    async fn open(&mut self) -> Result<()> {
        let options = WatchOptions::new().with_prefix().with_start_revision(self.revision + 1).with_progress_notify();
        let prefix = self.prefix.clone();
        let stream = self
            .conn
            .call("holder watch", |mut c| {
                let (p, o) = (prefix.clone(), options.clone());
                async move { c.watch(p, Some(o)).await }
            })
            .await?;
        self.stream = Some(stream);
        Ok(())
    }

    fn put(&mut self, key: &[u8], create_revision: i64, kv: &etcd_client::KeyValue) {
        let entry = entry_of(kv);
        self.created.insert(key.to_vec(), create_revision);
        let queued = Queued { mode: entry.mode, marked: entry.marked, label: entry.label };
        self.queue.insert(create_revision, queued);
    }

    fn apply(&mut self, resp: WatchResponse) {
        if resp.canceled() {
            if resp.compact_revision() > 0 {
                tracing::debug!(
                    compacted = resp.compact_revision(),
                    "etcd holder watch compacted away; reading afresh"
                );
                (self.read, self.gap) = (true, true);
            } else {
                tracing::debug!(reason = resp.cancel_reason(), "etcd holder watch cancelled; resuming it");
                self.failed();
            }
            self.stream = None;
            return;
        }
        if resp.events().is_empty() {
            // A progress notification vouches for every revision up to its
            // own; the creation's answer does not (it may be ahead of a
            // watch that starts in the past).
            if !resp.created() {
                self.revision = self.revision.max(resp.header().map_or(0, |h| h.revision()));
            }
            return;
        }
        let mut at = 0;
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            // Every event of one revision is applied before the holder is
            // read: within a transaction nobody holds.
            if at != 0 && kv.mod_revision() != at {
                self.note_holder();
            }
            at = kv.mod_revision();
            match event.event_type() {
                EventType::Put => self.put(kv.key(), kv.create_revision(), kv),
                EventType::Delete => {
                    if let Some(rev) = self.created.remove(kv.key()) {
                        self.queue.remove(&rev);
                    }
                }
            }
        }
        self.note_holder();
        self.revision = self.revision.max(at);
    }

    /// Queues the exclusive holder of the queue as it stands, if it is new.
    fn note_holder(&mut self) {
        let admitted = crate::backend::admission::holding_in_queue(self.queue.values().map(|q| (q.mode, q.marked)));
        let holder = self.queue.iter().take(admitted).find(|(_, q)| q.mode.is_exclusive());
        self.head = holder.map(|(rev, _)| *rev);
        let Some((rev, q)) = holder else { return };
        let fence = (*rev).max(0) as u64;
        if fence > self.yielded {
            self.yielded = fence;
            let holder = HolderInfo { label: q.label.clone(), fence, ttl_left: None, weight: 1 };
            self.pending.push_back(Ok(holder));
        }
    }
}
