//! What a store can do, declared by its backend and checked before dispatch.

/// How far a store's fences stay strictly increasing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceDurability {
    /// Increasing across restarts and crashes of the store itself (a fsynced
    /// log, a consensus log).
    Durable,
    /// Increasing while the store runs, and across clean or process-crash
    /// restarts, but a power loss or an OS crash may lose the last grants
    /// (for example SQLite with `synchronous=NORMAL`).
    ProcessCrash,
    /// Increasing only while the store's process lives (Redis without
    /// persistence): a restart may reissue old fences.
    Volatile,
}

/// A store's declared capabilities. The conformance suite tests every one
/// that is declared; the client refuses requests for the ones that are not
/// with [`Error::Unsupported`](crate::Error::Unsupported) before any I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Fair (FIFO) mode is available: grants follow request order.
    pub fair: bool,
    /// Every lock is fair whether asked or not (a queue is the store's only
    /// way to wait, as with etcd and ZooKeeper).
    pub always_fair: bool,
    /// Waiters are woken by the store's own notification (pub/sub, watch,
    /// LISTEN/NOTIFY) rather than by polling alone.
    pub store_notification: bool,
    /// The store can count waiters for `status` (on Redis, only those that
    /// leave something in the store: fair waiters and waiting shared or
    /// writer requests, not default-mode mutex waiters).
    pub counts_waiters: bool,
    /// Grants live on a client session (etcd lease, ZooKeeper session) rather
    /// than expiring by their TTL in the store: the store keeps them while the
    /// session lives, so the client releases a lease whose local deadline
    /// passed unrenewed, and a dead client frees its keys within the session
    /// timeout.
    pub session_bound: bool,
    /// How durable fences are.
    pub fence_durability: FenceDurability,
    /// The most leases the client puts in one [`Backend::renew`](crate::backend::Backend::renew)
    /// call (slices go out one at a time unless renewal has fallen behind,
    /// so no call is long), or `None` for every due lease in one call: for a
    /// store that orders and splits them itself (SQLite sorts them into the
    /// table's order before cutting transactions; slices cut in time order
    /// would write each page many times).
    pub renew_slice: Option<usize>,
    /// Shared leases ([`LeaseMode::Writer`](crate::backend::LeaseMode::Writer)
    /// and [`LeaseMode::Shared`](crate::backend::LeaseMode::Shared)): the
    /// store implements the whole lease model, so semaphores and read-write
    /// locks work on it.
    pub shared_leases: bool,
    /// The store can raise a key's fence floor
    /// ([`Backend::raise_fence`](crate::backend::Backend::raise_fence)): its
    /// fences come from a counter per key (or per store) that a floor can
    /// move up, not from a log position (etcd revisions, ZooKeeper zxids).
    /// RedLock needs it of every member, to keep its fences increasing.
    pub fence_floor: bool,
    /// Records kept with a key work:
    /// [`Backend::read_record`](crate::backend::Backend::read_record) and
    /// [`Backend::write_record`](crate::backend::Backend::write_record). A
    /// fallback chain's arbiter needs them for its mode record.
    pub records: bool,
    /// The admin calls work: [`Backend::list`](crate::backend::Backend::list)
    /// and [`Backend::force_release`](crate::backend::Backend::force_release).
    pub admin: bool,
    /// A held lease can be made smaller in place
    /// ([`Backend::shrink`](crate::backend::Backend::shrink)): a write lock
    /// downgraded to a read lock, part of a semaphore grant given back.
    pub shrink: bool,
}

impl FenceDurability {
    /// The weakest of `all` (what a composite over those stores can promise);
    /// `Durable` for none.
    pub fn weakest(all: impl IntoIterator<Item = FenceDurability>) -> FenceDurability {
        let rank = |d: &FenceDurability| match d {
            FenceDurability::Durable => 0,
            FenceDurability::ProcessCrash => 1,
            FenceDurability::Volatile => 2,
        };
        all.into_iter().max_by_key(rank).unwrap_or(FenceDurability::Durable)
    }
}

impl Capabilities {
    /// The least a store can declare: not fair, waiting by polling, volatile fences.
    pub const fn minimal() -> Self {
        Capabilities {
            fair: false,
            always_fair: false,
            store_notification: false,
            counts_waiters: false,
            session_bound: false,
            fence_durability: FenceDurability::Volatile,
            renew_slice: Some(256),
            shared_leases: false,
            fence_floor: false,
            records: false,
            admin: false,
            shrink: false,
        }
    }
}
