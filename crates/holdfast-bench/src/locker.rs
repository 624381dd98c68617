//! [`Locker`]: what a workload needs from a lock, implemented by holdfast,
//! by the raw floor, and (in the `peers` binary) by peer crates.

use std::future::Future;
use std::time::{Duration, Instant};

use holdfast::{Client, Error, LockOptions, MutexGuard, OwnerToken, Permit, ReadGuard, Result, WriteGuard};

use crate::floor::Floor;

/// How long any one acquire may wait before the workload fails: a stuck
/// store is an error, not a hung bench.
pub const ACQUIRE_LIMIT: Duration = Duration::from_secs(60);

/// What one cycle of a workload asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The key alone (a mutex).
    Exclusive,
    /// One permit of a semaphore of `permits`.
    Permit {
        /// The semaphore's permit count.
        permits: u32,
    },
    /// A read share of a read-write lock.
    Read,
    /// The write side of a read-write lock.
    Write,
}

/// A lock as the workloads drive it: acquire (waiting) and release.
pub trait Locker: Send + Sync + 'static {
    /// What a successful acquire hands back, given back to release.
    type Guard: Send + 'static;

    /// Waits for `key` (at most [`ACQUIRE_LIMIT`]).
    fn acquire(&self, key: &str) -> impl Future<Output = Result<Self::Guard>> + Send;

    /// Waits for `key` in `role`; a locker without semaphores or read-write
    /// locks fails with [`Error::Unsupported`] for those roles.
    fn acquire_as(&self, key: &str, role: Role) -> impl Future<Output = Result<Self::Guard>> + Send {
        async move {
            match role {
                Role::Exclusive => self.acquire(key).await,
                _ => Err(Error::Unsupported { store: "holdfast-bench", what: "semaphores and read-write locks here" }),
            }
        }
    }

    /// Releases a grant; an error if it was no longer held.
    fn release(&self, guard: Self::Guard) -> impl Future<Output = Result<()>> + Send;
}

/// holdfast's mutex, as a user writes it: `client.mutex(key).acquire_timeout(..)`,
/// then `guard.release()`; renewal on, as by default.
#[derive(Debug, Clone)]
pub struct HoldfastLocker {
    client: Client,
    options: LockOptions,
}

impl HoldfastLocker {
    /// Locks with `ttl`, fair if asked.
    pub fn new(client: Client, ttl: Duration, fair: bool) -> Self {
        let mut options = LockOptions::with_ttl(ttl);
        options.fair = fair;
        HoldfastLocker { client, options }
    }
}

/// A grant of any kind held by [`HoldfastLocker`].
#[derive(Debug)]
pub enum HoldfastGuard {
    /// A mutex.
    Mutex(MutexGuard),
    /// A semaphore permit.
    Permit(Permit),
    /// A read lock.
    Read(ReadGuard),
    /// A write lock.
    Write(WriteGuard),
}

impl Locker for HoldfastLocker {
    type Guard = HoldfastGuard;

    async fn acquire(&self, key: &str) -> Result<HoldfastGuard> {
        self.acquire_as(key, Role::Exclusive).await
    }

    async fn acquire_as(&self, key: &str, role: Role) -> Result<HoldfastGuard> {
        let (client, opts) = (&self.client, self.options.clone());
        Ok(match role {
            Role::Exclusive => {
                HoldfastGuard::Mutex(client.mutex_with_options(key, opts).acquire_timeout(ACQUIRE_LIMIT).await?)
            }
            Role::Permit { permits } => {
                let sem = client.semaphore(key, permits).ttl(opts.ttl);
                HoldfastGuard::Permit(sem.acquire_timeout(ACQUIRE_LIMIT).await?)
            }
            Role::Read => {
                let lock = client.rwlock_with_options(key, opts).read();
                HoldfastGuard::Read(lock.acquire_timeout(ACQUIRE_LIMIT).await?)
            }
            Role::Write => {
                let lock = client.rwlock_with_options(key, opts).write();
                HoldfastGuard::Write(lock.acquire_timeout(ACQUIRE_LIMIT).await?)
            }
        })
    }

    async fn release(&self, guard: HoldfastGuard) -> Result<()> {
        match guard {
            HoldfastGuard::Mutex(g) => g.release().await,
            HoldfastGuard::Permit(g) => g.release().await,
            HoldfastGuard::Read(g) => g.release().await,
            HoldfastGuard::Write(g) => g.release().await,
        }
    }
}

/// The raw floor as a lock: one attempt, then a 1 ms sleep between attempts
/// while the key is busy (the loop users write around `SET NX PX`).
pub struct FloorLocker {
    floor: Box<dyn Floor>,
    ttl: Duration,
    poll: Duration,
}

impl FloorLocker {
    /// The floor with a 30 s TTL and 1 ms polling.
    pub fn new(floor: Box<dyn Floor>) -> Self {
        FloorLocker { floor, ttl: Duration::from_secs(30), poll: Duration::from_millis(1) }
    }

    /// Sets the lease TTL of each acquisition.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// What the floor sends.
    pub fn describe(&self) -> &'static str {
        self.floor.describe()
    }
}

/// A grant held by [`FloorLocker`]: the key it is on, its token, and
/// whether it is a read-write share.
#[derive(Debug)]
pub struct FloorGuard {
    key: String,
    token: OwnerToken,
    shared: bool,
}

impl FloorLocker {
    /// Attempts until `attempt` succeeds, 1 ms apart (at most [`ACQUIRE_LIMIT`]).
    async fn poll<F, Fut>(&self, key: &str, mut attempt: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<bool>>,
    {
        let started = Instant::now();
        loop {
            if attempt().await? {
                return Ok(());
            }
            if started.elapsed() > ACQUIRE_LIMIT {
                return Err(Error::Timeout { key: key.to_owned(), waited: started.elapsed() });
            }
            tokio::time::sleep(self.poll).await;
        }
    }
}

impl Locker for FloorLocker {
    type Guard = FloorGuard;

    async fn acquire(&self, key: &str) -> Result<FloorGuard> {
        self.acquire_as(key, Role::Exclusive).await
    }

    /// A semaphore of N is N mutex slots (`KEY#0` .. `KEY#N-1`), tried from a
    /// random one, the store-independent hand-written semaphore; a read-write
    /// lock is the floor's own where it has one.
    async fn acquire_as(&self, key: &str, role: Role) -> Result<FloorGuard> {
        let token = OwnerToken::random();
        let (floor, ttl) = (&self.floor, self.ttl);
        match role {
            Role::Exclusive => {
                self.poll(key, || floor.acquire(key, token, ttl)).await?;
                Ok(FloorGuard { key: key.to_owned(), token, shared: false })
            }
            Role::Permit { permits } => {
                let start = (token.as_u128() % u128::from(permits.max(1))) as u32;
                let started = Instant::now();
                loop {
                    for i in 0..permits {
                        let slot = format!("{key}#{}", (start + i) % permits);
                        if floor.acquire(&slot, token, ttl).await? {
                            return Ok(FloorGuard { key: slot, token, shared: false });
                        }
                    }
                    if started.elapsed() > ACQUIRE_LIMIT {
                        return Err(Error::Timeout { key: key.to_owned(), waited: started.elapsed() });
                    }
                    tokio::time::sleep(self.poll).await;
                }
            }
            Role::Read | Role::Write => {
                let write = role == Role::Write;
                self.poll(key, || floor.acquire_rw(key, token, ttl, write)).await?;
                Ok(FloorGuard { key: key.to_owned(), token, shared: true })
            }
        }
    }

    async fn release(&self, guard: FloorGuard) -> Result<()> {
        let FloorGuard { key, token, shared } = guard;
        let released =
            if shared { self.floor.release_rw(&key, token).await? } else { self.floor.release(&key, token).await? };
        if released { Ok(()) } else { Err(Error::Lost { key }) }
    }
}
