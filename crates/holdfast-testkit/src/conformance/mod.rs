//! The conformance suite: one function per clause of the contract (C1..C19
//! in `docs/design.md`; C12..C15 are the shared leases, C16 elections, C17 the admin calls, C18 records kept
//! with a key, C19 tenants sharing one store, C20 shrinking a held lease), run against a real store, plus the fault clauses
//! (`f1`..`f6`: lost replies, failed releases, a hung or silent store, a
//! partition that heals; `c9_cancel_*`:
//! a future dropped at every suspension point) that use [`crate::faults`].
//!
//! A backend's test module calls [`conformance_suite!`](crate::conformance_suite)
//! with a function that starts its server and returns a [`Store`]; the macro
//! expands to one `#[test]` per clause, so a failure is named like
//! `sqlite::c1_exclusion`. Each clause checks the capabilities the store
//! declares and tests every declared one.

mod admin;
mod cancel;
mod child;
mod clauses;
mod election;
mod faults;
mod fence_floor;
mod late;
mod lost_replies;
mod members;
mod release;
mod scale;
mod shared;
mod shrink;
mod tenants;

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use holdfast::backend::Backend;
use holdfast::{Client, ClientOptions};

pub use admin::c17_admin;
pub use cancel::{c9_cancel_during_cleanup, c9_cancel_every_await, c9_cancel_first_suspension_repeated};
pub use child::{
    c3_expiry_killed_process, c12_permit_bound_processes, c14_read_write_processes, child_entry, multi_process,
};
pub use clauses::*;
pub use election::c16_election_safety;
pub use faults::{
    f3_release_while_unreachable, f3_shared_release_while_unreachable, f4_hung_store_while_waiting,
    f5_silent_store_at_the_deadline,
};
pub use fence_floor::c2_fence_floor;
pub use late::f6_abandoned_attempt_delivered_late;
pub use lost_replies::{
    f1_lost_acquire_reply, f1_lost_shared_acquire_reply, f2_lost_release_reply, f2_lost_shared_release_reply,
    f2_shared_release_cut_part_way,
};
pub use members::{
    Composite, m1_member_down_at_start, m2_member_down_mid_run, m3_member_back_again, m4_permits_through_an_outage,
};
pub use release::c4_release_repeated;
pub use scale::{queue_tasks_in_order, s1_hot_key_every_waiter_acquires};
pub use shared::{
    c9_cancel_shared_waits, c10_bad_shared_input, c12_permit_bound, c12_permit_count_lives_with_the_key,
    c13_dead_permits_return, c14_read_share_write_exclusion, c15_no_writer_starvation,
};
pub use shrink::{c20_downgrade, c20_partial_release, c20_shrink_refused};
pub use tenants::{c18_records, c19_tenants};

/// A store under test.
pub struct Store {
    /// A URL that reaches the running store.
    pub url: String,
    /// How much longer than a lease's TTL a vanished holder may keep the key
    /// (a session timeout on etcd/ZooKeeper; a few ms elsewhere).
    pub expiry_slack: Duration,
    /// A URL of this store's scheme where nothing listens.
    pub unreachable_url: String,
    /// The server handle, kept alive for the test and dropped (killed) after.
    pub server: Box<dyn Any + Send + Sync>,
    /// How to reach the server through a [`FaultProxy`](crate::faults::FaultProxy),
    /// for the fault clauses; `None` for a store with no network between
    /// client and store (SQLite), where those clauses do not apply.
    pub via_proxy: Option<ProxyTarget>,
    /// How an in-process store (the [simulated](crate::sim) one) connects a
    /// client to a URL, in place of holdfast's URL dispatch; `None` for
    /// every real store.
    pub in_process: Option<Connector>,
}

/// Connects a backend to an in-process store by URL (see [`Store::in_process`]).
pub type Connector = Arc<dyn Fn(&str) -> holdfast::Result<Arc<dyn Backend>> + Send + Sync>;

impl Store {
    /// A raw backend connection to `url` (the store's [`url`](Self::url) or
    /// its [`unreachable_url`](Self::unreachable_url)).
    pub async fn backend(&self, url: &str) -> holdfast::Result<Arc<dyn Backend>> {
        match &self.in_process {
            Some(connect) => connect(url),
            None => holdfast::stores::connect(url).await,
        }
    }

    /// A client of `url` with `options`.
    pub async fn client_at(&self, url: &str, options: ClientOptions) -> holdfast::Result<Client> {
        Ok(Client::with_backend(self.backend(url).await?, options))
    }
}

/// How a store's server is reached through a [`FaultProxy`](crate::faults::FaultProxy).
pub struct ProxyTarget {
    /// The server's address (one node is enough: the proxy forwards to it).
    pub upstream: SocketAddr,
    /// The store URL for a proxy listening at the given address. It sets the
    /// short operation timeout [`op_timeout`](Self::op_timeout), so that a
    /// call to a silent store ends quickly.
    pub url: Box<dyn Fn(SocketAddr) -> String + Send + Sync>,
    /// The operation timeout that URL sets: the longest one store call may
    /// wait for a reply.
    pub op_timeout: Duration,
}

impl ProxyTarget {
    /// A server on `127.0.0.1:port` whose direct URL is `direct_url` (with
    /// the options the proxied client should use, `op_timeout` among them):
    /// the proxied URL is the same with `127.0.0.1:port` replaced by the
    /// proxy's address. Panics if `direct_url` does not contain it.
    pub fn loopback(port: u16, direct_url: String, op_timeout: Duration) -> Self {
        let server = format!("127.0.0.1:{port}");
        assert!(direct_url.contains(&server), "{direct_url:?} does not name {server}");
        ProxyTarget {
            upstream: SocketAddr::from(([127, 0, 0, 1], port)),
            url: Box::new(move |proxy| direct_url.replacen(&server, &proxy.to_string(), 1)),
            op_timeout,
        }
    }
}

impl std::fmt::Debug for ProxyTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyTarget").field("upstream", &self.upstream).field("op_timeout", &self.op_timeout).finish()
    }
}

/// Expands to one test per clause for a store. `$start` is a path to a
/// `fn() -> Store` that starts a fresh server (blocking).
///
/// ```text
/// mod sqlite {
///     holdfast_testkit::conformance_suite!(super::start_sqlite);
/// }
/// ```
///
/// `conformance_suite!(in_process $start)` expands to the clauses that run
/// in this process only, for a store that lives in it (the simulated one):
/// the clauses that start child processes need a store those can reach.
#[macro_export]
macro_rules! conformance_suite {
    ($start:path) => {
        $crate::conformance_suite!(in_process $start);

        #[test]
        fn multi_process() {
            $crate::conformance::child_entry(&$start);
            $crate::conformance::multi_process(module_path!(), "multi_process", &$start);
        }

        #[test]
        fn c12_permit_bound_processes() {
            $crate::conformance::child_entry(&$start);
            $crate::conformance::c12_permit_bound_processes(module_path!(), "c12_permit_bound_processes", &$start);
        }

        #[test]
        fn c14_read_write_processes() {
            $crate::conformance::child_entry(&$start);
            $crate::conformance::c14_read_write_processes(module_path!(), "c14_read_write_processes", &$start);
        }

        #[test]
        fn c3_expiry_killed_process() {
            $crate::conformance::child_entry(&$start);
            $crate::conformance::c3_expiry_killed_process(module_path!(), "c3_expiry_killed_process", &$start);
        }
    };
    (in_process $start:path) => {
        $crate::conformance_suite!(@clauses $start;
            c1_exclusion, c2_fencing, c2_fence_floor, c3_expiry, c4_ownership, c4_release_repeated,
            c5_renewal, c5_lost_before_regrant,
            c6_waiting, c7_fairness, c8_reentrancy, c9_cancel_safety, c10_bad_input, c11_drop,
            c9_cancel_every_await, c9_cancel_during_cleanup, c9_cancel_first_suspension_repeated, c9_retry_refreshes_the_lease,
            f1_lost_acquire_reply, f1_lost_shared_acquire_reply, f2_lost_release_reply, f2_lost_shared_release_reply,
            f2_shared_release_cut_part_way, f3_release_while_unreachable, f3_shared_release_while_unreachable, f4_hung_store_while_waiting,
            f5_silent_store_at_the_deadline, f6_abandoned_attempt_delivered_late,
            s1_hot_key_every_waiter_acquires,
            c12_permit_bound, c12_permit_count_lives_with_the_key, c13_dead_permits_return,
            c14_read_share_write_exclusion, c15_no_writer_starvation, c9_cancel_shared_waits, c10_bad_shared_input,
            c16_election_safety, c17_admin, c18_records, c19_tenants,
            c20_downgrade, c20_partial_release, c20_shrink_refused);
    };
    (@clauses $start:path; $($clause:ident),*) => {
        $(
            #[test]
            fn $clause() {
                let store = $start();
                let rt = ::tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(4)
                    .enable_all()
                    .build()
                    .expect("tokio runtime");
                rt.block_on($crate::conformance::$clause(&store));
                drop(rt);
                drop(store);
            }
        )*
    };
}
