//! Who holds a key: the answer of [`Backend::status`](super::Backend::status)
//! and the stream of [`Backend::watch_holders`](super::Backend::watch_holders).

use std::time::Duration;

use crate::vocabulary::error::Result;
use crate::vocabulary::key::LockKey;

/// Who holds a key, as far as the store can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockStatus {
    /// The key.
    pub key: String,
    /// The holder of the exclusive lease, if an unexpired one exists.
    pub holder: Option<HolderInfo>,
    /// The holders of unexpired shared leases (semaphore permits, readers).
    pub shared: Vec<HolderInfo>,
    /// The limit recorded with the key's shared leases, while any is held.
    pub limit: Option<u32>,
    /// How many waiters the store knows of, if it can count them (on etcd
    /// and ZooKeeper, waiting clients: a client's tasks take turns for one
    /// place in the store's queue; on Redis, fair waiters and waiting shared
    /// or writer requests, not default-mode mutex waiters, which leave
    /// nothing in the store).
    pub waiters: Option<u64>,
}

impl LockStatus {
    /// A key nobody holds.
    pub fn free(key: &LockKey) -> Self {
        LockStatus { key: key.to_string(), holder: None, shared: Vec::new(), limit: None, waiters: None }
    }
}

/// The holder of a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderInfo {
    /// The holder's label.
    pub label: String,
    /// The fence of the holder's grant.
    pub fence: u64,
    /// Time left on the lease by the store's clock, where the store knows it.
    pub ttl_left: Option<Duration>,
    /// The lease's weight (1 for an exclusive lease).
    pub weight: u32,
}

/// The exclusive holders of a key as the store's watch reports them
/// ([`Backend::watch_holders`](super::Backend::watch_holders)): each holder once, from the one at the
/// start (if any), in increasing order of fence, including holders whose
/// grant ended before anyone read the key's status. An `Err` item is a
/// failed read, or a stretch the store cannot vouch for (its history was
/// compacted, its connection lost events): holders may have been missed
/// there, and the items after it start from a fresh read. The stream goes
/// on after an error; dropping it stops the watch.
pub type HolderWatch = futures::stream::BoxStream<'static, Result<HolderInfo>>;
