//! The holder watch of one key ([`Backend::watch_holders`](crate::backend::Backend::watch_holders)):
//! a persistent recursive watch on the key's parent node, on a session of
//! its own, from which the queue's node names are replayed.
//!
//! The watch is added before the queue is listed, so no change after the
//! listing is missed; a creation event of a node whose sequence number is
//! below the parent's child version at the listing was in the listing
//! already, and is skipped. When the head of the queue changes to an
//! exclusive node, its data and creation zxid (the fence) are read: a node
//! deleted before that read answers was a term that cannot be told any
//! more, and is yielded as an error.
//!
//! ZooKeeper may drop a persistent watch's events across a disconnection
//! (ZOOKEEPER-4698), and a new session starts without them: the queue is
//! listed again, and unless the holder known before is still there, or the
//! parent's child version shows no change this watch did not see, an error
//! says holders may have been missed. A session of its own keeps the watch
//! apart from the client's waiters' one-shot watches on the same path
//! (ZOOKEEPER-4466), and from the client's session's fate.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use zookeeper_client as zk;

use super::nodes::{self, NodeKind};
use super::session::{Session, Sessions};
use super::{STORE, ZkBackend, map_err, timed};
use crate::backend::{HolderInfo, HolderWatch};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::LockKey;

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const LAST_BACKOFF: Duration = Duration::from_secs(1);

/// The holder watch of `key`.
pub(super) fn watch(backend: ZkBackend, key: &LockKey) -> HolderWatch {
    let feed = Feed {
        parent: backend.parent_of(key.as_str()),
        backend,
        sessions: Arc::default(),
        on: None,
        queue: HashSet::new(),
        listed: 0,
        changes: None,
        read: true,
        check_gap: false,
        disconnected: false,
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

struct Feed {
    backend: ZkBackend,
    parent: String,
    /// This watch's own session (see the module docs).
    sessions: Arc<Sessions>,
    /// The session and the watch on it, once added.
    on: Option<(Arc<Session>, zk::PersistentWatcher)>,
    /// The names of the queue's nodes, replayed from the events.
    queue: HashSet<String>,
    /// The parent's child version at the last listing: nodes numbered
    /// below it were in that listing.
    listed: i64,
    /// The parent's child version as the events seen so far tell it
    /// (`None`: no parent at the last listing).
    changes: Option<i64>,
    /// The queue is to be listed again.
    read: bool,
    /// The next listing follows a stretch whose events may be lost.
    check_gap: bool,
    /// The session is disconnected: events may be lost until it is back.
    disconnected: bool,
    /// The exclusive node at the head of the queue, as far as known.
    head: Option<String>,
    /// The fence of the last holder yielded: each is yielded once.
    yielded: u64,
    pending: VecDeque<Result<HolderInfo>>,
    /// Wait this long before the next call (after a failure).
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
            if self.on.is_none() {
                if let Err(e) = self.start().await {
                    self.failed();
                    return Err(e);
                }
            }
            if self.read {
                if let Err(e) = self.list().await {
                    self.failed();
                    return Err(e);
                }
                continue;
            }
            let Some((session, watcher)) = self.on.as_mut() else { continue };
            let event = tokio::select! {
                event = watcher.changed() => Some(event),
                // Disconnected too long: a new session, a new watch.
                _ = session.lost.cancelled() => None,
            };
            match event {
                Some(event) => self.apply(event).await,
                None => self.restart(),
            }
        }
    }

    fn failed(&mut self) {
        self.wait = Some(self.backoff);
        self.backoff = (self.backoff * 2).min(LAST_BACKOFF);
    }

    /// Drops the session's watch; the next turn adds one on a live session
    /// and lists the queue, checking for a gap.
    fn restart(&mut self) {
        self.on = None;
        (self.read, self.check_gap) = (true, true);
    }

    /// Adds the watch on a live session of this watch's own.
    async fn start(&mut self) -> Result<()> {
        let config = &self.backend.inner.config;
        let session = self.sessions.get(config).await?;
        session.ready()?;
        let mode = zk::AddWatchMode::PersistentRecursive;
        let watcher =
            timed(config.timeout, "watch", session.client.watch(&self.parent, mode)).await?.map_err(map_err)?;
        self.on = Some((session, watcher));
        self.read = true;
        self.disconnected = false;
        Ok(())
    }

    /// Lists the queue (after the watch was added, so nothing after the
    /// listing is missed) and notes its holder.
    async fn list(&mut self) -> Result<()> {
        let Some((session, _)) = &self.on else { return Ok(()) };
        let session = session.clone();
        session.ready()?;
        let timeout = self.backend.inner.config.timeout;
        let (children, cversion) = match timed(timeout, "list", session.client.get_children(&self.parent)).await? {
            Ok((children, stat)) => (nodes::queue_nodes(children), Some(i64::from(stat.cversion))),
            Err(zk::Error::NoNode) => (Vec::new(), None),
            Err(e) => return Err(map_err(e)),
        };
        let known_holds = self.head.as_ref().is_some_and(|h| children.contains(h));
        if std::mem::take(&mut self.check_gap) && !known_holds && cversion != self.changes {
            self.pending.push_back(Err(Error::backend(
                STORE,
                true,
                "ZooKeeper may have dropped this watch's events (disconnected, or a new session): lock holders may have been missed",
            )));
        }
        self.queue = children.into_iter().collect();
        self.listed = cversion.unwrap_or(0);
        self.changes = cversion;
        self.read = false;
        self.note_holder(&session).await;
        Ok(())
    }

    async fn apply(&mut self, event: zk::WatchedEvent) {
        let Some((session, _)) = &self.on else { return };
        let session = session.clone();
        match event.event_type {
            zk::EventType::Session => match event.session_state {
                zk::SessionState::SyncConnected => {
                    if std::mem::take(&mut self.disconnected) {
                        (self.read, self.check_gap) = (true, true);
                    }
                }
                // Never wait on the watch after a terminal state: it panics.
                state if state.is_terminated() => self.restart(),
                _ => self.disconnected = true,
            },
            // Every join writes the parent's (empty) data to learn its
            // child count: nothing to read.
            zk::EventType::NodeDataChanged if event.path == self.parent => {}
            // The container came or went: list it again (nothing was lost,
            // events come in order).
            _ if event.path == self.parent => self.read = true,
            zk::EventType::NodeCreated => {
                let Some(name) = self.child(&event.path) else { return };
                let Some(seq) = nodes::sequence_of(&name) else { return };
                if nodes::by_sequence(vec![name.clone()]).is_err() {
                    // Past the wrap of the parent's child version, names do
                    // not tell the order: list the queue (ordered by zxid).
                    self.read = true;
                } else if seq >= self.listed && self.queue.insert(name) {
                    self.changes = self.changes.map(|c| c + 1);
                    self.note_holder(&session).await;
                }
            }
            zk::EventType::NodeDeleted => {
                let Some(name) = self.child(&event.path) else { return };
                if self.queue.remove(&name) {
                    self.changes = self.changes.map(|c| c + 1);
                    self.note_holder(&session).await;
                }
            }
            _ => {}
        }
    }

    /// The name of a direct child of the parent at `path`.
    fn child(&self, path: &str) -> Option<String> {
        let name = path.strip_prefix(self.parent.as_str())?.strip_prefix('/')?;
        (!name.contains('/')).then(|| name.to_owned())
    }

    /// Reads the head of the queue if it is a new exclusive node, and
    /// queues it as a holder (or, if it is gone already, the error that
    /// says a term was missed).
    async fn note_holder(&mut self, session: &Session) {
        let ordered = match nodes::by_sequence(self.queue.iter().cloned().collect()) {
            Ok(ordered) => ordered,
            Err(_) => match self.backend.queue(session, &self.parent).await {
                Ok(ordered) => ordered,
                Err(e) => return self.pending.push_back(Err(e)),
            },
        };
        let exclusive = |n: &&String| matches!(nodes::kind_of(n), NodeKind::Exclusive | NodeKind::Writer);
        let head = ordered.first().filter(exclusive).cloned();
        if head == self.head {
            return;
        }
        self.head = head.clone();
        let Some(name) = head else { return };
        let path = super::ops::path_of(&self.parent, &name);
        let timeout = self.backend.inner.config.timeout;
        let failure = match timed(timeout, "read holder", session.client.get_data(&path)).await {
            Ok(Ok((data, stat))) => {
                let fence = stat.czxid.max(0) as u64;
                if fence > self.yielded {
                    self.yielded = fence;
                    let holder = HolderInfo { label: nodes::label_of(&data), fence, ttl_left: None, weight: 1 };
                    self.pending.push_back(Ok(holder));
                }
                return;
            }
            Ok(Err(zk::Error::NoNode)) => {
                let missed = format!("lock holder {name} was gone before its term could be read: a term was missed");
                return self.pending.push_back(Err(Error::backend(STORE, true, missed)));
            }
            Ok(Err(e)) => map_err(e),
            Err(e) => e,
        };
        // Not read: list the queue again, which reads the head again.
        (self.head, self.read) = (None, true);
        self.pending.push_back(Err(failure));
    }
}
