//! Stalls of the first store that are no outage: a Redis busy with a slow
//! script twice, with no call of the chain's client between. The client saw
//! one failure, then another a second later, and no success between, which
//! its count of failures took for a store failing all along: the chain
//! switched (every client then waits a mode TTL without grants). Before it
//! moves on, the chain now reads from the store once more, and a store that
//! answers stays.

use std::time::Duration;

use holdfast::backend::{AcquireRequest, Backend};
use holdfast::fallback::{Fallback, Mode};
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::servers::redis::RedisServer;

/// Switch after 200 ms of failures; a 1 s mode lease.
const OPTIONS: &str = "mode_ttl_ms=1000&switch_after_ms=200&fail_back_after_ms=0";
/// Longer than the chain's Redis timeout (300 ms), shorter than its probe (1 s).
const STALL: Duration = Duration::from_millis(600);

/// Keeps the Redis at `url` busy for `stall` with a script that spins on `TIME`.
async fn stall(url: String, stall: Duration) {
    const SPIN: &str = "local s = redis.call('TIME') \
        local start = tonumber(s[1]) * 1000000 + tonumber(s[2]) \
        repeat local t = redis.call('TIME') \
        until tonumber(t[1]) * 1000000 + tonumber(t[2]) - start >= tonumber(ARGV[1]) \
        return 1";
    let client = redis::Client::open(url).expect("redis client");
    let mut conn = client.get_multiplexed_async_connection().await.expect("raw connection");
    let _: redis::RedisResult<i64> =
        redis::cmd("EVAL").arg(SPIN).arg(0).arg(stall.as_micros() as u64).query_async(&mut conn).await;
}

fn request(key: &LockKey) -> AcquireRequest {
    AcquireRequest::new(key.clone(), OwnerToken::random(), Duration::from_secs(10))
}

/// For a `try_acquire` during each stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stalls_with_no_call_between_leave_the_chain_on_its_store() {
    two_stalls(false).await;
}

/// For a waiting `acquire` during each stall (the chain's other path to a
/// switch).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stalls_under_a_waiting_acquire_leave_the_chain_on_its_store() {
    two_stalls(true).await;
}

/// Two stalls a second apart, each met by one call of the chain (`wait`:
/// a waiting acquire, else a try), and no call between; then the chain must
/// still be on Redis, in its first epoch.
async fn two_stalls(wait: bool) {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!(
        "fallback://?{OPTIONS}|redis://127.0.0.1:{}?timeout_ms=300|sqlite://{}/arbiter.db",
        server.port(),
        dir.path().display()
    );
    let chain = Fallback::open_url(&url).await.expect("open the chain");
    let key = LockKey::new("stalls/k").expect("key");
    let warm = request(&key);
    chain.try_acquire(&warm).await.expect("a grant on Redis").expect("a free key");
    assert!(chain.release(&key, warm.token).await.expect("release"));

    for round in 0..2 {
        let stalling = tokio::spawn(stall(server.url(), STALL));
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Its own key: Redis applies the request after the script, unread.
        let during = LockKey::new(format!("stalls/during-{round}")).expect("key");
        let during = match wait {
            true => chain.acquire(&request(&during)).await.map(Some),
            false => chain.try_acquire(&request(&during)).await,
        };
        assert!(during.is_err(), "round {round}: a call during the stall answered: {during:?}");
        stalling.await.expect("the stall");
        if round == 0 {
            // Longer than switch_after, and no call of this client between.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    // A switch would have taken the record by now (the old mode lease ends
    // within a second), and the next grant would be the arbiter's, epoch 1.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = request(&key);
    let grant = chain.try_acquire(&after).await.expect("a grant after the stalls").expect("a free key");
    assert_eq!(chain.mode(), Some(Mode::START), "two stalls of a store that answers switched the chain");
    assert_eq!(grant.fence >> 52, 0, "the grant after the stalls is of another epoch: fence {:#x}", grant.fence);
    assert!(chain.release(&key, after.token).await.expect("release"));
}
