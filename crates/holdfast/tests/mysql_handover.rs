//! MySQL/MariaDB's local hand-over of a permit (`NAME_share_pass1`) when
//! the call's reply is lost (model 16, variant `MysqlPass`, its failure
//! path), on a real server: the releasing client's connection loses the
//! reply after the server committed the call, then is cut. The call times
//! out; the client ends that connection on the server before its next lock
//! statement, releases its own token (already gone), then tells the
//! waiter, which attempts and finds the handed permit as its own. Whatever
//! path the client takes: the waiter is granted, nobody else is while it
//! holds, and once it releases the key is free at once (leases last 30 s).
#![cfg(feature = "mysql")]

use std::time::{Duration, Instant};

use holdfast_testkit::faults::FaultProxy;
use holdfast_testkit::servers::mysql::{DATABASE, MysqlServer};

use crate::mysql::{client, rt};

const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(20);

/// The tokens (hex) of the key's held shares, on the server.
fn held(server: &MysqlServer, key: &str) -> Vec<String> {
    let out = server.sql(&format!(
        "SELECT HEX(token) FROM {DATABASE}.holdfast_shares
          WHERE lock_key = '{key}' AND held = 1 AND live_until > UTC_TIMESTAMP(6) ORDER BY token"
    ));
    out.lines().filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

#[test]
fn a_permit_hand_over_whose_reply_is_lost_grants_the_waiter_once() {
    let server = MysqlServer::start();
    let proxy = FaultProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], server.port())));
    let url = server.url().replace(&format!("127.0.0.1:{}", server.port()), &proxy.addr().to_string());
    let sep = if url.contains('?') { '&' } else { '?' };
    // A fallback poll far longer than the test waits: the waiter is served
    // by the hand-over or by its attempt after the release, not by a poll.
    // One connection, so that the hand-over's statement is prepared on it
    // before the fault (else its preparation's reply is what gets lost).
    let slow = format!("{url}{sep}timeout_ms=2000&poll_min_ms=20000&poll_max_ms=20000&pool_size=1");
    rt().block_on(async {
        let key = "handover-faults/permit";
        let a = client(&slow, "a").await;
        let b = client(&server.url(), "b").await;
        {
            let warm = a.semaphore("handover-faults/warm", 1).ttl(TTL);
            let held = warm.acquire().await.expect("warm-up permit");
            let waiter = tokio::spawn({
                let warm = warm.clone();
                async move { warm.acquire_timeout(WAIT).await }
            });
            tokio::time::sleep(Duration::from_millis(300)).await;
            held.release().await.expect("warm-up release");
            let handed = waiter.await.expect("task").expect("warm-up hand-over");
            handed.release().await.expect("release");
        }
        let sem = a.semaphore(key, 1).ttl(TTL);
        let first = sem.acquire().await.expect("the first permit");
        let first_fence = first.fence();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire_timeout(WAIT).await })
        };
        // The waiter leaves its offer, asks once, and waits.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = held(&server, key);
        assert_eq!(before.len(), 1, "one holder before the release, found {before:?}");

        proxy.drop_replies();
        let released_at = Instant::now();
        let releasing = tokio::spawn(async move { first.release().await });
        // The hand-over committed (the holder changed on the server) and its reply lost.
        loop {
            let now = held(&server, key);
            if now.len() == 1 && now != before && proxy.stats().bytes_dropped > 0 {
                break;
            }
            assert!(released_at.elapsed() < Duration::from_secs(5), "no hand-over applied: {now:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Past the call's timeout: the call failed.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        proxy.forward();
        tokio::task::block_in_place(|| proxy.cut());

        let released = tokio::time::timeout(WAIT, releasing).await.expect("release stuck").expect("task");
        if let Err(e) = released {
            // It may fail too (the connection was cut); it goes on in the background.
            println!("release during the fault: {e}");
        }
        let handed = tokio::time::timeout(WAIT, waiter).await.expect("waiter stuck").expect("task");
        let handed = handed.unwrap_or_else(|e| panic!("the waiter was not granted: {e}"));
        assert!(handed.fence() > first_fence, "fence {} after {first_fence}", handed.fence());
        let now = held(&server, key);
        assert_eq!(now.len(), 1, "one holder while the waiter holds, found {now:?}");
        let other = b.semaphore(key, 1).ttl(TTL).try_acquire().await.expect("try");
        assert!(other.is_none(), "another client granted while the handed permit is held");
        handed.release().await.expect("the waiter's release");
        let next = b.semaphore(key, 1).ttl(TTL).try_acquire().await.expect("try");
        let next = next.unwrap_or_else(|| panic!("key not free after the waiter released"));
        assert!(next.fence() > first_fence, "fence {} after {first_fence}", next.fence());
        next.release().await.expect("release");
    });
}
