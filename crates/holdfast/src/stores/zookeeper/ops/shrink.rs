//! Shrinking a held lease in place ([`Backend::shrink`]) on ZooKeeper.
//!
//! A node's name tells its kind and weight (`wr-…`, `sh4-…`), which every
//! waiter reads from the listing alone, and ZooKeeper cannot rename a node.
//! So the node is replaced in one atomic `multi`: delete it (at the version
//! read) and create an ephemeral node of the smaller kind with the **same
//! sequence number**, on the same session. The queue is ordered by sequence
//! number, so the new node has the old one's place: no waiter can be ahead
//! of it, and nobody sees the key without it (the multi is one step). Its
//! data carries the old grant's fence (its `czxid`), which stays the fence.
//! The delete wakes the waiter that watched the old node, as a release does.
//!
//! Past the wrap of the parent's child version the queue is ordered by
//! creation, where a new node would lose its place: there the shrink is
//! refused with a typed error (see `docs.md`).
//!
//! [`Backend::shrink`]: crate::backend::Backend::shrink

use zookeeper_client as zk;

use super::{Node, path_of};
use crate::backend::LeaseMode;
use crate::backend::admission::{self, Shrink};
use crate::stores::zookeeper::{STORE, ZkBackend, map_err, nodes, timed};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

/// How often a shrink that lost a race to a change of its node reads again.
const RACES: usize = 8;

impl ZkBackend {
    /// [`Backend::shrink`](crate::backend::Backend::shrink).
    ///
    /// # Cancel safety
    ///
    /// One multi: dropped, the node was replaced or not; this client's
    /// record of it follows only a confirmed replacement (a release after a
    /// lost reply finds the new node by its token).
    pub(in crate::stores::zookeeper) async fn shrink_node(
        &self,
        key: &LockKey,
        token: OwnerToken,
        to: LeaseMode,
    ) -> Result<bool> {
        let Some(a) = self.attempt_of(token).filter(|a| a.granted && a.key == key.as_str()) else { return Ok(false) };
        let Some(s) = self.inner.sessions.live().filter(|s| s.id == a.session) else { return Ok(false) };
        let Some(node) = a.node else { return Ok(false) };
        let parent = self.parent_of(key.as_str());
        let (old, budget) = (path_of(&parent, &node.name), self.cfg().timeout);
        for _ in 0..RACES {
            s.ready()?;
            let (data, stat) = match timed(budget, "get", s.client.get_data(&old)).await? {
                Ok(read) => read,
                Err(zk::Error::NoNode) => return Ok(false),
                Err(e) => return Err(map_err(e)),
            };
            let held = nodes::kind_of(&node.name).mode(nodes::limit_of(&data).unwrap_or(0));
            let smaller = match admission::shrunk(held, to) {
                Ok(mode) => mode,
                Err(reason) => return Shrink::NotSmaller(reason).answer(),
            };
            let Some(name) = nodes::renamed(&node.name, token, smaller) else {
                return Err(Error::backend(
                    STORE,
                    false,
                    "this lock's queue is past the wrap of its sequence numbers, where a node replaced in place \
                     would lose its place: release the lease and acquire the smaller one",
                ));
            };
            let fence = nodes::fence_of(&data, stat.czxid);
            let limit = smaller.limit().unwrap_or(1);
            let new_data = nodes::shrunk_data(token, limit, fence, &nodes::label_of(&data));
            let acls = nodes::acls(self.cfg().credentials.is_some());
            let ephemeral = zk::CreateMode::Ephemeral.with_acls(acls);
            let mut multi = s.client.new_multi_writer();
            multi.add_delete(&old, Some(stat.version)).map_err(map_err)?;
            multi.add_create(&path_of(&parent, &name), &new_data, &ephemeral).map_err(map_err)?;
            match tokio::time::timeout(budget, multi.commit()).await {
                Err(_) => {
                    return Err(Error::backend(STORE, true, format!("ZooKeeper shrink timed out after {budget:?}")));
                }
                Ok(Ok(_)) => {
                    self.replaced(token, Node { name, czxid: node.czxid });
                    return Ok(true);
                }
                // Rewritten since the read (a resize, a mark): read again.
                Ok(Err(zk::MultiWriteError::OperationFailed { source: zk::Error::BadVersion, .. })) => {}
                Ok(Err(zk::MultiWriteError::OperationFailed { source: zk::Error::NoNode, .. })) => return Ok(false),
                Ok(Err(e)) => return Err(map_err(e.into())),
            }
        }
        Err(Error::backend(STORE, true, "the grant's node kept changing while it was shrunk"))
    }

    /// Records that `token`'s granted node was replaced by `node`.
    fn replaced(&self, token: OwnerToken, node: Node) {
        if let Some(a) = self.inner.attempts.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&token.as_u128()) {
            a.node = Some(node);
        }
    }
}
