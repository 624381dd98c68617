//! Admin calls for people on call: list the held keys, free a key whose
//! holder is gone. Not for applications' locking paths: a forced release
//! breaks the mutual exclusion a holder believes it has (its fence still
//! protects a fenced resource, and its `lost()` fires at its next renewal).

use crate::backend::ForceReleased;
use crate::backend::LockStatus;
use crate::client::Client;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, MAX_KEY_BYTES};

/// Checks a key prefix for [`Client::list`]: at most [`MAX_KEY_BYTES`] bytes,
/// no control characters (the rules of [`LockKey`], except that the empty
/// prefix, every key, is allowed). A bad prefix is [`Error::InvalidInput`]
/// with `what = "prefix"`, before any I/O.
pub fn check_prefix(prefix: &str) -> Result<&str> {
    if prefix.len() > MAX_KEY_BYTES {
        return Err(Error::invalid(
            "prefix",
            format!("a key prefix is at most {MAX_KEY_BYTES} bytes, this one has {}", prefix.len()),
        ));
    }
    if let Some(c) = prefix.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(
            "prefix",
            format!("a key prefix must not contain control characters (found U+{:04X})", c as u32),
        ));
    }
    Ok(prefix)
}

impl Client {
    /// Every key under `prefix` (`None`: every key) that has an unexpired
    /// lease, with its holder, shared leases, fences, TTL left and waiters,
    /// sorted by key: the admin view behind `holdfast list`.
    ///
    /// # Cost
    ///
    /// An admin call, not for a locking path: it reads every key under the
    /// prefix (O(keys held there), plus the key's status where the store
    /// needs a second read), in pages where the store pages (Redis `SCAN`
    /// on every master, an etcd range, ZooKeeper children, one SQL query).
    /// Narrow it with a prefix on a store with many held keys.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad prefix (see [`check_prefix`]);
    /// [`Error::Unsupported`] on a store that cannot list (the composites
    /// other than those that say so).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockStatus>> {
        let prefix = check_prefix(prefix.unwrap_or(""))?;
        let mut all = self.core().backend.list(prefix).await?;
        all.retain(|s| s.key.starts_with(prefix) && (s.holder.is_some() || !s.shared.is_empty()));
        all.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(all)
    }

    /// Frees `key` whatever its owner: removes its exclusive lease and its
    /// shared leases, and returns their fences ([`ForceReleased::was_free`]
    /// if nothing was held). For a key whose holder is gone, without waiting
    /// out its lease.
    ///
    /// After it returns, the key can be granted again at once, with a fence
    /// above every removed one; waiters are woken as by a release (and
    /// keep their places in the queue); the old holder's next renewal fails,
    /// so its `lost()` fires by then at the latest (until then it may still
    /// believe it holds the key: its fence is what a fenced resource must
    /// check).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad key; [`Error::Unsupported`] on a
    /// store that cannot (see [`list`](Self::list)).
    ///
    /// # Cancel safety
    ///
    /// Dropped, it removed all, some or none of the key's leases (one
    /// script or transaction on Redis and the SQL stores: all or none; on
    /// etcd one transaction; on ZooKeeper one delete per holding node);
    /// calling it again removes the rest and is otherwise harmless.
    pub async fn force_release(&self, key: &str) -> Result<ForceReleased> {
        let key = LockKey::new(key)?;
        self.core().backend.force_release(&key).await
    }
}
