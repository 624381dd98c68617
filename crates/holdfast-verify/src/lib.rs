//! The engine behind `holdfast verify` and `holdfast demo`, checked from
//! outside the lock store:
//!
//! - [`history`]: a history of a lock run (grants, releases, losses, fenced
//!   writes) and the one checker of it (exclusion, fencing, no stale write
//!   accepted, `lost()` first); the simulation in `holdfast-testkit` checks
//!   its runs with it too;
//! - [`properties`]: the property each primitive promises (mutex,
//!   semaphore, read-write lock, election), checked over the intervals its
//!   holders believed they held; `holdfast verify` judges its runs with it;
//! - [`witness`]: a witness of critical sections on the local file system,
//!   which sees two holders inside at once, a fence that did not increase and
//!   an oversold counter;
//! - [`proxy`]: a TCP proxy that loses, delays or withholds a store's
//!   traffic on demand ([`FaultProxy`](proxy::FaultProxy));
//! - [`servers`]: real store servers (Redis, Sentinel, Cluster, etcd,
//!   ZooKeeper, PostgreSQL, MariaDB) started on loopback ports in temp dirs
//!   and killed on drop.
//!
//! It is linked into the shipped `holdfast` binary, so it depends on
//! `holdfast-lock` without the test-only `simulation` feature. The test kit
//! (`holdfast-testkit`) re-exports these modules under its own paths for
//! holdfast's tests.
//!
//! Not a stable API: it exists for the `holdfast` command and holdfast's own
//! tests.

pub mod history;
pub mod properties;
pub mod proxy;
pub mod servers;
pub mod witness;
