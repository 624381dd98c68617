//! What a release tells waiters, now that the hot path skips work when
//! nobody waits: a release publishes only when a waiter marked the lock, and
//! a non-fair call reads the fair queue only when the lock says a fair waiter
//! queued. Both must still wake and order every waiter that is there.

use std::time::{Duration, Instant};

use holdfast_testkit::servers::redis::RedisServer;

use super::{client, command_calls, raw, rt};

/// A fallback poll far longer than the test waits for a wake-up: a waiter
/// granted sooner was woken by the release's message, not by polling.
const SLOW_POLL: &str = "poll_min_ms=20000&poll_max_ms=20000";

#[test]
fn a_release_publishes_only_when_a_waiter_marked_the_lock() {
    let server = RedisServer::start();
    rt().block_on(async {
        let url = format!("{}/?{SLOW_POLL}", server.url());
        let (a, b) = (client(&url, "a").await, client(&url, "b").await);
        let mut conn = raw(&server).await;
        let ttl = Duration::from_secs(30);

        // Nobody waits: no message.
        let before = command_calls(&mut conn, "publish").await;
        for _ in 0..20 {
            a.mutex("wake").ttl(ttl).acquire().await.expect("acquire").release().await.expect("release");
        }
        assert_eq!(command_calls(&mut conn, "publish").await - before, 0, "published with nobody waiting");

        // A waiter of another client: one message, and it wakes the waiter at once.
        let held = a.mutex("wake").ttl(ttl).acquire().await.expect("acquire");
        let waiter = tokio::spawn({
            let b = b.clone();
            async move {
                let g = b.mutex("wake").ttl(ttl).acquire_timeout(Duration::from_secs(15)).await.expect("wait");
                let granted = Instant::now();
                g.release().await.expect("release");
                granted
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = command_calls(&mut conn, "publish").await;
        let released = Instant::now();
        held.release().await.expect("release");
        let granted = tokio::time::timeout(Duration::from_secs(15), waiter).await.expect("waiter stuck").expect("task");
        let woken_after = granted.duration_since(released);
        assert!(
            woken_after < Duration::from_secs(3),
            "waiter woken after {woken_after:?}: by the poll, not the release"
        );
        // The waiter's own release publishes too (its mark lasts a while): at
        // least the holder's message, and no message per attempt.
        let published = command_calls(&mut conn, "publish").await - before;
        assert!((1..=2).contains(&published), "{published} messages for one waiter");

        // A writer waiting behind a reader: the reader's release wakes it.
        let reader = a.rwlock("wake-rw").read().ttl(ttl).acquire().await.expect("read");
        let writer = tokio::spawn({
            let b = b.clone();
            async move {
                let g = b.rwlock("wake-rw").write().ttl(ttl).acquire_timeout(Duration::from_secs(15)).await;
                let granted = Instant::now();
                g.expect("write").release().await.expect("release");
                granted
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        reader.release().await.expect("release");
        let granted = tokio::time::timeout(Duration::from_secs(15), writer).await.expect("writer stuck").expect("task");
        let woken_after = granted.duration_since(released);
        assert!(woken_after < Duration::from_secs(3), "writer woken after {woken_after:?}: by the poll");
    });
}

/// The lock is free (its holder's lease ran out, no release) and a fair
/// waiter is queued: a non-fair call must leave the lock to the queue. The
/// non-fair script finds the queue only through the lock's mark, which the
/// fair waiter wrote when it queued.
#[test]
fn a_non_fair_call_defers_to_a_fair_waiter_queued_behind_an_expired_lease() {
    let server = RedisServer::start();
    rt().block_on(async {
        let url = server.url();
        let (a, b, c) = (client(&url, "a").await, client(&url, "b").await, client(&url, "c").await);
        let mut conn = raw(&server).await;
        let held = a.mutex("queued").ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let fair = tokio::spawn({
            let b = b.clone();
            async move {
                let g = b.mutex("queued").fair(true).acquire_timeout(Duration::from_secs(20)).await.expect("fair wait");
                let fence = g.fence();
                g.release().await.expect("release");
                fence
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The holder's lease ends behind its back (as if it had stopped
        // renewing): the lock is free, with the fair waiter queued.
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.expect("time");
        let now_ms = secs * 1000 + micros / 1000;
        let _: () = redis::cmd("HSET")
            .arg("{holdfast:queued}")
            .arg("x")
            .arg(now_ms - 1)
            .query_async(&mut conn)
            .await
            .expect("expire the lease");
        assert!(
            c.mutex("queued").try_acquire().await.expect("try").is_none(),
            "a non-fair try took the lock ahead of a queued fair waiter"
        );
        let fence =
            tokio::time::timeout(Duration::from_secs(20), fair).await.expect("fair waiter stuck").expect("task");
        assert!(fence > held.fence());
        drop(held);
    });
}

/// A share's release recomputes the lock's latest share expiry (`sx`, which
/// an exclusive acquire reads to refuse while shares live) from the held
/// shares left. Released in either order, two readers leave the key free
/// at once for a mutex, and one reader left still refuses it (a release
/// that kept a stale `sx`, or dropped it while a share lives, fails here).
#[test]
fn shares_released_in_either_order_free_the_key_at_once() {
    let server = RedisServer::start();
    rt().block_on(async {
        let c = client(&server.url(), "sx").await;
        for (key, latest_first) in [("sx-a", true), ("sx-b", false)] {
            let early = c.rwlock(key).read().ttl(Duration::from_secs(30)).acquire().await.expect("read");
            tokio::time::sleep(Duration::from_millis(20)).await;
            let late = c.rwlock(key).read().ttl(Duration::from_secs(30)).acquire().await.expect("read");
            let (first, second) = if latest_first { (late, early) } else { (early, late) };
            first.release().await.expect("release");
            assert!(
                c.mutex(key).try_acquire().await.expect("try").is_none(),
                "{key}: a mutex granted beside a held reader"
            );
            second.release().await.expect("release");
            let g = c.mutex(key).try_acquire().await.expect("try");
            assert!(g.is_some(), "{key}: both readers released, the key still refused a mutex");
            g.expect("granted").release().await.expect("release");
        }
    });
}
