//! The distributed read-write lock: readers share the key, a writer excludes
//! everyone, and a waiting writer holds back later readers.

use crate::guard::{ReadKind, WriteKind};
use crate::held::ClientCore;
use crate::lease::lock_options::LockOptions;
use crate::lock::Lock;
use std::sync::Arc;

/// The read side of a [`RwLock`]: a [`Lock`] whose guard is a
/// [`ReadGuard`](crate::ReadGuard), shared with other readers.
pub type ReadLock = Lock<ReadKind>;

/// The write side of a [`RwLock`]: a [`Lock`] whose guard is a
/// [`WriteGuard`](crate::WriteGuard), exclusive.
pub type WriteLock = Lock<WriteKind>;

/// A named distributed read-write lock. Cheap to clone; holds nothing by
/// itself. [`read`](Self::read) and [`write`](Self::write) give the two
/// sides, with [`Lock`]'s builder and acquire methods.
///
/// # Policy
///
/// - Readers share the key; a writer excludes readers and other writers.
/// - **Writer-preferring**: once a writer waits, readers that come later
///   queue behind it, so a steady stream of readers cannot starve writers.
///   Readers that were already waiting when the writer came are not held
///   back by it. Writers may pass one another (as a mutex's waiters may).
/// - Every grant, read or write, has a fence strictly above every earlier
///   grant of the key, so a fenced resource can order readers and writers.
/// - A dead reader or writer frees its share within its TTL; a dead waiting
///   writer holds back readers for at most one TTL.
/// - There is no upgrade from read to write (two upgraders would deadlock):
///   release the read guard, then acquire the write lock. A task that asks
///   to write while it still reads waits for itself until its wait timeout.
///
/// ```no_run
/// # async fn demo() -> holdfast::Result<()> {
/// let client = holdfast::Client::connect("sqlite:///tmp/holdfast-doc.db").await?;
/// let config = client.rwlock("config/pricing");
/// let reading = config.read().acquire().await?;    // many readers at once
/// reading.release().await?;
/// let writing = config.write().acquire().await?;   // alone
/// writing.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    core: Arc<ClientCore>,
    key: String,
    opts: LockOptions,
}

impl RwLock {
    pub(crate) fn new(core: Arc<ClientCore>, key: String, opts: LockOptions) -> Self {
        RwLock { core, key, opts }
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The read side, with this lock's options.
    pub fn read(&self) -> ReadLock {
        Lock::new(self.core.clone(), self.key.clone(), self.opts.clone())
    }

    /// The write side, with this lock's options.
    pub fn write(&self) -> WriteLock {
        Lock::new(self.core.clone(), self.key.clone(), self.opts.clone())
    }
}
