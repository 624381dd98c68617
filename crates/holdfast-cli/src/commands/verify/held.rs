//! What a verify worker acquires, for each `--primitive`, behind one type:
//! a mutex guard, a semaphore's permits, a read or write guard, or a
//! leadership. The worker's loop and critical section are the same for all.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use holdfast::{Client, Election, Leadership, MutexGuard, Permit, ReadGuard, WriteGuard};

use super::record::GrantHold;
use crate::cli::Primitive;

/// One grant, of whichever primitive.
pub enum Held {
    /// A mutex's.
    Mutex(MutexGuard),
    /// A semaphore's permits.
    Permit(Permit),
    /// A read-write lock's read side.
    Read(ReadGuard),
    /// A read-write lock's write side.
    Write(WriteGuard),
    /// An election's leadership.
    Leader(Leadership),
}

impl Held {
    /// Its fence (a leader's term).
    pub fn fence(&self) -> u64 {
        match self {
            Held::Mutex(g) => g.fence(),
            Held::Permit(g) => g.fence(),
            Held::Read(g) => g.fence(),
            Held::Write(g) => g.fence(),
            Held::Leader(l) => l.term(),
        }
    }

    /// What it holds.
    pub fn hold(&self) -> GrantHold {
        match self {
            Held::Permit(g) => GrantHold::Permits(g.permits()),
            Held::Read(_) => GrantHold::Read,
            Held::Mutex(_) | Held::Write(_) | Held::Leader(_) => GrantHold::Exclusive,
        }
    }

    /// Whether the lease is known lost (its local deadline passed, or renewal failed).
    pub fn is_lost(&self) -> bool {
        match self {
            Held::Mutex(g) => g.is_lost(),
            Held::Permit(g) => g.is_lost(),
            Held::Read(g) => g.is_lost(),
            Held::Write(g) => g.is_lost(),
            Held::Leader(l) => l.is_lost(),
        }
    }

    /// The local lease deadline; `None` for a leadership, which does not
    /// show it (the worker then uses the last moment it saw itself leading).
    pub fn valid_until(&self) -> Option<Instant> {
        match self {
            Held::Mutex(g) => Some(g.valid_until()),
            Held::Permit(g) => Some(g.valid_until()),
            Held::Read(g) => Some(g.valid_until()),
            Held::Write(g) => Some(g.valid_until()),
            Held::Leader(_) => None,
        }
    }

    /// Resolves when the lease is lost.
    pub fn lost(&self) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        match self {
            Held::Mutex(g) => Box::pin(g.lost()),
            Held::Permit(g) => Box::pin(g.lost()),
            Held::Read(g) => Box::pin(g.lost()),
            Held::Write(g) => Box::pin(g.lost()),
            Held::Leader(l) => Box::pin(l.lost()),
        }
    }

    /// Releases (a leader resigns).
    pub async fn release(self) -> holdfast::Result<()> {
        match self {
            Held::Mutex(g) => g.release().await,
            Held::Permit(g) => g.release().await,
            Held::Read(g) => g.release().await,
            Held::Write(g) => g.release().await,
            Held::Leader(l) => l.resign().await,
        }
    }
}

/// How a worker acquires, by primitive.
pub struct Acquirer {
    client: Client,
    key: String,
    ttl: Duration,
    primitive: Primitive,
    permits: u32,
    lane: u32,
}

impl Acquirer {
    /// The acquirer of `primitive` on `key` for lane `lane`.
    pub fn new(client: Client, key: &str, ttl: Duration, primitive: Primitive, permits: u32, lane: u32) -> Self {
        Acquirer { client, key: key.to_owned(), ttl, primitive, permits: permits.max(1), lane }
    }

    /// The `n`th grant of this worker, waiting at most `within`; `None` if
    /// the wait ran out. The mix is fixed by lane and `n`, so every run
    /// has one: a third of a read-write lock's grants are writes, a third
    /// of a semaphore's take 2 permits (when there are 2).
    pub async fn acquire(&self, n: u64, within: Duration, value: &str) -> holdfast::Result<Option<Held>> {
        let third = (u64::from(self.lane) + n) % 3 == 0;
        let (client, key, ttl) = (&self.client, self.key.as_str(), self.ttl);
        let held = match self.primitive {
            Primitive::Mutex => client.mutex(key).ttl(ttl).acquire_timeout(within).await.map(Held::Mutex),
            Primitive::Semaphore => {
                let weight = if third && self.permits >= 2 { 2 } else { 1 };
                let semaphore = client.semaphore(key, self.permits).ttl(ttl);
                semaphore.acquire_many_timeout(weight, within).await.map(Held::Permit)
            }
            Primitive::Rwlock if third => {
                client.rwlock(key).write().ttl(ttl).acquire_timeout(within).await.map(Held::Write)
            }
            Primitive::Rwlock => client.rwlock(key).read().ttl(ttl).acquire_timeout(within).await.map(Held::Read),
            Primitive::Election => {
                let election: Election = client.election(key).ttl(ttl);
                // A campaign is cancel-safe: cut short, it leaves no candidacy behind.
                match tokio::time::timeout(within, election.campaign(value)).await {
                    Ok(leading) => leading.map(Held::Leader),
                    Err(_) => return Ok(None),
                }
            }
        };
        match held {
            Ok(h) => Ok(Some(h)),
            Err(holdfast::Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
