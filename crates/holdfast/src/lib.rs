//! # holdfast: distributed locks that hold fast
//!
//! One API over many stores. Every grant carries a fencing token; leases renew
//! themselves while held and tell the holder when they are lost; waiters are
//! woken by notification, not by sleep-polling alone.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! # async fn demo() -> holdfast::Result<()> {
//! let client = holdfast::Client::connect("sqlite:///tmp/holdfast-doc.db").await?;
//! let guard = client
//!     .mutex("stock:42")
//!     .ttl(Duration::from_secs(10))
//!     .acquire_timeout(Duration::from_secs(3))
//!     .await?;
//! let fence = guard.fence(); // pass to the protected resource; it rejects lower fences
//! tokio::select! {
//!     _ = tokio::time::sleep(Duration::from_millis(100)) => { /* the work */ }
//!     _ = guard.lost() => return Err(holdfast::Error::Lost { key: "stock:42".into() }),
//! }
//! guard.release().await?;
//! # let _ = fence; Ok(()) }
//! ```
//!
//! ## Stores
//!
//! | URL | feature | notes |
//! |---|---|---|
//! | `sqlite://PATH` | `sqlite` (default) | embedded, one host, several processes |
//! | `etcd://host:port[,host:port...]`, `etcds://` | `etcd` | consistent (raft); session leases, fair FIFO queue, revision fences, failover between members |
//! | `postgres://` / `postgresql://` | `postgres` | lease rows on the server clock, LISTEN/NOTIFY wake-ups, PgBouncer-safe ([docs](stores::postgres)) |
//! | `redis://[user:pass@]host:port[/db]`, `rediss://` | `redis` | one Lua script per call, pub/sub wake-ups, fair queue with hand-off |
//! | `redis+sentinel://[user:pass@]host:port,host:port/MASTER_NAME[/db]` | `redis` | the same, on the master the sentinels name, followed through failovers; `?replicas=N` confirms grants with `WAIT` ([docs](stores::redis)) |
//! | `redis+cluster://[user:pass@]host:port[,host:port...]` | `redis` | the same on a Redis Cluster: each lock's calls go to the master of its slot, slot moves followed ([docs](stores::redis)) |
//! | `mysql://user:pw@host:port/db` | `mysql` | MySQL/MariaDB lease rows on InnoDB, server clock, durable fences |
//! | `zk://[user:pass@]host:port[,...][/chroot]` | `zookeeper` | ephemeral sequential nodes, fair, czxid fences, session = lease |
//! | `redlock://host:port,host:port,...` | `redlock` | [RedLock](redlock) over a majority of N Redis servers, fences written back to the majority; [`redlock::RedLock::new`] over any stores |
//! | `layered://FAST_URL\|AUTH_URL` | (the two stores') | [layered hybrid](layered): a fast store filters contention, an authoritative one grants and fences; [`layered::Layered::new`] over any two stores |
//! | `fallback://URL\|URL\|...\|ARBITER_URL` | (its stores') | [fallback chain](fallback): one store grants at a time, the next when it keeps failing, switches arbitrated by the last store; never two holders; [`fallback::Fallback::new`] over any stores |
//!
//! The URL scheme picks the store in one place; a scheme whose feature is off
//! is [`Error::FeatureDisabled`].
//!
//! One more feature, `simulation`, is for tests only: it exposes
//! `holdfast::entropy`, which lets a thread draw owner tokens and jitter from
//! a seed so that `holdfast-testkit`'s simulated runs replay exactly. Seeded
//! tokens are predictable; never enable it in production.
//!
//! ## Guarantees
//!
//! Every store passes the conformance suite C1..C17 of `holdfast-testkit`
//! against a real server. What each store guarantees, and where a guarantee
//! ends, is in the guarantee table (`docs/guarantees.md` in the repository)
//! and in each backend's docs.
//!
//! ## Checking a fence
//!
//! A lock alone cannot stop a holder that paused (GC, swap, a stopped VM)
//! past its lease from writing after the next holder started. The fence can:
//! the protected resource remembers the highest fence it accepted and rejects
//! lower ones, for example in SQL:
//!
//! ```sql
//! UPDATE stock SET count = count - 1, last_fence = $fence
//!  WHERE item = $item AND last_fence < $fence;   -- 0 rows: a newer holder wrote first
//! ```

// The floors, from the ground up; each imports only the floors below it
// (docs/design.md, "Floors").
pub mod backend;
mod client;
mod composites;
mod election;
mod guard;
mod held;
mod lease;
mod lock;
mod multi;
mod mutex;
mod rwlock;
mod segmented;
mod semaphore;
mod shrink;
pub mod stores;
mod vocabulary;

pub use composites::{fallback, layered, redlock};
#[cfg(feature = "simulation")]
pub use vocabulary::entropy;
pub use vocabulary::metrics;

pub use backend::{ForceReleased, HolderInfo, LockStatus};
pub use client::{Client, ClientOptions};
pub use election::{Election, Leader, Leadership};
pub use guard::{
    Guard, GuardKind, LostReason, MutexGuard, MutexKind, Permit, PermitKind, ReadGuard, ReadKind, WriteGuard, WriteKind,
};
pub use lease::lock_options::LockOptions;
pub use lock::Lock;
pub use multi::{MultiGuard, MultiLock};
pub use mutex::Mutex;
pub use rwlock::{ReadLock, RwLock, WriteLock};
pub use segmented::{AllSegmentsGuard, SegmentGuard, Segmented};
pub use semaphore::Semaphore;
pub use vocabulary::capability::{Capabilities, FenceDurability};
pub use vocabulary::error::{BoxError, Error, Result};
pub use vocabulary::key::{LockKey, OwnerToken};
pub use vocabulary::secret::Secret;

/// The Rust blocks of the READMEs and of `docs/*.md`, compiled (and, unless
/// `no_run`, run) as doctests by `cargo test`, so that what the pages show
/// stays true. One item per page, so a failure names its page. The paths
/// outside this crate are read only when doctests are collected, never by a
/// build, so the packaged crate (which lacks them) still builds.
#[cfg(doctest)]
mod doc_pages {
    /// The crate's own README (crates.io's page).
    #[doc = include_str!("../README.md")]
    pub struct CrateReadme;
    /// The repository's front page.
    #[doc = include_str!("../../../README.md")]
    pub struct Readme;
    /// docs/library.md.
    #[doc = include_str!("../../../docs/library.md")]
    pub struct Library;
    /// docs/composites.md.
    #[doc = include_str!("../../../docs/composites.md")]
    pub struct Composites;
    /// docs/operations.md.
    #[doc = include_str!("../../../docs/operations.md")]
    pub struct Operations;
    /// docs/cli.md.
    #[doc = include_str!("../../../docs/cli.md")]
    pub struct Cli;
    /// docs/stores.md.
    #[doc = include_str!("../../../docs/stores.md")]
    pub struct Stores;
    /// docs/guarantees.md.
    #[doc = include_str!("../../../docs/guarantees.md")]
    pub struct Guarantees;
    /// docs/simulation.md.
    #[doc = include_str!("../../../docs/simulation.md")]
    pub struct Simulation;
    /// docs/verify.md.
    #[doc = include_str!("../../../docs/verify.md")]
    pub struct Verify;
    /// docs/performance.md.
    #[doc = include_str!("../../../docs/performance.md")]
    pub struct Performance;
    /// docs/design.md.
    #[doc = include_str!("../../../docs/design.md")]
    pub struct Design;
}
