//! Every store's and every composite's own tests (beyond the conformance
//! suite), in one test binary: each of these files used to be a binary of
//! its own, and each binary costs a full build and link of the client core
//! with its dependencies at the package's opt-level, which on CI's 2 cores
//! was most of the test build. Each module keeps its file and its
//! `#![cfg(feature)]`; tests are named as before with the file's name as
//! module (`redlock::one_member_down_still_grants_two_is_a_store_error`),
//! in the binary `stores`.

#[path = "admission/mod.rs"]
mod admission;
#[path = "badinput/main.rs"]
mod badinput;
#[path = "core.rs"]
mod core;
#[path = "election_observers.rs"]
mod election_observers;
#[path = "etcd/main.rs"]
mod etcd;
#[path = "fallback.rs"]
mod fallback;
#[path = "held_leases.rs"]
mod held_leases;
#[path = "late_acquire_sql.rs"]
mod late_acquire_sql;
#[path = "layered.rs"]
mod layered;
#[path = "leader_selector.rs"]
mod leader_selector;
#[path = "least_privilege.rs"]
mod least_privilege;
#[path = "members_down.rs"]
mod members_down;
#[path = "multi.rs"]
mod multi;
#[path = "mysql.rs"]
mod mysql;
#[path = "mysql_faults.rs"]
mod mysql_faults;
#[path = "mysql_fences.rs"]
mod mysql_fences;
#[path = "mysql_session_leases.rs"]
mod mysql_session_leases;
#[path = "mysql_session_rows.rs"]
mod mysql_session_rows;
#[path = "mysql_sessions.rs"]
mod mysql_sessions;
#[path = "mysql_shares.rs"]
mod mysql_shares;
#[path = "observability/mod.rs"]
mod observability;
#[path = "postgres.rs"]
mod postgres;
#[path = "postgres_common.rs"]
mod postgres_common;
#[path = "postgres_connections.rs"]
mod postgres_connections;
#[path = "postgres_faults.rs"]
mod postgres_faults;
#[path = "postgres_fences.rs"]
mod postgres_fences;
#[path = "postgres_history.rs"]
mod postgres_history;
#[path = "postgres_lost_backend.rs"]
mod postgres_lost_backend;
#[path = "postgres_sessions.rs"]
mod postgres_sessions;
#[path = "postgres_wakeups.rs"]
mod postgres_wakeups;
#[path = "redis.rs"]
mod redis;
#[path = "redis_cluster.rs"]
mod redis_cluster;
#[path = "redis_sentinel.rs"]
mod redis_sentinel;
#[path = "redlock.rs"]
mod redlock;
#[path = "redlock_rounds.rs"]
mod redlock_rounds;
#[path = "registry.rs"]
mod registry;
#[path = "segmented.rs"]
mod segmented;
#[path = "shared_waiters.rs"]
mod shared_waiters;
#[path = "sqlite.rs"]
mod sqlite;
#[path = "sqlite_sessions.rs"]
mod sqlite_sessions;
#[path = "zookeeper/main.rs"]
mod zookeeper;
