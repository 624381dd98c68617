//! The SQLite store's own tests: its connection thread.

use super::*;

async fn store(dir: &tempfile::TempDir) -> SqliteBackend {
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    SqliteBackend::open_url(&url).await.expect("opening the store")
}

/// Within a bound, so that a connection thread that died with the panic
/// (every later call queued and never answered) fails the test, not hangs it.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f).await.expect("the call was answered")
}

#[tokio::test]
async fn a_call_that_panics_leaves_the_connection_to_later_calls() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir).await;
    // A call that panics inside a transaction it opened: its caller gets
    // an error, the transaction is rolled back, the thread lives on.
    let e = within(s.with_conn(|conn| -> rusqlite::Result<()> {
        let tx = conn.transaction()?;
        tx.execute_batch("CREATE TABLE half_written (x INTEGER); INSERT INTO half_written VALUES (1);")?;
        panic!("a bug inside a call");
    }))
    .await
    .expect_err("a panicked call has no answer");
    assert!(e.to_string().contains("panicked"), "{e}");
    let left: i64 = within(s.with_conn(|conn| {
        conn.query_row("SELECT count(*) FROM sqlite_master WHERE name = 'half_written'", [], |r| r.get(0))
    }))
    .await
    .unwrap();
    assert_eq!(left, 0, "the panicked call's transaction was rolled back");
    let key = LockKey::new("after-the-panic").unwrap();
    let req = AcquireRequest::new(key.clone(), OwnerToken::random(), Duration::from_secs(5));
    let grant = within(s.try_acquire(&req)).await.unwrap().expect("the key is free");
    assert!(grant.fence > 0);
    assert!(within(s.release(&key, req.token)).await.unwrap());
}

#[tokio::test]
async fn dropping_the_store_ends_its_connection_thread() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir).await;
    let clone = s.clone();
    let shared = Arc::downgrade(&s.conn.shared);
    drop(s);
    // A clone keeps the thread: it still answers.
    within(clone.status(&LockKey::new("k").unwrap())).await.unwrap();
    assert!(shared.upgrade().is_some());
    drop(clone);
    // The thread holds the queues until it ends.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while shared.upgrade().is_some() {
        assert!(std::time::Instant::now() < deadline, "the connection thread still runs after the store was dropped");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
