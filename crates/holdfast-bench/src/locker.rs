//! [`Locker`]: what a workload needs from a lock, implemented by holdfast,
//! by the raw floor, and (in the `peers` binary) by peer crates.

use std::future::Future;
use std::time::{Duration, Instant};

use holdfast::{Client, Error, LockOptions, MutexGuard, OwnerToken, Result};

use crate::floor::Floor;

/// How long any one acquire may wait before the workload fails: a stuck
/// store is an error, not a hung bench.
pub const ACQUIRE_LIMIT: Duration = Duration::from_secs(60);

/// A lock as the workloads drive it: acquire (waiting) and release.
pub trait Locker: Send + Sync + 'static {
    /// What a successful acquire hands back, given back to release.
    type Guard: Send + 'static;

    /// Waits for `key` (at most [`ACQUIRE_LIMIT`]).
    fn acquire(&self, key: &str) -> impl Future<Output = Result<Self::Guard>> + Send;

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

impl Locker for HoldfastLocker {
    type Guard = MutexGuard;

    async fn acquire(&self, key: &str) -> Result<MutexGuard> {
        self.client.mutex_with_options(key, self.options.clone()).acquire_timeout(ACQUIRE_LIMIT).await
    }

    async fn release(&self, guard: MutexGuard) -> Result<()> {
        guard.release().await
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

impl Locker for FloorLocker {
    type Guard = (String, OwnerToken);

    async fn acquire(&self, key: &str) -> Result<(String, OwnerToken)> {
        let token = OwnerToken::random();
        let started = Instant::now();
        loop {
            if self.floor.acquire(key, token, self.ttl).await? {
                return Ok((key.to_owned(), token));
            }
            if started.elapsed() > ACQUIRE_LIMIT {
                return Err(Error::Timeout { key: key.to_owned(), waited: started.elapsed() });
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    async fn release(&self, (key, token): (String, OwnerToken)) -> Result<()> {
        if self.floor.release(&key, token).await? { Ok(()) } else { Err(Error::Lost { key }) }
    }
}
