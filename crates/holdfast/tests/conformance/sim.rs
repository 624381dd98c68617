//! The simulated store (`holdfast_testkit::sim`) against the same clauses as
//! every real store, on the real clock and clean links, so that the model
//! the seeded fault runs explore cannot drift from the contract. The
//! clauses that start child processes do not apply: the store lives in this
//! process.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use holdfast::Error;
use holdfast_testkit::conformance::Store;
use holdfast_testkit::sim::{LinkFaults, LinkState, SimConfig, SimStore};

const URL: &str = "sim://store";
const UNREACHABLE: &str = "sim://unreachable";

fn start() -> Store {
    let store = SimStore::new(SimConfig::default(), None);
    let links = AtomicU64::new(0);
    let connect = move |url: &str| {
        let seed = links.fetch_add(1, Ordering::Relaxed);
        match url {
            URL => Ok(store.connect(seed, LinkFaults::default()).0),
            // A partitioned link: every call fails at the operation timeout.
            UNREACHABLE => {
                let (backend, link) = store.connect(seed, LinkFaults::default());
                link.set_state(LinkState::Partitioned);
                Ok(backend)
            }
            other => Err(Error::invalid("url", format!("no simulated store at {other:?}"))),
        }
    };
    Store {
        url: URL.to_owned(),
        expiry_slack: Duration::from_millis(50),
        unreachable_url: UNREACHABLE.to_owned(),
        server: Box::new(()),
        via_proxy: None,
        in_process: Some(Arc::new(connect)),
    }
}

holdfast_testkit::conformance_suite!(in_process start);
