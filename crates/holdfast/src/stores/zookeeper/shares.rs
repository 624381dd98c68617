//! What a key's whole queue tells, now that it may hold shares: status
//! (the admitted prefix and the waiters), resize (every share's limit
//! rewritten in one atomic multi), relabel (a holder's node data); and what
//! a share reads and writes of its own node (its limit, its conflict with
//! the shares ahead, its mark as holding).

use zookeeper_client as zk;

use super::ops::path_of;
use super::{STORE, Session, ZkBackend, map_err, nodes, timed};
use crate::backend::admission::{conflict_in_queue, holding_in_queue};
use crate::backend::{HolderInfo, LeaseMode, LockStatus};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

/// How often a resize or relabel that lost a race to a queue change reads again.
const RACES: usize = 8;

fn late(what: &str) -> Error {
    Error::backend(STORE, true, format!("ZooKeeper {what} timed out"))
}

fn is_share(name: &str) -> bool {
    matches!(nodes::kind_of(name), nodes::NodeKind::Share(_))
}

impl ZkBackend {
    /// The holders (the admitted prefix of the queue, whose data could still
    /// be read) and the waiters behind them. A share's limit is read from
    /// the oldest share's data.
    pub(super) async fn status_of(&self, key: &LockKey) -> Result<LockStatus> {
        let s = self.session().await?;
        let parent = self.parent_of(key.as_str());
        let queue = self.queue(&s, &parent).await?;
        let mut status = LockStatus::free(key);
        let mut alive: Vec<(LeaseMode, bool)> = Vec::new();
        let mut limit = None;
        let mut seen = 0;
        for name in &queue {
            let (data, stat) =
                match timed(self.cfg().timeout, "get", s.client.get_data(&path_of(&parent, name))).await? {
                    Ok(read) => read,
                    Err(zk::Error::NoNode) => {
                        seen += 1;
                        continue;
                    }
                    Err(e) => return Err(map_err(e)),
                };
            if is_share(name) {
                limit = limit.or_else(|| nodes::limit_of(&data));
            }
            alive.push((nodes::kind_of(name).mode(limit.unwrap_or(0)), nodes::marked_of(&data)));
            if holding_in_queue(alive.iter().copied()) < alive.len() {
                break;
            }
            seen += 1;
            let kind = nodes::kind_of(name);
            let info = HolderInfo {
                label: nodes::label_of(&data),
                fence: nodes::fence_of(&data, stat.czxid),
                ttl_left: None,
                weight: kind.mode(0).weight(),
            };
            if is_share(name) {
                status.limit = limit;
                status.shared.push(info);
            } else {
                status.holder = Some(info);
                break;
            }
        }
        status.waiters = Some((queue.len() - seen) as u64);
        Ok(status)
    }

    /// Rewrites the limit in every share node of `key` (held or waiting) in
    /// one multi that checks each node's version, and returns the weight
    /// held; a multi that lost a race to a queue change reads again.
    pub(super) async fn resize_shares(&self, key: &LockKey, limit: u32) -> Result<u64> {
        let s = self.session().await?;
        let parent = self.parent_of(key.as_str());
        let budget = self.cfg().timeout;
        for _ in 0..RACES {
            s.ready()?;
            let queue = self.queue(&s, &parent).await?;
            let shares: Vec<&String> = queue.iter().filter(|n| is_share(n)).collect();
            let reads = shares.iter().map(|n| s.client.get_data(&path_of(&parent, n))).collect::<Vec<_>>();
            let reads =
                tokio::time::timeout(budget, futures::future::join_all(reads)).await.map_err(|_| late("get"))?;
            let mut present = Vec::new();
            for (name, read) in shares.into_iter().zip(reads) {
                match read {
                    Ok((data, stat)) => present.push((name.clone(), data, stat.version)),
                    Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(map_err(e)),
                }
            }
            let old = present.first().and_then(|(_, d, _)| nodes::limit_of(d)).unwrap_or(limit);
            // The queue without shares that vanished, each share with its mark.
            let alive: Vec<(&String, LeaseMode, bool)> = queue
                .iter()
                .filter_map(|n| match present.iter().find(|(p, _, _)| p == n) {
                    Some((_, data, _)) => Some((n, nodes::kind_of(n).mode(old), nodes::marked_of(data))),
                    None if is_share(n) => None,
                    None => Some((n, nodes::kind_of(n).mode(old), false)),
                })
                .collect();
            let holding = holding_in_queue(alive.iter().map(|(_, m, marked)| (*m, *marked)));
            let holders = &alive[..holding];
            let held =
                holders.iter().filter(|(_, m, _)| !m.is_exclusive()).map(|(_, m, _)| u64::from(m.weight())).sum();
            if present.is_empty() {
                return Ok(held);
            }
            let mut multi = s.client.new_multi_writer();
            for (name, data, version) in &present {
                let holds = holders.iter().any(|(n, _, _)| *n == name);
                let rewritten = nodes::rewrite(data, Some(limit), Some(holds), &nodes::label_of(data));
                multi.add_set_data(&path_of(&parent, name), &rewritten, Some(*version)).map_err(map_err)?;
            }
            match tokio::time::timeout(budget, multi.commit()).await.map_err(|_| late("resize"))? {
                Ok(_) => return Ok(held),
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::BadVersion | zk::Error::NoNode, ..
                }) => {}
                Err(e) => return Err(map_err(e.into())),
            }
        }
        Err(Error::backend(STORE, true, "the lock's queue kept changing while it was resized"))
    }

    /// Replaces the label in the data of `token`'s granted node of `key`.
    pub(super) async fn relabel_node(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        let Some(path) = self.granted_path(key, token) else { return Ok(false) };
        let s = self.session().await?;
        let budget = self.cfg().timeout;
        for _ in 0..RACES {
            s.ready()?;
            let (data, stat) = match timed(budget, "get", s.client.get_data(&path)).await? {
                Ok(read) => read,
                Err(zk::Error::NoNode) => return Ok(false),
                Err(e) => return Err(map_err(e)),
            };
            let relabelled = nodes::rewrite(&data, None, None, label);
            match timed(budget, "relabel", s.client.set_data(&path, &relabelled, Some(stat.version))).await? {
                Ok(_) => return Ok(true),
                Err(zk::Error::BadVersion) => {}
                Err(zk::Error::NoNode) => return Ok(false),
                Err(e) => return Err(map_err(e)),
            }
        }
        Err(Error::backend(STORE, true, "the grant's node kept changing while it was relabelled"))
    }
}

/// What a waiting or admitted share reads and writes of its own node.
impl ZkBackend {
    /// The data of the node at `path` and its version; `None` if it is gone.
    pub(super) async fn data_of(&self, s: &Session, path: &str) -> Result<Option<(Vec<u8>, i32)>> {
        match timed(self.cfg().timeout, "get", s.client.get_data(path)).await? {
            Ok((data, stat)) => Ok(Some((data, stat.version))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(map_err(e)),
        }
    }

    /// Marks our share's node as holding (only if it is as read), which
    /// wakes the share waiting behind it. Best effort: that share re-reads
    /// the queue at the poll interval anyway. With the node's data and
    /// version as last read (`seen`), the write is sent and not waited for:
    /// the session applies it before anything this client sends later (a
    /// release's delete among them), and a version race means a resize
    /// rewrote (and so marked) it.
    pub(super) async fn mark_holding(&self, s: &Session, own: &str, seen: Option<&(Vec<u8>, i32)>) {
        if let Some((data, version)) = seen {
            if !nodes::marked_of(data) {
                let held = nodes::rewrite(data, None, Some(true), &nodes::label_of(data));
                drop(s.client.set_data(own, &held, Some(*version)));
            }
            return;
        }
        let marked = async {
            let (data, stat) = timed(self.cfg().timeout, "get", s.client.get_data(own)).await?.map_err(map_err)?;
            if nodes::marked_of(&data) {
                return Ok(());
            }
            let held = nodes::rewrite(&data, None, Some(true), &nodes::label_of(&data));
            // A version race means a resize rewrote (and so marked) it.
            match timed(self.cfg().timeout, "set", s.client.set_data(own, &held, Some(stat.version))).await? {
                Ok(_) | Err(zk::Error::BadVersion | zk::Error::NoNode) => Ok(()),
                Err(e) => Err(map_err(e)),
            }
        };
        if let Err(err) = marked.await {
            tracing::debug!(%err, "could not mark a share as holding; the share behind it re-reads later");
        }
    }

    /// The conflict of a share just queued in `mode` with the limit of the
    /// shares `ahead` of it, read from the oldest one still there (every
    /// share of a key carries the same limit: a resize rewrites them all).
    pub(super) async fn limit_conflict(
        &self,
        s: &Session,
        parent: &str,
        ahead: &[String],
        mode: LeaseMode,
    ) -> Result<Option<String>> {
        for name in ahead.iter().filter(|n| is_share(n)) {
            if let Some((data, _)) = self.data_of(s, &path_of(parent, name)).await? {
                let held = nodes::kind_of(name).mode(nodes::limit_of(&data).unwrap_or(0));
                return Ok(conflict_in_queue(mode, [held]));
            }
        }
        Ok(None)
    }
}
