//! The admin calls on etcd: the held keys under a prefix (one key-only
//! range over the namespace, then each lock's status) and the forced
//! release (the keys holding a lock deleted in one transaction).

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};

use super::Shared;
use super::ops::{self, Entry};
use crate::backend::ForceReleased;
use crate::backend::LockStatus;
use crate::backend::admission::holding_in_queue;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::LockKey;

/// Times a forced release reads the queue again when a holding key changed
/// between its read and its delete (released, re-put, marked).
const FORCE_TRIES: u32 = 5;

/// The escaped form of a lock key or key prefix, as `ops::lock_prefix`
/// writes it without the trailing `/`. The escaping is a prefix code (`%`
/// and `/` become `%25` and `%2F`, nothing else starts with `%`), so an
/// escaped key starts with an escaped prefix exactly when the key starts
/// with the prefix.
fn escaped(namespace: &str, prefix: &str) -> Vec<u8> {
    let mut p = namespace.as_bytes().to_vec();
    for c in prefix.chars() {
        match c {
            '%' => p.extend_from_slice(b"%25"),
            '/' => p.extend_from_slice(b"%2F"),
            c => p.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    p
}

/// The lock key a queue key (`namespace` + escaped key + `/` + token)
/// belongs to.
fn lock_key_of(namespace: &str, name: &[u8]) -> Option<String> {
    let rest = std::str::from_utf8(name.strip_prefix(namespace.as_bytes())?).ok()?;
    if rest.starts_with(super::session::EPOCH_DIR) {
        // A session's epoch key, not a lock's.
        return None;
    }
    let (escaped, _token) = rest.rsplit_once('/')?;
    Some(escaped.replace("%2F", "/").replace("%25", "%"))
}

impl Shared {
    /// Every lock under `prefix` with a holding key. One key-only range
    /// over the escaped prefix (every queue key there: holders and
    /// waiters), then one status read per lock.
    pub(super) async fn list_held(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        let namespace = &self.config.prefix;
        let range = escaped(namespace, prefix);
        let resp = self
            .conn
            .call("list", |mut c| {
                let r = range.clone();
                async move { c.get(r, Some(GetOptions::new().with_prefix().with_keys_only())).await }
            })
            .await?;
        let mut keys: Vec<String> = resp.kvs().iter().filter_map(|kv| lock_key_of(namespace, kv.key())).collect();
        keys.sort();
        keys.dedup();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let Ok(key) = LockKey::new(key) else { continue };
            if !key.as_str().starts_with(prefix) {
                continue;
            }
            let status = ops::status(&self.conn, &key, &self.prefix(&key)).await?;
            if status.holder.is_some() || !status.shared.is_empty() {
                out.push(status);
            }
        }
        Ok(out)
    }

    /// Deletes the keys holding `key` (the queue's admitted prefix; waiting
    /// keys stay), in one transaction that checks each is unchanged since
    /// the read. Their owners' key watches fire their `lost()`; the next
    /// key's owner, which watches its predecessor's deletion, is woken as
    /// by a release; the next grant is a key created later, so its fence (a
    /// create revision) is above the removed ones.
    pub(super) async fn force(&self, key: &LockKey) -> Result<ForceReleased> {
        let prefix = self.prefix(key);
        for _ in 0..FORCE_TRIES {
            let resp = self.conn.txn("force_release", ops::queue(&prefix)).await?;
            let queue = ops::kvs(&resp, 0);
            let entries: Vec<Entry> = queue.iter().map(ops::entry_of).collect();
            let admitted = holding_in_queue(entries.iter().map(|e| (e.mode, e.marked)));
            let holding = &queue[..admitted.min(queue.len())];
            if holding.is_empty() {
                return Ok(ForceReleased::free());
            }
            let txn = Txn::new()
                .when(
                    holding
                        .iter()
                        .map(|kv| Compare::mod_revision(kv.key().to_vec(), CompareOp::Equal, kv.mod_revision()))
                        .collect::<Vec<_>>(),
                )
                .and_then(holding.iter().map(|kv| TxnOp::delete(kv.key().to_vec(), None)).collect::<Vec<_>>());
            if self.conn.txn("force_release", txn).await?.succeeded() {
                let mut out = ForceReleased::free();
                for (kv, e) in holding.iter().zip(&entries) {
                    out.add(kv.create_revision().max(0) as u64, e.mode.is_exclusive());
                }
                return Ok(out);
            }
        }
        Err(Error::backend(
            super::STORE,
            true,
            format!("the holders of {key} changed {FORCE_TRIES} times while being removed; try again"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_keys_round_trip() {
        for (prefix, key) in [("", "a"), ("a", "a/b"), ("a/", "a/b"), ("a%", "a%2F"), ("x", "x")] {
            let k = LockKey::new(key).unwrap();
            let name = [ops::lock_prefix("hf/", &k), b"0123abcd~s".to_vec()].concat();
            assert!(name.starts_with(&escaped("hf/", prefix)), "{prefix:?} {key:?}");
            assert_eq!(lock_key_of("hf/", &name).as_deref(), Some(key));
        }
        // A key outside the prefix is outside the range.
        let k = LockKey::new("a/b").unwrap();
        assert!(!ops::lock_prefix("hf/", &k).starts_with(&escaped("hf/", "a%")));
        assert_eq!(ops::lock_prefix("hf/", &k), [escaped("hf/", "a/b"), b"/".to_vec()].concat());
    }

    /// A session's epoch key is no lock's key, and under no lock's prefix,
    /// whatever the lock is called (`%` is always escaped).
    #[test]
    fn epoch_keys_are_not_locks() {
        let epoch = super::super::session::epoch_key("hf/", 0x1234);
        assert_eq!(lock_key_of("hf/", &epoch), None);
        for key in ["%session", "%", "a", "%session/1234"] {
            let k = LockKey::new(key).unwrap();
            assert!(!epoch.starts_with(&ops::lock_prefix("hf/", &k)), "{key:?}");
        }
    }
}
