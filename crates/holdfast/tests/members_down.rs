//! Composites built while a member is down (issue 30): RedLock, layered and
//! fallback clients start during the outage they exist for, count the
//! unreachable member as a failed vote or a failing store, and take it back
//! once it answers; and RedLock's `try_acquire` settles split votes when a
//! member is down.
#![cfg(all(feature = "redlock", feature = "sqlite"))]

use std::sync::Arc;
use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error};
use holdfast_testkit::servers::redis::RedisServer;

fn redlock_url(servers: &[RedisServer]) -> String {
    let hosts: Vec<String> = servers.iter().map(|s| format!("127.0.0.1:{}", s.port())).collect();
    format!("redlock://{}?timeout_ms=1000", hosts.join(","))
}

fn redis_url(server: &RedisServer) -> String {
    format!("redis://127.0.0.1:{}?timeout_ms=1000", server.port())
}

async fn connect(url: &str) -> Client {
    let started = Instant::now();
    let client = Client::connect_with(url, ClientOptions::default().with_store_retry(Duration::from_secs(60)))
        .await
        .unwrap_or_else(|e| panic!("a composite with a member down must build: {e}"));
    // Building waits for one connection attempt per member, not for a
    // member to come back.
    assert!(started.elapsed() < Duration::from_secs(15), "building took {:?}", started.elapsed());
    client
}

/// A store error that names the store and the member's endpoint, retryable.
fn assert_names_member(err: &Error, store: &str, port: u16) {
    match err {
        Error::Backend { store: s, retryable: true, .. } => {
            let text = format!("{err}: {:?}", std::error::Error::source(err).map(ToString::to_string));
            assert_eq!(*s, store, "{text}");
            assert!(text.contains(&format!("127.0.0.1:{port}")), "the error must name the endpoint: {text}");
        }
        other => panic!("expected a retryable {store} error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_builds_with_a_member_down_and_takes_it_back() {
    let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let url = redlock_url(&servers);
    servers[2].kill();
    let c = connect(&url).await;
    let first = c.mutex("k").acquire_timeout(Duration::from_secs(20)).await.expect("a majority is up");
    let before = first.fence();
    first.release().await.expect("release");
    // The member comes back and is connected in the background: with
    // another member down the majority needs it.
    servers[2].restart();
    servers[0].kill();
    let g = c.mutex("k").acquire_timeout(Duration::from_secs(40)).await.expect("the member that came back votes");
    assert!(g.fence() > before, "fence {} not above {before}", g.fence());
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_with_every_member_down_builds_and_fails_retryably_until_a_majority_answers() {
    let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let url = redlock_url(&servers);
    for s in &mut servers {
        s.kill();
    }
    let c = connect(&url).await;
    match c.mutex("k").try_acquire().await {
        Err(e) => assert!(e.is_retryable() && matches!(e, Error::Backend { .. }), "{e:?}"),
        Ok(g) => panic!("nothing is up, yet {:?}", g.map(|g| g.fence())),
    }
    servers[0].restart();
    servers[1].restart();
    let g = c.mutex("k").acquire_timeout(Duration::from_secs(40)).await.expect("a majority came back");
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fallback_builds_with_its_first_store_down_and_grants_from_the_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut redis = RedisServer::start();
    redis.kill();
    let url = format!(
        "fallback://?switch_after_ms=200&mode_ttl_ms=1000|{}|sqlite://{}/arb.db",
        redis_url(&redis),
        dir.path().display()
    );
    let a = connect(&url).await;
    let b = connect(&url).await;
    let g = a.mutex("k").acquire_timeout(Duration::from_secs(60)).await.expect("the chain switches to the arbiter");
    // The grant comes from the second store, in a later epoch (fence bits 52 up).
    assert!(g.fence() >> 52 >= 1, "fence {:#x} is not from a switched chain", g.fence());
    assert!(b.mutex("k").try_acquire().await.expect("try").is_none(), "two holders");
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fallback_with_its_arbiter_down_builds_and_fails_retryably_until_it_answers() {
    let mut first = RedisServer::start();
    let mut arbiter = RedisServer::start();
    let url = format!("fallback://?mode_ttl_ms=1000|{}|{}", redis_url(&first), redis_url(&arbiter));
    arbiter.kill();
    let c = connect(&url).await;
    match c.mutex("k").try_acquire().await {
        Err(e) => assert_names_member(&e, "redis", arbiter.port()),
        Ok(g) => panic!("no arbiter, yet {:?}", g.map(|g| g.fence())),
    }
    arbiter.restart();
    let g = c.mutex("k").acquire_timeout(Duration::from_secs(40)).await.expect("the arbiter came back");
    g.release().await.expect("release");
    first.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn layered_builds_with_its_fast_store_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fast = RedisServer::start();
    fast.kill();
    let url = format!("layered://{}|sqlite://{}/auth.db", redis_url(&fast), dir.path().display());
    let a = connect(&url).await;
    let b = connect(&url).await;
    let g = a.mutex("k").acquire_timeout(Duration::from_secs(20)).await.expect("the authoritative store grants");
    assert!(b.mutex("k").try_acquire().await.expect("try").is_none(), "two holders");
    g.release().await.expect("release");
    // Back again: the fast store filters again (a key held there is busy
    // for a layered try).
    fast.restart();
    let fast_direct = holdfast::stores::connect(&redis_url(&fast)).await.expect("fast");
    let token = holdfast::OwnerToken::random();
    let req = holdfast::backend::AcquireRequest::new(
        holdfast::LockKey::new("f").expect("key"),
        token,
        Duration::from_secs(30),
    );
    fast_direct.try_acquire(&req).await.expect("block").expect("free");
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        // Skipped for FAST_RETRY_AFTER after each failure, then tried again:
        // once it is connected its holder blocks the layered try.
        if a.mutex("f").try_acquire().await.expect("try").is_none() {
            break;
        }
        assert!(Instant::now() < deadline, "the fast store was never taken back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn layered_builds_with_its_authoritative_store_down_and_names_it_in_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut auth = RedisServer::start();
    auth.kill();
    let url = format!("layered://sqlite://{}/fast.db|{}", dir.path().display(), redis_url(&auth));
    let c = connect(&url).await;
    match c.mutex("k").try_acquire().await {
        Err(e) => assert_names_member(&e, "redis", auth.port()),
        Ok(g) => panic!("no authoritative store, yet {:?}", g.map(|g| g.fence())),
    }
    auth.restart();
    let g = c.mutex("k").acquire_timeout(Duration::from_secs(40)).await.expect("the authoritative store came back");
    g.release().await.expect("release");
}

#[tokio::test]
async fn a_malformed_member_url_is_still_invalid_input_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    for url in [
        format!("fallback://redis://127.0.0.1:1?timeout_ms=abc|sqlite://{}/a.db", dir.path().display()),
        format!("layered://redis://127.0.0.1:1?nope=1|sqlite://{}/a.db", dir.path().display()),
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?nope=1".to_owned(),
    ] {
        match Client::connect(&url).await {
            Err(Error::InvalidInput { .. }) => {}
            other => panic!("{url}: expected InvalidInput, got {:?}", other.map(|_| ())),
        }
    }
}

/// Three members, one down, five clients `try_acquire` a free key at once:
/// exactly one wins, every round. (On main the live members split the vote
/// and nobody won in most rounds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redlock_try_acquire_with_a_member_down_has_one_winner_under_contention() {
    let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let url = redlock_url(&servers);
    let mut clients = Vec::new();
    for _ in 0..5 {
        clients.push(Arc::new(connect(&url).await));
    }
    servers[0].kill();
    let mut no_winner = 0;
    for round in 0..20 {
        let key = format!("split:{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(clients.len()));
        let tries = clients.iter().map(|c| {
            let (c, key, barrier) = (Arc::clone(c), key.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                c.mutex(&key).try_acquire().await
            })
        });
        let mut winners = Vec::new();
        for t in futures::future::join_all(tries).await {
            match t.expect("task") {
                Ok(Some(g)) => winners.push(g),
                Ok(None) => {}
                Err(e) => panic!("round {round}: a majority is up, yet {e}"),
            }
        }
        assert!(winners.len() <= 1, "round {round}: {} holders", winners.len());
        no_winner += usize::from(winners.is_empty());
        for g in winners {
            g.release().await.expect("release");
        }
    }
    assert_eq!(no_winner, 0, "{no_winner} of 20 rounds had no winner");
}
