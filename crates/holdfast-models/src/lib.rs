//! Model-checked designs for holdfast's composite locks.
//!
//! Each model is a hand-written [`stateright::Model`] of a protocol that holdfast
//! is going to ship, with variant switches for the designs that were rejected, so
//! that the checker, not an argument, says which design is sound. The crate is
//! never published: its tests (`cargo test -p holdfast-models`) are the product,
//! and README.md beside this file records what the checker found.
//!
//! - [`redlock`]: a fenced RedLock over three independent stores.
//! - [`fallback`]: a chain of stores used one after another when one fails.
//! - [`fair_handoff`]: the Redis store's fair queue, and whether a waiter may
//!   count itself granted from a release's hand-off message.
//! - [`downgrade`]: a write lock downgraded to a read lock in one store step,
//!   against releasing the write lease and then acquiring a read lease.
//! - [`redis_cycle`]: the Redis store's lock hash through acquire, renewal,
//!   release, expiry and a clock step, against the cheaper layouts weighed
//!   for an uncontended cycle (issue 33).
//! - [`handover`]: the Redis store's local hand-over: a release that passes
//!   the lock to a waiting task of the same process in one store call,
//!   bounded so that other processes are not kept out (issue 33).
//! - [`pg_fence`]: per-key fences on PostgreSQL: a key's fence kept in its
//!   lease row, the namespace counter only for keys without one, against the
//!   variants weighed (issue 33).
//! - [`mysql_fence`]: per-key fences on MySQL/MariaDB: the same layout with
//!   MySQL's locking statements as atomic steps, old clients stopped by a
//!   renamed expiry column, against the variants weighed (issue 33).
//! - [`sql_session`]: SQL leases that live with their client's session row,
//!   renewed by one statement per client and TTL (issue 33).
//! - [`pg_session`]: the same session rows on PostgreSQL, with `READ
//!   COMMITTED`'s statement snapshots, row locks and re-checks as steps.
//! - [`mysql_session`]: the same session rows on MySQL/MariaDB, under InnoDB's `READ COMMITTED`.
//! - [`zk_join`]: how a new ZooKeeper queue node learns that it is first in
//!   line: the child count inside the create's transaction, against the
//!   variants weighed (issue 33).
//! - [`share_lanes`]: shared waiters of one process asking the store side by
//!   side, and the wake-up a granted waiter passes on (issue 33).
//! - [`pg_wakeup`]: how a PostgreSQL waiter makes sure a release will wake
//!   it: the `wanted` mark, written only when it is off (issue 33).
//! - [`pg_share_gate`]: how a PostgreSQL shared acquire sees the permits
//!   held: the shares read in a snapshot taken under the gate row's lock.
//! - [`share_handover`]: the Redis store's local hand-over of a permit: a
//!   release of a shared lease that passes it to a waiting task of the same
//!   process by the semaphore's admission rule, reservations included.
//! - [`etcd_late_copy`]: an etcd attempt's first write, sent again after a
//!   timeout, whose late copy lands after the attempt's release: a session
//!   epoch compared by every copy, against the variants weighed.
//! - [`sql_late_statement`]: a SQL grant statement of a lost connection,
//!   applied after its attempt's release: the lost connection's backend
//!   ended, and waited for, before any further statement.
//! - [`sql_pooled_loss`]: the same lost statement behind a pooler, where
//!   the backend cannot be named: the client's session rotated, so that a
//!   late grant lives with a session that is ended.
//! - [`pg_share_release`]: a PostgreSQL share's release and the gate's
//!   shrink in one statement, against the two transactions shipped: the
//!   fresh read that sees the statement's own delete, and the lock orders
//!   against a renewal's.
//! - [`pg_share_wakeup`]: whether a held share's release may leave its one
//!   notification to the gate function's, sent only if the gate row is
//!   marked `wanted` under its lock, against an unconditional one.
//!
//! The pieces both models share live in their own files: [`clock`] (how time
//! and clock drift are abstracted), [`network`] (a lossy, reordering network),
//! [`register`] (a fenced resource), [`grant_log`] (the order of grants) and
//! [`trace`] (a counterexample as readable steps).

pub mod clock;
pub mod downgrade;
pub mod etcd_late_copy;
pub mod fair_handoff;
pub mod fallback;
pub mod grant_log;
pub mod handover;
pub mod mysql_fence;
pub mod mysql_session;
pub mod network;
pub mod pg_fence;
pub mod pg_session;
pub mod pg_share_gate;
pub mod pg_share_release;
pub mod pg_share_wakeup;
pub mod pg_wakeup;
pub mod redis_cycle;
pub mod redlock;
pub mod register;
pub mod share_handover;
pub mod share_lanes;
pub mod sql_late_statement;
pub mod sql_pooled_loss;
pub mod sql_session;
pub mod trace;
pub mod zk_join;

/// The threads a test's complete exploration of a shipped design uses:
/// every core. `cargo test` runs one test binary at a time, and a binary's
/// one long exploration (a minute or more) would otherwise leave the other
/// cores idle; a complete exploration reaches the same states on any number
/// of threads.
pub fn exploration_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}
