//! Shared waiters of one client asking the store side by side (the lanes of
//! `backend::wait`, on the stores that grant shares side by side: SQLite and
//! Redis): when one release frees room for several sleeping waiters, every
//! one of them is granted at once, because a waiter granted after a refusal
//! passes the release's wake-up on (holdfast-models' `share_lanes`); without
//! that, the second waits for its fallback poll.

use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions};

/// A fallback poll far longer than the test waits for a wake-up: a waiter
/// granted sooner was woken, not polling.
const SLOW_POLL: &str = "poll_min_ms=8000&poll_max_ms=8000";

/// One client holds both permits of a semaphore of 2; two of its tasks wait
/// for one permit each (both refused, both asleep, both with a
/// reservation); the holder releases both in one call, which wakes one
/// waiter. Both must hold within a second, and keep holding (so that no
/// waiter's own release wakes the other).
async fn one_release_frees_two_sleeping_waiters(url: &str) {
    let client = Client::connect_with(url, ClientOptions::default().with_label("lanes")).await.expect("connect");
    let ttl = Duration::from_secs(60);
    let sem = client.semaphore("lanes", 2).ttl(ttl);
    let both = sem.acquire_many(2).await.expect("both permits");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (hold_tx, hold_rx) = tokio::sync::watch::channel(false);
    for _ in 0..2 {
        let (sem, tx, mut hold_rx) = (sem.clone(), tx.clone(), hold_rx.clone());
        tokio::spawn(async move {
            let permit = sem.acquire_timeout(Duration::from_secs(30)).await.expect("a waiter's permit");
            tx.send(Instant::now()).expect("report");
            let _ = hold_rx.wait_for(|done| *done).await;
            permit.release().await.expect("release");
        });
    }
    // Both waiters have asked and been refused (an attempt is a millisecond).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    both.release().await.expect("release both");
    let mut woken_after = Vec::new();
    for _ in 0..2 {
        let granted = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await.expect("a waiter stuck");
        woken_after.push(granted.expect("report").duration_since(released));
    }
    assert!(
        woken_after.iter().all(|d| *d < Duration::from_secs(1)),
        "waiters granted {woken_after:?} after the release: one slept until its poll"
    );
    hold_tx.send(true).expect("let go");
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_one_release_wakes_every_waiter_it_frees_room_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/lanes.db?{SLOW_POLL}", dir.path().display());
    one_release_frees_two_sleeping_waiters(&url).await;
}

#[cfg(feature = "redis")]
#[test]
fn redis_one_release_wakes_every_waiter_it_frees_room_for() {
    let server = holdfast_testkit::servers::redis::RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(one_release_frees_two_sleeping_waiters(&format!("{}/?{SLOW_POLL}", server.url())));
}
