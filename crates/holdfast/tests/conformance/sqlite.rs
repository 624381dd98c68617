//! SQLite: a fresh database file in a temp dir per test.

use std::time::Duration;

use holdfast_testkit::conformance::Store;

fn start() -> Store {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    Store {
        url,
        expiry_slack: Duration::from_millis(50),
        // A directory that cannot be created: the store cannot open.
        unreachable_url: "sqlite:///proc/holdfast-nowhere/locks.db".to_owned(),
        // No network between client and store: the fault clauses do not apply.
        via_proxy: None,
        in_process: None,
        server: Box::new(dir),
    }
}

holdfast_testkit::conformance_suite!(start);
