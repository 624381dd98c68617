//! Shrinking a held lease in place (`scripts/shrink.lua`): a write lock
//! downgraded to a read lock, part of a semaphore grant given back.

use super::keys::lock_keys;
use super::{RedisBackend, ms};
use crate::backend::LeaseMode;
use crate::backend::admission::Shrink;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

impl RedisBackend {
    /// [`Backend::shrink`](crate::backend::Backend::shrink): one script on
    /// the lock's hash and its shares (one hash tag, one Cluster slot).
    ///
    /// # Cancel safety
    ///
    /// One script: dropped, the lease shrank or did not.
    pub(super) async fn shrink_lease(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        let LeaseMode::Shared { weight, limit } = to else {
            return Err(Error::invalid(
                "shrink",
                format!("{to:?} is not smaller than any lease: shrink to a shared mode"),
            ));
        };
        let config = &self.inner.config;
        let naming = self.inner.notifier.naming();
        let [h, _, _, s] = lock_keys(&config.prefix, key);
        let mut inv = self.inner.scripts.shrink.call(2);
        inv.key(h).key(s).arg(token.to_hex()).arg(weight).arg(limit).arg(ms(config.fence_keep));
        inv.arg_parts(&naming.lock_channel_parts(key.as_str()));
        let outcome: i64 = self.invoke(&inv).await?;
        match outcome {
            1 => Ok(true),
            // A call that re-sent its request after a lost connection finds
            // its own first copy applied (the lease is that small already):
            // the client asked only for a smaller mode, so that was it.
            -1 if inv.was_resent() => Ok(true),
            -1 => Shrink::NotSmaller(format!("{to:?} is not smaller than the lease held")).answer(),
            _ => Ok(false),
        }
    }
}
