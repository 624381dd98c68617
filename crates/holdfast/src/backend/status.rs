//! What [`Backend::status`](super::Backend::status) and
//! [`Backend::list`](super::Backend::list) report: who holds a key.

use crate::key::LockKey;
use std::time::Duration;

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
