//! The conformance suite: one function per clause of the contract (C1..C11
//! in `shared/DESIGN.md`), run against a real store.
//!
//! A backend's test module calls [`conformance_suite!`](crate::conformance_suite)
//! with a function that starts its server and returns a [`Store`]; the macro
//! expands to one `#[test]` per clause, so a failure is named like
//! `sqlite::c1_exclusion`. Each clause checks the capabilities the store
//! declares and tests every declared one.

mod child;
mod clauses;

use std::any::Any;
use std::time::Duration;

pub use child::{c3_expiry_killed_process, child_entry, multi_process};
pub use clauses::*;

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
}

/// Expands to one test per clause for a store. `$start` is a path to a
/// `fn() -> Store` that starts a fresh server (blocking).
///
/// ```text
/// mod sqlite {
///     holdfast_testkit::conformance_suite!(super::start_sqlite);
/// }
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($start:path) => {
        $crate::conformance_suite!(@clauses $start;
            c1_exclusion, c2_fencing, c3_expiry, c4_ownership, c5_renewal, c5_lost_before_regrant,
            c6_waiting, c7_fairness, c8_reentrancy, c9_cancel_safety, c10_bad_input, c11_drop);

        #[test]
        fn multi_process() {
            $crate::conformance::child_entry(&$start);
            $crate::conformance::multi_process(module_path!(), "multi_process", &$start);
        }

        #[test]
        fn c3_expiry_killed_process() {
            $crate::conformance::child_entry(&$start);
            $crate::conformance::c3_expiry_killed_process(module_path!(), "c3_expiry_killed_process", &$start);
        }
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
