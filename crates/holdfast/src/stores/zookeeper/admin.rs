//! The admin calls on ZooKeeper: the held keys under a prefix (the lock
//! containers under the root, then each lock's status) and the forced
//! release (the nodes holding a lock deleted).

use zookeeper_client as zk;

use super::ops::path_of;
use super::{ZkBackend, map_err, nodes, timed};
use crate::backend::ForceReleased;
use crate::backend::LockStatus;
use crate::backend::admission::holding_in_queue;
use crate::vocabulary::error::Result;
use crate::vocabulary::key::LockKey;

/// The key a lock container's name encodes (`nodes::encode_key` reversed);
/// `None` for a name that is not one.
pub(super) fn decode_key(name: &str) -> Option<String> {
    let mut out = Vec::with_capacity(name.len());
    let mut bytes = name.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

impl ZkBackend {
    /// Every lock under `prefix` with a holding node. ZooKeeper cannot
    /// range over names, so this lists every lock container under the root
    /// (held keys, and keys freed within the server's container check
    /// interval, 60 s by default), then reads the status of each one under
    /// the prefix.
    pub(super) async fn list_held(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        let s = self.session().await?;
        let root = &self.cfg().root;
        let names = match timed(self.cfg().timeout, "list", s.client.list_children(root)).await? {
            Ok(names) => names,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map_err(e)),
        };
        let mut keys: Vec<String> =
            names.iter().filter_map(|n| decode_key(n)).filter(|k| k.starts_with(prefix)).collect();
        keys.sort();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let Ok(key) = LockKey::new(key) else { continue };
            let status = self.status_of(&key).await?;
            if status.holder.is_some() || !status.shared.is_empty() {
                out.push(status);
            }
        }
        Ok(out)
    }

    /// Deletes the nodes holding `key` (the queue's admitted prefix, as
    /// `status` reads it; waiting nodes stay). The next node's owner, which
    /// watches its predecessor, is woken as by a release; the next grant is
    /// a node created later, so its fence (a creation zxid) is above the
    /// removed ones. The old holder's client learns it at a renewal that
    /// probes the node (see `docs.md`).
    pub(super) async fn force(&self, key: &LockKey) -> Result<ForceReleased> {
        let s = self.session().await?;
        let parent = self.parent_of(key.as_str());
        let queue = self.queue(&s, &parent).await?;
        let mut alive = Vec::new();
        let mut limit = None;
        let mut holding = Vec::new();
        for name in &queue {
            let path = path_of(&parent, name);
            let (data, stat) = match timed(self.cfg().timeout, "get", s.client.get_data(&path)).await? {
                Ok(read) => read,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(map_err(e)),
            };
            let kind = nodes::kind_of(name);
            if !kind.mode(0).is_exclusive() {
                limit = limit.or_else(|| nodes::limit_of(&data));
            }
            let mode = kind.mode(limit.unwrap_or(0));
            alive.push((mode, nodes::marked_of(&data)));
            if holding_in_queue(alive.iter().copied()) < alive.len() {
                break;
            }
            holding.push((path, nodes::fence_of(&data, stat.czxid), mode.is_exclusive()));
            if mode.is_exclusive() {
                break;
            }
        }
        let mut out = ForceReleased::free();
        for (path, fence, exclusive) in holding {
            match timed(self.cfg().timeout, "delete", s.client.delete(&path, None)).await? {
                Ok(()) => out.add(fence, exclusive),
                // Released meanwhile by its holder.
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(map_err(e)),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_decode_from_their_segment() {
        for key in ["a", "a/b", "orders 42", "é/%", "..", "x-y_z"] {
            assert_eq!(decode_key(&nodes::encode_key(key)).as_deref(), Some(key));
        }
        assert_eq!(decode_key("%4"), None);
        assert_eq!(decode_key("%zz"), None);
    }
}
