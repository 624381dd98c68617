//! Joining a lock's queue on ZooKeeper: a new node, and whether it is
//! first in line, in one request (model `zk_join` in `holdfast-models`).

use std::time::Instant;

use zookeeper_client as zk;

use super::super::{STORE, Session, ZkBackend, map_err, nodes, timed};
use super::{Created, Node};
use crate::backend::AcquireRequest;
use crate::vocabulary::error::{Error, Result};

impl ZkBackend {
    /// Creates `token`'s queue node under `parent` (creating the parent
    /// container if the server removed it) in one `multi` with an empty
    /// `setData` of the parent, whose reply is the parent's stat inside the
    /// same transaction: a child count of 1 says the new node is the only
    /// one, so first in line, without listing the queue (model `zk_join`:
    /// a count read after the create, or a sequence number two past the
    /// client's last, grants off the head). The transaction's zxid is the
    /// parent's `mzxid` and the node's `czxid` alike. With `list_too` (a
    /// waiting attempt on a key whose queue last held others) the queue is
    /// listed right behind the join, in the same round trip: the session
    /// answers in order, so the listing shows the new node.
    pub(super) async fn create_node(
        &self,
        s: &Session,
        parent: &str,
        req: &AcquireRequest,
        list_too: bool,
    ) -> Result<Created> {
        let acls = nodes::acls(self.cfg().credentials.is_some());
        let node = zk::CreateMode::EphemeralSequential.with_acls(acls);
        let container = zk::CreateMode::Container.with_acls(acls);
        let prefix = nodes::node_prefix(parent, req.token, req.mode);
        let data = nodes::node_data(req.token, req.mode, &req.label);
        let limit = self.cfg().timeout;
        for _ in 0..5 {
            let sent = Instant::now();
            let mut join = s.client.new_multi_writer();
            join.add_create(&prefix, &data, &node).map_err(map_err)?;
            join.add_set_data(parent, &[], None).map_err(map_err)?;
            // Both requests go out now, the listing behind the join (unread
            // when the join says it is alone).
            let commit = join.commit();
            let listing = list_too.then(|| s.client.list_children(parent));
            let listing = async {
                match listing {
                    Some(listed) => Some(listed.await),
                    None => None,
                }
            };
            let (joined, listing) = tokio::time::timeout(limit, async { tokio::join!(commit, listing) })
                .await
                .map_err(|_| Error::backend(STORE, true, format!("ZooKeeper create timed out after {limit:?}")))?;
            match joined.map_err(|e| match e {
                zk::MultiWriteError::OperationFailed { source, .. } => source,
                e => e.into(),
            }) {
                Ok(results) => {
                    let Some((path, parent_stat)) = created_and_parent(results) else {
                        return Err(Error::backend(STORE, true, "ZooKeeper answered a join with other results"));
                    };
                    let name = path.rsplit('/').next().unwrap_or_default().to_owned();
                    let listed = match listing {
                        _ if parent_stat.num_children == 1 => Some((sent, vec![name.clone()])),
                        Some(Ok(children)) => Some((sent, nodes::queue_nodes(children))),
                        _ => None,
                    };
                    return Ok(Created { node: Node { name, czxid: parent_stat.mzxid }, listed });
                }
                Err(zk::Error::NoNode) => {
                    match timed(limit, "create parent", s.client.create(parent, &[], &container)).await? {
                        Ok(_) | Err(zk::Error::NodeExists) => {}
                        Err(zk::Error::NoNode) => {
                            let root = zk::CreateMode::Persistent.with_acls(acls);
                            match timed(limit, "create root", s.client.mkdir(&self.cfg().root, &root)).await? {
                                Ok(()) | Err(zk::Error::NodeExists) => {}
                                Err(e) => return Err(map_err(e)),
                            }
                        }
                        Err(e) => return Err(map_err(e)),
                    }
                }
                Err(e) => return Err(map_err(e)),
            }
        }
        Err(Error::backend(STORE, true, format!("lock node {parent:?} kept vanishing while creating a waiter")))
    }
}

/// The created node's path and the parent's stat from a join's replies.
fn created_and_parent(results: Vec<zk::MultiWriteResult>) -> Option<(String, zk::Stat)> {
    match <[_; 2]>::try_from(results).ok()? {
        [zk::MultiWriteResult::Create { path, .. }, zk::MultiWriteResult::SetData { stat }] => Some((path, stat)),
        _ => None,
    }
}
