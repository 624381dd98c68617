//! What the properties found, kept as plain tests with the failing input.

use std::time::Duration;

use holdfast::Client;

#[cfg(feature = "sqlite")]
async fn sqlite() -> (tempfile::TempDir, Client) {
    let dir = tempfile::tempdir().expect("temp dir");
    let client = Client::connect(&format!("sqlite://{}/found.db", dir.path().display())).await.expect("connect");
    (dir, client)
}

/// `acquire_timeout`, the `wait_timeout` option, `max_hold` and
/// `expiring` added the caller's duration to `Instant::now()`, which
/// panics past the clock's range ("overflow when adding duration to
/// instant"; found with `Duration::MAX`). A duration that long is no limit.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn durations_past_the_clock_are_no_limit() {
    let (_dir, c) = sqlite().await;
    let far = Duration::MAX;
    let g = c.mutex("far").acquire_timeout(far).await.expect("acquire_timeout(MAX)");
    g.release().await.expect("release");
    let g = c.mutex("far").wait_timeout(far).acquire().await.expect("wait_timeout(MAX)");
    g.release().await.expect("release");
    let sem = c.semaphore("far-sem", 3);
    let p = sem.acquire_many_timeout(2, far).await.expect("acquire_many_timeout(2, MAX)");
    p.release().await.expect("release");
    let p = sem.clone().wait_timeout(far).acquire_many(3).await.expect("wait_timeout(MAX).acquire_many");
    p.release().await.expect("release");
    let g = c.mutex("far").max_hold(far).try_acquire().await.expect("max_hold(MAX)").expect("free");
    // A lease cannot be guaranteed for longer than the clock counts: at once.
    tokio::time::timeout(Duration::from_secs(5), g.expiring(far)).await.expect("expiring(MAX) resolves at once");
    assert!(!g.is_lost());
    g.release().await.expect("release");
}

/// etcd with `timeout_ms` below 250 (200, as the garbage-peer cases use):
/// the session's keep-alive task computed its per-try limit with
/// `clamp(250 ms, timeout)`, which panics when the timeout is the smaller,
/// so the task died at its first keep-alive and the session was never
/// renewed. Found by `garbage_etcd` (a relayed case that got a session).
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_timeout_below_250_ms_keeps_its_session() {
    let cluster = tokio::task::block_in_place(holdfast_testkit::servers::etcd::EtcdCluster::start);
    let url = format!("{}?timeout_ms=200&session_timeout_ms=1000", cluster.url());
    let client = Client::connect(&url).await.expect("connect");
    let g = client.mutex("short-timeout").ttl(Duration::from_secs(1)).acquire().await.expect("acquire");
    // Three session TTLs: only a renewing keep-alive task keeps it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!g.is_lost(), "the session was lost: its keep-alive task died");
    // The release has the same 200 ms bound, which a loaded machine can
    // overrun (once, in a full run on 2 cores): then a retryable timeout.
    match g.release().await {
        Ok(_) => {}
        Err(e) if e.is_retryable() => {}
        Err(e) => panic!("release: {e:?}"),
    }
}

/// Labels (and election values, which are labels) were stored unchecked:
/// a NUL failed on PostgreSQL after I/O ("invalid byte sequence for
/// encoding UTF8: 0x00"), 2.7 MB failed on etcd after I/O
/// (`ResourceExhausted`), and about 1 MiB made the ZooKeeper server drop
/// the connection, taking the client's session (and every lease on it)
/// with it. Now a label is at most 4096 bytes without NUL, checked before
/// any I/O on every store.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn labels_are_checked_before_any_io() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/labels.db", dir.path().display());
    for (label, ok) in [
        ("\0".to_owned(), false),
        ("m".repeat(1 << 20), false),
        ("v".repeat(4097), false),
        ("v".repeat(4096), true),
        ("é\u{1}".to_owned(), true),
    ] {
        let options = holdfast::ClientOptions::default().with_label(label.clone());
        let c = Client::connect_with(&url, options).await.expect("connect");
        match c.mutex("labelled").try_acquire().await {
            Ok(Some(g)) if ok => g.release().await.expect("release"),
            Err(holdfast::Error::InvalidInput { what: "label", .. }) if !ok => {}
            other => panic!("label of {} bytes: {other:?}", label.len()),
        }
        match c.election("elected").campaign(label.clone()).await {
            Ok(l) if ok => l.resign().await.expect("resign"),
            Err(holdfast::Error::InvalidInput { what: "value", .. }) if !ok => {}
            other => panic!("election value of {} bytes: {other:?}", label.len()),
        }
    }
}

/// PostgreSQL: a shared acquire (a semaphore permit, a reader, a writer)
/// is one transaction on the store's transaction connection. One dropped
/// between its statements (a short wait timeout, a caller's own timeout;
/// found by `inputs_postgres`, seed 110: a writer with `wait_timeout` of
/// 35 µs, after which every later case on the backend hung) left
/// that connection idle in its transaction, holding the row locks it had
/// taken: the gate row of its key and, once it had drawn a fence, the
/// namespace's fence counter. It was only marked broken, and closed by the
/// next shared call; until one came, every grant of a free key waited for
/// the counter's row lock, each statement pipelined behind it on the same
/// connection waited too, and every acquire and release of the backend
/// failed with "timed out after 5s" (or hung, with an endless
/// `store_retry`). Now an abandoned transaction's connection is closed at
/// once, so the server rolls it back.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::async_yields_async,
    reason = "the sweep's setup returns the operation's future, unpolled, for the harness to count"
)]
async fn postgres_dropped_shared_acquire_leaves_no_transaction_open() {
    use holdfast_testkit::faults::cancel_at_each_suspension;
    /// Far above a free key's grant on loopback, below the store's 5 s bound.
    const QUICK: Duration = Duration::from_secs(3);
    let server = tokio::task::block_in_place(holdfast_testkit::servers::postgres::PostgresServer::start);
    let client = Client::connect(&server.url()).await.expect("connect");
    // A grant of a free key and its release, on the same backend: neither
    // must wait for what a dropped attempt left.
    let later_calls_work = async |what: String| {
        let key = format!("after/{what}");
        let g = tokio::time::timeout(QUICK, client.mutex(key.as_str()).try_acquire())
            .await
            .unwrap_or_else(|_| panic!("{what}: a free key's grant took over {QUICK:?}"))
            .unwrap_or_else(|e| panic!("{what}: acquire failed: {e:?}"))
            .expect("a free key is granted");
        tokio::time::timeout(QUICK, g.release())
            .await
            .unwrap_or_else(|_| panic!("{what}: release took over {QUICK:?}"))
            .unwrap_or_else(|e| panic!("{what}: release failed: {e:?}"));
    };
    let sem = client.semaphore("dropped/permits", 64).ttl(Duration::from_secs(30));
    let sweep = cancel_at_each_suspension(
        200,
        async |_| {
            let sem = sem.clone();
            async move { sem.try_acquire_many(1).await }
        },
        async |n| later_calls_work(format!("permit dropped at suspension {n}")).await,
    )
    .await;
    assert!(sweep.drops > 0, "the permit's acquire never suspended");
    let permit = sweep.output.expect("completed").expect("try_acquire_many").expect("a free semaphore grants");
    permit.release().await.expect("release");
    later_calls_work("the sweep".to_owned()).await;
}
