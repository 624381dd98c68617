//! The store calls: queue nodes created, found again, watched and deleted;
//! renewal and status.

use std::sync::atomic::Ordering;
use std::time::Instant;

use zookeeper_client as zk;

mod join;
mod shrink;

use super::{STORE, Session, ZkBackend, map_err, nodes, timed};
use crate::backend::{AcquireRequest, Grant, RenewRequest};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

/// What this client knows of one token's queue node, from just before it
/// asks ZooKeeper to create it until the store confirmed the node gone (or
/// the session that owns it ended).
#[derive(Debug, Clone)]
pub(super) struct Attempt {
    key: String,
    /// The session the node was (or is being) created on.
    session: i64,
    /// The node, once a reply named it; `None` while a create may be in
    /// flight or its reply was lost (a listing then finds it by token).
    node: Option<Node>,
    /// The node was first in line on a session that vouched for it.
    granted: bool,
}

/// A queue node of this client.
#[derive(Debug, Clone)]
struct Node {
    name: String,
    czxid: i64,
}

/// A queue node just created, and the queue if its create showed it.
struct Created {
    node: Node,
    /// The queue, when the create's transaction showed the new node alone
    /// in it, with the instant before the create was sent; `None` when the
    /// queue is to be listed.
    listed: Option<(Instant, Vec<String>)>,
}

/// Leases looked up per hold of the attempts' lock in a renewal.
const LOOKUP_CHUNK: usize = 1024;

pub(super) fn path_of(parent: &str, name: &str) -> String {
    format!("{parent}/{name}")
}

impl ZkBackend {
    pub(super) fn parent_of(&self, key: &str) -> String {
        nodes::parent_path(&self.cfg().root, key)
    }

    fn attempt_of(&self, token: OwnerToken) -> Option<Attempt> {
        self.inner.attempts.lock().unwrap_or_else(|p| p.into_inner()).get(&token.as_u128()).cloned()
    }

    /// Records the attempt of `req.token` on session `session`, keeping
    /// whether it was granted if the node stays the same.
    fn record(&self, req: &AcquireRequest, session: i64, node: Option<Node>) {
        let mut attempts = self.inner.attempts.lock().unwrap_or_else(|p| p.into_inner());
        let granted = attempts.get(&req.token.as_u128()).is_some_and(|a| {
            a.granted && a.session == session && a.node.as_ref().map(|n| &n.name) == node.as_ref().map(|n| &n.name)
        });
        let key = req.key.as_str().to_owned();
        attempts.insert(req.token.as_u128(), Attempt { key, session, node, granted });
    }

    /// The path of `token`'s node of `key` if it holds a grant on the live session.
    pub(super) fn granted_path(&self, key: &LockKey, token: OwnerToken) -> Option<String> {
        let a = self.attempt_of(token).filter(|a| a.granted && a.key == key.as_str())?;
        let live = self.inner.sessions.live()?;
        let node = a.node.filter(|_| a.session == live.id)?;
        Some(path_of(&self.parent_of(&a.key), &node.name))
    }

    fn mark_granted(&self, token: OwnerToken) {
        if let Some(a) = self.inner.attempts.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&token.as_u128()) {
            a.granted = true;
        }
    }

    fn forget(&self, token: OwnerToken) {
        self.inner.attempts.lock().unwrap_or_else(|p| p.into_inner()).remove(&token.as_u128());
        self.remember_forgotten(token);
    }

    /// The queue nodes of `parent`, unordered; empty if the parent is gone.
    async fn children(&self, s: &Session, parent: &str) -> Result<Vec<String>> {
        match timed(self.cfg().timeout, "list", s.client.list_children(parent)).await? {
            Ok(children) => Ok(nodes::queue_nodes(children)),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(map_err(e)),
        }
    }

    /// The queue of `parent` in grant order; empty if the parent is gone.
    pub(super) async fn queue(&self, s: &Session, parent: &str) -> Result<Vec<String>> {
        let children = self.children(s, parent).await?;
        self.order(s, parent, children).await
    }

    /// Puts queue nodes in grant order: by their sequence numbers while
    /// those are unique, otherwise (past the wrap of the parent's 32-bit
    /// child version, see `nodes.rs`) by creation zxid, asked of the server
    /// for every node in one pipelined round trip.
    async fn order(&self, s: &Session, parent: &str, children: Vec<String>) -> Result<Vec<String>> {
        let names = match nodes::by_sequence(children) {
            Ok(queue) => return Ok(queue),
            Err(names) => names,
        };
        let stats = names.iter().map(|n| s.client.check_stat(&path_of(parent, n))).collect::<Vec<_>>();
        let stats = timed(self.cfg().timeout, "stat queue", futures::future::try_join_all(stats)).await?;
        let created = names.into_iter().zip(stats.map_err(map_err)?).filter_map(|(n, st)| Some((st?.czxid, n)));
        Ok(nodes::by_creation(created.collect()))
    }

    /// Deletes one node; `Ok(false)` if it was not there (or not ours to delete).
    async fn delete(&self, s: &Session, path: &str) -> Result<bool> {
        match timed(self.cfg().timeout, "delete", s.client.delete(path, None)).await? {
            Ok(()) => Ok(true),
            Err(zk::Error::NoNode | zk::Error::NoAuth) => Ok(false),
            Err(e) => Err(map_err(e)),
        }
    }

    /// Deletes every node of `token` under `parent`; true if any was there.
    /// Normally one node; more only if an attempt moved to a new session
    /// before its old one ended.
    async fn delete_token_nodes(&self, s: &Session, parent: &str, token: OwnerToken) -> Result<bool> {
        let mut deleted = false;
        for name in self.children(s, parent).await?.iter().filter(|n| nodes::is_of_token(n, token)) {
            deleted |= self.delete(s, &path_of(parent, name)).await?;
        }
        Ok(deleted)
    }

    /// Finds `token`'s node on session `s` after a call whose outcome was not
    /// seen (a lost reply, an error, a new session). A node left on an
    /// earlier session of this client is deleted: that session was
    /// abandoned, and its node would only hold the new one's place.
    async fn find_own(&self, s: &Session, parent: &str, token: OwnerToken) -> Result<Option<Node>> {
        let mut found = None;
        for name in self.children(s, parent).await?.into_iter().filter(|n| nodes::is_of_token(n, token)) {
            let path = path_of(parent, &name);
            match timed(self.cfg().timeout, "stat", s.client.check_stat(&path)).await?.map_err(map_err)? {
                Some(st) if st.ephemeral_owner == s.id && found.is_none() => {
                    found = Some(Node { name, czxid: st.czxid })
                }
                Some(_) => {
                    self.delete(s, &path).await?;
                }
                None => {}
            }
        }
        Ok(found)
    }

    /// One acquisition on the current session: find or create the token's
    /// node, then (waiting) watch the node just before it until it is
    /// first. Store failures, a disconnection and a lost session are
    /// returned at once as retryable errors; the next call with the same
    /// token finds its node again (same session) or queues anew (new
    /// session), never leaving two.
    pub(super) async fn attempt(&self, req: &AcquireRequest, wait: bool) -> Result<Option<Grant>> {
        let s = self.session().await?;
        s.ready()?;
        let parent = self.parent_of(req.key.as_str());
        let prior = self.attempt_of(req.token).filter(|a| a.key == req.key.as_str());
        let found = match &prior {
            Some(Attempt { session, node: Some(node), .. }) if *session == s.id => Some(node.clone()),
            Some(_) => self.find_own(&s, &parent, req.token).await?,
            // Busy: answered without writing anything. (A share may be
            // admitted on a busy key: it joins the queue to find out.)
            None if !wait && req.mode.is_exclusive() && !self.children(&s, &parent).await?.is_empty() => {
                return Ok(None);
            }
            None => None,
        };
        let created = found.is_none();
        let (mine, mut listed) = match found {
            Some(node) => {
                self.record(req, s.id, Some(node.clone()));
                (node, None)
            }
            None => {
                // Recorded before the create is sent, so that a release after
                // a lost reply or a dropped future looks for the node.
                self.record(req, s.id, None);
                let list_too = wait && self.crowded(req.key.as_str());
                let created = self.create_node(&s, &parent, req, list_too).await?;
                self.record(req, s.id, Some(created.node.clone()));
                (created.node, created.listed)
            }
        };
        let share = !req.mode.is_exclusive();
        // A share's limit as stored: a resize may rewrite it while it waits.
        let mut limit = req.mode.limit().unwrap_or(1);
        let mut joined = share && created;
        // Our node's data and version as last read (a share's).
        let mut own_seen: Option<(Vec<u8>, i32)> = None;
        // A children watch set by the listing to be checked next.
        let mut armed: Option<(zk::OneshotWatcher, zk::StateWatcher)> = None;
        loop {
            let own = path_of(&parent, &mine.name);
            let (observed, queue) = match listed.take() {
                Some((sent, children)) => (sent, self.order(&s, &parent, children).await?),
                None if share => {
                    // A share reads its own limit with the queue: a resize
                    // may have rewritten it while it waited.
                    s.ready()?;
                    let sent = Instant::now();
                    let (queue, data) = tokio::join!(self.queue(&s, &parent), self.data_of(&s, &own));
                    if let Some((data, version)) = data? {
                        limit = nodes::limit_of(&data).unwrap_or(limit);
                        own_seen = Some((data, version));
                    }
                    (sent, queue?)
                }
                None => {
                    s.ready()?;
                    let sent = Instant::now();
                    (sent, self.queue(&s, &parent).await?)
                }
            };
            let Some(pos) = queue.iter().position(|n| *n == mine.name) else {
                // Deleted under a live session (by hand, or by another client
                // of the same identity): a next call queues anew.
                self.forget(req.token);
                return Err(Error::backend(STORE, true, "this attempt's queue node vanished"));
            };
            if std::mem::take(&mut joined) {
                // Our own data (its limit, rewritten if a resize came
                // between the join and its listing) read beside the limit
                // of the shares ahead.
                let read_own = async {
                    if own_seen.is_none() && queue.len() > 1 { self.data_of(&s, &own).await } else { Ok(None) }
                };
                let (conflict, data) =
                    tokio::join!(self.limit_conflict(&s, &parent, &queue[..pos], req.mode), read_own);
                if let Some((data, version)) = data? {
                    limit = nodes::limit_of(&data).unwrap_or(limit);
                    own_seen = Some((data, version));
                }
                if let Some(reason) = conflict? {
                    self.delete(&s, &path_of(&parent, &mine.name)).await?;
                    self.forget(req.token);
                    return Err(Error::Conflict { key: req.key.to_string(), reason });
                }
            }
            self.note_queue(req.key.as_str(), &queue); // lanes.rs
            if nodes::admitted(&queue[..=pos], limit) > pos {
                // Believe a grant only on a session that vouches for it.
                if !s.vouches() {
                    return Err(Error::backend(STORE, true, "ZooKeeper session not connected"));
                }
                self.mark_granted(req.token);
                let fence = u64::try_from(mine.czxid).map_err(|_| Error::backend(STORE, false, "negative czxid"))?;
                if share && queue.len() > pos + 1 {
                    // A share behind us may be waiting for our turn to come
                    // (one that joins later reads us as admitted).
                    self.mark_holding(&s, &own, own_seen.as_ref()).await;
                }
                return Ok(Some(Grant {
                    fence,
                    attempt_started: observed,
                    valid_for: req.ttl.min(s.lease_bound()),
                    session_lost: Some(s.lost.clone()),
                }));
            }
            if !wait {
                self.delete(&s, &path_of(&parent, &mine.name)).await?;
                self.forget(req.token);
                return Ok(None);
            }
            let (watcher, mut state) = match armed.take() {
                Some(pair) => pair,
                None => {
                    // Armed before the check, so no state change is missed.
                    let state = s.client.state_watcher();
                    s.ready()?;
                    // An exclusive node waits for the node before it; a share
                    // for the newest exclusive node ahead (readers behind a
                    // writer wake when it goes). Behind shares only, the first
                    // share that waits (the head waiter) waits for any change
                    // of the queue, read again with its watch set; each share
                    // behind it for its predecessor alone, which marks its node
                    // when admitted (or goes): a release wakes the head waiter
                    // and the shares it admits one after another, not every
                    // waiter of the key.
                    let mut before = if share {
                        let writer =
                            queue[..pos].iter().rev().find(|n| !matches!(nodes::kind_of(n), nodes::NodeKind::Share(_)));
                        writer.or_else(|| (nodes::admitted(&queue[..pos], limit) < pos).then(|| &queue[pos - 1]))
                    } else {
                        Some(&queue[pos - 1])
                    };
                    let mut pred_watch = None;
                    if let Some(pred) = before.filter(|p| matches!(nodes::kind_of(p), nodes::NodeKind::Share(_))) {
                        let path = path_of(&parent, pred);
                        match timed(self.cfg().timeout, "watch", s.client.get_and_watch_data(&path)).await? {
                            // Marked since our read (or holding above a
                            // lowered limit): we are the head waiter.
                            Ok((data, _, _)) if nodes::marked_of(&data) => before = None,
                            Ok((_, _, watcher)) => pred_watch = Some(watcher),
                            Err(zk::Error::NoNode) => continue,
                            Err(e) => return Err(map_err(e)),
                        }
                    }
                    let Some(before) = before else {
                        let sent = Instant::now();
                        let (children, data) = tokio::time::timeout(self.cfg().timeout, async {
                            tokio::join!(s.client.list_and_watch_children(&parent), s.client.get_data(&own))
                        })
                        .await
                        .map_err(|_| Error::backend(STORE, true, "ZooKeeper list timed out"))?;
                        let (children, watcher) = children.map_err(map_err)?;
                        if let Ok((data, stat)) = data {
                            limit = nodes::limit_of(&data).unwrap_or(limit);
                            own_seen = Some((data, stat.version));
                        }
                        listed = Some((sent, children));
                        armed = Some((watcher, state));
                        continue;
                    };
                    if let Some(watcher) = pred_watch {
                        (watcher, state)
                    } else {
                        let watched = timed(
                            self.cfg().timeout,
                            "watch",
                            s.client.check_and_watch_stat(&path_of(&parent, before)),
                        )
                        .await?;
                        let (stat, watcher) = watched.map_err(map_err)?;
                        if stat.is_none() {
                            continue;
                        }
                        (watcher, state)
                    }
                }
            };
            tokio::select! {
                _ = watcher.changed() => {}
                // Disconnected or lost: the next turn of the loop says so.
                _ = state.changed() => {}
                _ = s.lost.cancelled() => {}
                _ = tokio::time::sleep(self.cfg().poll) => {}
            }
        }
    }

    /// Deletes `token`'s node under `key`: one round trip when this client
    /// knows the node. The attempt is forgotten only once the store
    /// confirmed the node gone, or its session ended; a failure while the
    /// session lives is a retryable error, and the client retries.
    pub(super) async fn release_token(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        let attempt = self.attempt_of(token).filter(|a| a.key == key.as_str());
        let Some(s) = self.inner.sessions.live() else {
            // Every node of this client is on a session it abandoned, which
            // the ensemble ends (closed, or expired) with its nodes.
            self.forget(token);
            return Ok(false);
        };
        let parent = self.parent_of(key.as_str());
        let outcome = async {
            s.ready()?;
            match &attempt {
                Some(a) if a.session == s.id => match &a.node {
                    Some(node) => Ok(self.delete(&s, &path_of(&parent, &node.name)).await? && a.granted),
                    None => Ok(self.delete_token_nodes(&s, &parent, token).await? && a.granted),
                },
                // No attempt of this client (a forged or foreign token finds
                // nothing), or one on an abandoned session, whose node would
                // go with it: delete it now so that the key frees at once.
                _ => self.delete_token_nodes(&s, &parent, token).await.map(|_| false),
            }
        }
        .await;
        match outcome {
            Ok(held) => {
                self.forget(token);
                Ok(held)
            }
            Err(_) if s.ended() => {
                self.forget(token);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Hears from the server, in one request, that the session holding the
    /// leases lives: a stat of one held node (a different one each call),
    /// answered on the session. A lease is held if its node was granted on
    /// the current session, and the probed one if it still exists.
    pub(super) async fn renew_leases(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        let Some(s) = self.inner.sessions.live() else { return Ok(vec![false; leases.len()]) };
        // Which leases hold a node on the live session, looked up in place
        // (no copies, no paths) a chunk per hold of the attempts' lock, so
        // the client's acquires and releases never wait for a whole tick.
        let mut held = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(LOOKUP_CHUNK) {
            {
                let attempts = self.inner.attempts.lock().unwrap_or_else(|p| p.into_inner());
                held.extend(chunk.iter().map(|l| {
                    attempts
                        .get(&l.token.as_u128())
                        .is_some_and(|a| a.granted && a.session == s.id && a.key == l.key.as_str() && a.node.is_some())
                }));
            }
            tokio::task::yield_now().await;
        }
        let candidates: Vec<usize> = (0..held.len()).filter(|&i| held[i]).collect();
        if candidates.is_empty() {
            return Ok(held);
        }
        s.ready()?;
        let probe = candidates[self.inner.renewals.fetch_add(1, Ordering::Relaxed) % candidates.len()];
        // The probe's node, if its attempt is still tracked; one released
        // since the lookup is not held, and the root stands in for the
        // round trip that shows the session answering.
        let node_path = || {
            self.attempt_of(leases[probe].token).and_then(|a| a.node.map(|n| path_of(&self.parent_of(&a.key), &n.name)))
        };
        let node = node_path();
        let path = node.as_deref().unwrap_or(&self.cfg().root);
        let stat = timed(self.cfg().timeout, "renew", s.client.check_stat(path)).await?.map_err(map_err)?;
        // A shrink replaces the node by one of another name on the same
        // session, in one multi (ops/shrink.rs): a probe that read the old
        // name finds it gone, even after the reply (this client records the
        // new name only once the multi's reply is back). The token's node
        // is then looked for among the key's nodes, whose names carry it.
        let mut replaced = false;
        if stat.is_none() && node.is_some() {
            if let Some(a) = self.attempt_of(leases[probe].token) {
                let parent = self.parent_of(&a.key);
                replaced = match timed(self.cfg().timeout, "renew", s.client.get_children(&parent)).await? {
                    Ok((children, _)) => children.iter().any(|c| nodes::is_of_token(c, leases[probe].token)),
                    Err(zk::Error::NoNode) => false,
                    Err(e) => return Err(map_err(e)),
                };
            }
        }
        if !s.vouches() {
            return Err(Error::backend(STORE, true, "ZooKeeper session not connected"));
        }
        // Ephemeral nodes of this session only: a replaced node was created
        // on it too (the multi runs on the grant's session).
        held[probe] = node.is_some() && (replaced || stat.is_some_and(|st| st.ephemeral_owner == s.id));
        Ok(held)
    }
}
