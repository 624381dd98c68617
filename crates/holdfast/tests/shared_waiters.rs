//! A client's shared waiters on one key (semaphore permits, readers): they
//! take turns, so the store holds one waiting request per client and key
//! however many of its tasks wait, and when one release frees room for
//! several of them, each is granted at once (the one woken is granted and
//! hands the turn on; the next asks without sleeping).
//!
//! Asking side by side (up to as many of a client's shared waiters at once
//! as the limit admits) was shipped on 2026-11-30 and withdrawn the same
//! day: it won a one-process benchmark and lost with several processes,
//! where every client's extra waiters left reservations that each of the
//! store's admission reads goes through, and asked again on each release
//! (docs/performance.md, "shared waiters side by side, withdrawn").
//!
//! ZooKeeper's and etcd's shares wait side by side again, but only while
//! every entry of the key's queue they read is the client's own
//! (`stores/zookeeper/lanes.rs`, `stores/etcd/shares.rs`): beside another
//! client's entry a client keeps one waiting request, as everywhere else.

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
    let client = Client::connect_with(url, ClientOptions::default().with_label("waiters")).await.expect("connect");
    let ttl = Duration::from_secs(60);
    let sem = client.semaphore("two-waiters", 2).ttl(ttl);
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
    let url = format!("sqlite://{}/waiters.db?{SLOW_POLL}", dir.path().display());
    one_release_frees_two_sleeping_waiters(&url).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_one_release_wakes_every_waiter_it_frees_room_for() {
    let server = tokio::task::block_in_place(holdfast_testkit::servers::redis::RedisServer::start);
    one_release_frees_two_sleeping_waiters(&format!("{}/?{SLOW_POLL}", server.url())).await;
}

/// Three waiting tasks in each of two clients, for one permit each of a
/// semaphore of 2 that a third client holds whole: the store counts two
/// waiters (one per client), not six or four, and once the holder releases,
/// every task is granted in turn. `sqlite_file`: where SQLite keeps the
/// reservations (its status does not count waiters), read directly.
async fn one_waiting_request_per_client(url: &str, sqlite_file: Option<&std::path::Path>) {
    let connect = |label: &str| Client::connect_with(url, ClientOptions::default().with_label(label));
    let holder = connect("holder").await.expect("connect");
    let ttl = Duration::from_secs(60);
    let both = holder.semaphore("per-client", 2).ttl(ttl).acquire_many(2).await.expect("both permits");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut clients = Vec::new();
    for label in ["a", "b"] {
        let client = connect(label).await.expect("connect");
        for _ in 0..3 {
            let (sem, tx) = (client.semaphore("per-client", 2).ttl(ttl), tx.clone());
            tokio::spawn(async move {
                let permit = sem.acquire_timeout(Duration::from_secs(30)).await.expect("a waiter's permit");
                tokio::time::sleep(Duration::from_millis(20)).await;
                permit.release().await.expect("release");
                tx.send(()).expect("report");
            });
        }
        clients.push(client);
    }
    // Every task has asked, or waits for its client's turn.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let status = holder.status("per-client").await.expect("status");
    assert_eq!(status.shared.len(), 1, "the holder's grant: {status:?}");
    let waiters = match sqlite_file {
        Some(file) => rusqlite::Connection::open(file)
            .and_then(|db| {
                let sql = "SELECT COUNT(*) FROM holdfast_grants WHERE key = 'per-client' AND held = 0";
                db.query_row(sql, [], |row| row.get::<_, i64>(0))
            })
            .ok()
            .and_then(|n| u64::try_from(n).ok()),
        None => status.waiters,
    };
    assert_eq!(waiters, Some(2), "one waiting request per client in the store: {status:?}");
    both.release().await.expect("release both");
    for served in 0..6 {
        let done = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await;
        assert!(matches!(done, Ok(Some(()))), "{served} of 6 waiting tasks served, then none for 20 s");
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keeps_one_waiting_request_per_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("per-client.db");
    one_waiting_request_per_client(&format!("sqlite://{}", file.display()), Some(&file)).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_one_waiting_request_per_client() {
    let server = tokio::task::block_in_place(holdfast_testkit::servers::redis::RedisServer::start);
    one_waiting_request_per_client(&server.url(), None).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_keeps_one_waiting_request_per_client() {
    let cluster = tokio::task::block_in_place(holdfast_testkit::servers::etcd::EtcdCluster::start);
    one_waiting_request_per_client(&cluster.url(), None).await;
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_keeps_one_waiting_request_per_client() {
    let server = tokio::task::block_in_place(holdfast_testkit::servers::zookeeper::ZkServer::start);
    one_waiting_request_per_client(&server.url(), None).await;
}

/// A store that queues waiters (ZooKeeper, etcd), a semaphore of 4 whose
/// four permits a holder takes: one task
/// (W0) of the waiting client waits (alone: the first waiter of a key asks
/// alone), three more (W1-W3) start waiting behind it once W0's listing has
/// shown whose the queue is. One permit is released: W0 is granted, and the
/// store's queue then counts the waiting nodes of W1-W3 that joined. With
/// the holder the waiting client itself, they join side by side (3); with
/// the holder another client, one at a time (1).
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
async fn waiting_entries_after_one_grant(url: &str, own_holder: bool) -> Option<u64> {
    let connect = |label: &str| Client::connect_with(url, ClientOptions::default().with_label(label));
    let client = connect("waiting").await.expect("connect");
    let other = if own_holder { None } else { Some(connect("holder").await.expect("connect")) };
    let holder = other.as_ref().unwrap_or(&client);
    let ttl = Duration::from_secs(60);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(holder.semaphore("queue-of", 4).ttl(ttl).acquire().await.expect("a permit"));
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (hold_tx, hold_rx) = tokio::sync::watch::channel(false);
    let spawn_waiter = || {
        let (sem, tx, mut hold_rx) = (client.semaphore("queue-of", 4).ttl(ttl), tx.clone(), hold_rx.clone());
        tokio::spawn(async move {
            let permit = sem.acquire_timeout(Duration::from_secs(30)).await.expect("a waiter's permit");
            tx.send(()).expect("report");
            let _ = hold_rx.wait_for(|done| *done).await;
            permit.release().await.expect("release");
        })
    };
    let mut tasks = vec![spawn_waiter()];
    tokio::time::sleep(Duration::from_millis(500)).await;
    tasks.extend((0..3).map(|_| spawn_waiter()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(client.status("queue-of").await.expect("status").waiters, Some(1), "W0 waits alone");
    held.pop().expect("a held permit").release().await.expect("release one");
    tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("W0 granted").expect("report");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let waiting = client.status("queue-of").await.expect("status").waiters;
    for permit in held {
        permit.release().await.expect("release");
    }
    hold_tx.send(true).expect("let go");
    for served in 0..3 {
        let done = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await;
        assert!(matches!(done, Ok(Some(()))), "{served} of W1-W3 served, then none for 20 s");
    }
    for task in tasks {
        task.await.expect("a waiter panicked");
    }
    waiting
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_waits_side_by_side_while_the_queue_is_its_own() {
    let server = tokio::task::block_in_place(holdfast_testkit::servers::zookeeper::ZkServer::start);
    assert_eq!(waiting_entries_after_one_grant(&server.url(), true).await, Some(3), "W1-W3 side by side");
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_waits_alone_beside_another_clients_node() {
    let server = tokio::task::block_in_place(holdfast_testkit::servers::zookeeper::ZkServer::start);
    assert_eq!(waiting_entries_after_one_grant(&server.url(), false).await, Some(1), "one waiting node");
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_waits_side_by_side_while_the_queue_is_its_own() {
    let cluster = tokio::task::block_in_place(holdfast_testkit::servers::etcd::EtcdCluster::start);
    assert_eq!(waiting_entries_after_one_grant(&cluster.url(), true).await, Some(3), "W1-W3 side by side");
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_waits_alone_beside_another_clients_key() {
    let cluster = tokio::task::block_in_place(holdfast_testkit::servers::etcd::EtcdCluster::start);
    assert_eq!(waiting_entries_after_one_grant(&cluster.url(), false).await, Some(1), "one waiting key");
}
