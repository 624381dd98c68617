//! The fair queue: order, direct hand-off, rotation, dead waiters, and a
//! hand-off taken from its message (no claim request).

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use holdfast_testkit::servers::redis::RedisServer;

use super::{client, command_calls, raw, rt};

/// Fair mode: the lock goes straight to the head waiter at release (the
/// store shows it as holder before the waiter even runs again), a non-fair
/// try cannot jump in, and waiters are served in request order.
#[test]
fn fair_release_hands_off_to_the_head_waiter() {
    let server = RedisServer::start();
    rt().block_on(async {
        let url = server.url();
        let a = client(&url, "holder").await;
        let g = a.mutex("fair/handoff").fair(true).acquire().await.expect("acquire");
        let order = Arc::new(StdMutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..4 {
            let c = client(&url, &format!("w{i}")).await;
            let order = order.clone();
            waiters.push(tokio::spawn(async move {
                let g = c.mutex("fair/handoff").fair(true).acquire().await.expect("fair acquire");
                order.lock().expect("order").push(i);
                tokio::time::sleep(Duration::from_millis(50)).await;
                g.release().await.expect("release");
            }));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(a.status("fair/handoff").await.expect("status").waiters, Some(4));
        // Stop the head waiter's task from running before we look: the hand-off
        // itself happens inside the release script.
        let intruder = client(&url, "intruder").await;
        g.release().await.expect("release");
        let status = a.status("fair/handoff").await.expect("status");
        let holder = status.holder.expect("handed off, not free");
        assert_eq!(holder.label, "w0");
        assert!(
            intruder.mutex("fair/handoff").try_acquire().await.expect("try").is_none(),
            "a non-fair try took a lock being handed off"
        );
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(20), w).await.expect("waiter stuck").expect("task");
        }
        assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3]);
        assert_eq!(a.status("fair/handoff").await.expect("status").waiters, Some(0));
    });
}

/// Fair mode under contention: several clients, each re-requesting right
/// after its release, get turns in rotation (no client takes the lock straight
/// back while others wait).
#[test]
fn fair_mode_rotates_under_contention() {
    let server = RedisServer::start();
    rt().block_on(async {
        let url = server.url();
        let mut tasks = Vec::new();
        let owners = Arc::new(StdMutex::new(Vec::new()));
        let stop = Instant::now() + Duration::from_secs(2);
        for i in 0..6 {
            let c = client(&url, &format!("c{i}")).await;
            let owners = owners.clone();
            tasks.push(tokio::spawn(async move {
                let mut count = 0u32;
                while Instant::now() < stop {
                    let g = c.mutex("fair/rotate").fair(true).acquire().await.expect("acquire");
                    owners.lock().expect("owners").push(i);
                    count += 1;
                    g.release().await.expect("release");
                }
                count
            }));
        }
        let mut counts = Vec::new();
        for t in tasks {
            counts.push(tokio::time::timeout(Duration::from_secs(30), t).await.expect("stuck").expect("task"));
        }
        let (min, max) = (*counts.iter().min().unwrap_or(&0), *counts.iter().max().unwrap_or(&0));
        assert!(min > 0 && max <= 2 * min + 2, "unfair turns per client: {counts:?}");
        let owners = owners.lock().expect("owners");
        let repeats = owners.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(repeats * 10 <= owners.len(), "{repeats} immediate re-grants in {} grants", owners.len());
    });
}

/// A fair waiter that dies while queued (its future is never polled again and
/// never cleaned up, as in a crashed process) blocks the queue only until its
/// entry expires (`queue_ttl_ms`), not for the holder's TTL.
#[test]
fn dead_fair_waiter_does_not_block_the_queue() {
    let server = RedisServer::start();
    rt().block_on(async {
        let url = format!("{}?queue_ttl_ms=1000", server.url());
        let (a, dead, live) = (client(&url, "holder").await, client(&url, "dead").await, client(&url, "live").await);
        let g = a.mutex("fair/dead").fair(true).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let m = dead.mutex("fair/dead").fair(true).ttl(Duration::from_secs(30));
        let mut doomed = Box::pin(m.acquire());
        assert!(tokio::time::timeout(Duration::from_millis(200), &mut doomed).await.is_err());
        std::mem::forget(doomed); // no cleanup, no refresh: a dead waiter
        let waiter = tokio::spawn(async move {
            let g = live.mutex("fair/dead").fair(true).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
            let at = Instant::now();
            g.release().await.expect("release");
            at
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(a.status("fair/dead").await.expect("status").waiters, Some(2));
        let released = Instant::now();
        g.release().await.expect("release");
        let granted =
            tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("live waiter stuck").expect("task");
        let blocked = granted - released;
        // Entry lifetime 1 s (+ the 100 ms minimum claim window + a refresh period of slack).
        assert!(blocked < Duration::from_millis(2500), "the dead waiter blocked the queue for {blocked:?}");
        assert_eq!(a.status("fair/dead").await.expect("status").waiters, Some(0));
    });
}

/// A hand-off grants the head waiter by its message: the release is the
/// only script call between the holder's release and the waiter's grant (no
/// claim), and the grant's fence is the one the store wrote.
#[test]
fn a_hand_off_grants_the_head_by_its_message() {
    let server = RedisServer::start();
    rt().block_on(async {
        let url = server.url();
        let (a, b) = (client(&url, "holder").await, client(&url, "next").await);
        let mut conn = raw(&server).await;
        let g = a.mutex("fair/message").fair(true).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let waiter = tokio::spawn(async move {
            let g = b.mutex("fair/message").fair(true).ttl(Duration::from_secs(30)).acquire().await.expect("wait");
            (b, g)
        });
        // Queued, and well inside its first refresh period (500 ms).
        tokio::time::sleep(Duration::from_millis(150)).await;
        let before = command_calls(&mut conn, "fcall").await;
        let first_fence = g.fence();
        g.release().await.expect("release");
        let (b, next) = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("stuck").expect("task");
        let calls = command_calls(&mut conn, "fcall").await - before;
        assert_eq!(calls, 1, "{calls} script calls from the release to the grant: the head claimed");
        assert!(next.fence() > first_fence);
        let status = a.status("fair/message").await.expect("status");
        assert_eq!(status.holder.map(|h| (h.label, h.fence)), Some(("next".to_owned(), next.fence())));
        next.release().await.expect("release");
        drop(b);
    });
}

/// A grant taken from a hand-off message is valid only as long as the
/// waiter's last queue refresh vouches for (here under a second: a 1 s
/// queue entry TTL against a 6 s lock TTL); the holder renews it before
/// that, not a whole renewal period (2 s) after the grant, and keeps it.
#[test]
fn a_hand_off_taken_from_its_message_is_renewed_in_time() {
    let server = RedisServer::start();
    rt().block_on(async {
        let url = format!("{}?queue_ttl_ms=1000", server.url());
        let (a, b) = (client(&url, "holder").await, client(&url, "next").await);
        let mut conn = raw(&server).await;
        let ttl = Duration::from_secs(6);
        let g = a.mutex("fair/renewed").fair(true).ttl(ttl).acquire().await.expect("acquire");
        let waiter = tokio::spawn(async move {
            let g = b.mutex("fair/renewed").fair(true).ttl(ttl).acquire().await.expect("wait");
            (b, g)
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = command_calls(&mut conn, "fcall").await;
        g.release().await.expect("release");
        let (b, next) = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("stuck").expect("task");
        let calls = command_calls(&mut conn, "fcall").await - before;
        assert_eq!(calls, 1, "the waiter claimed ({calls} script calls), so this does not test a message grant");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(!next.is_lost(), "the grant taken from the message was not renewed before its end");
        let status = a.status("fair/renewed").await.expect("status");
        let holder = status.holder.expect("held");
        assert_eq!((holder.label.as_str(), holder.fence), ("next", next.fence()));
        let left = holder.ttl_left.expect("ttl left");
        assert!(left > Duration::from_secs(4), "renewed by the whole TTL, {left:?} left");
        next.release().await.expect("release");
        drop(b);
    });
}

/// A hand-off message older than the waiter's latest "queued" answer is not
/// taken: its fence is not above the lock's last fence as that answer found
/// it. (Such a message comes from an earlier hand-off to the same token whose
/// claim window ran out while the message was slow; another client may hold
/// the lock since: the fair_handoff model's counterexample to taking it.)
/// Sent here by hand, with the current holder's fence, to a waiter queued
/// behind that holder.
#[test]
fn a_stale_hand_off_message_is_not_taken() {
    let server = RedisServer::start();
    rt().block_on(async {
        let url = server.url();
        let (a, b) = (client(&url, "holder").await, client(&url, "next").await);
        let mut conn = raw(&server).await;
        let g = a.mutex("fair/stale").fair(true).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let m = b.mutex("fair/stale").fair(true).ttl(Duration::from_secs(30));
        let mut waiter = Box::pin(m.acquire());
        assert!(tokio::time::timeout(Duration::from_millis(150), &mut waiter).await.is_err(), "granted while held");
        // The waiter's token and client id, from its queue entry.
        let entries: Vec<(String, String)> =
            redis::cmd("HGETALL").arg("{holdfast:fair/stale}:e").query_async(&mut conn).await.expect("entries");
        let [(token, entry)] = &entries[..] else { panic!("one queued waiter expected: {entries:?}") };
        let client_id = entry.split(' ').nth(2).expect("client id");
        let message = format!("{token} {}", g.fence());
        let heard: i64 = redis::cmd("PUBLISH")
            .arg(format!("holdfast:c:{client_id}"))
            .arg(&message)
            .query_async(&mut conn)
            .await
            .expect("publish");
        assert_eq!(heard, 1, "the waiter's client channel has no subscriber");
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut waiter).await.is_err(),
            "the waiter took a stale hand-off message while the lock is held"
        );
        assert!(!g.is_lost());
        let first = g.fence();
        g.release().await.expect("release");
        let next = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("stuck").expect("wait");
        assert!(next.fence() > first);
        next.release().await.expect("release");
    });
}

/// The hand-off message tells a client of this version (its id ends in
/// `.f`) the fence too, and any other client (an older holdfast's, which
/// looks the whole payload up as a token and claims) the token alone. Two
/// waiters queued by hand, as a fair acquire writes them, one per lock.
#[test]
fn a_hand_off_message_carries_the_fence_only_to_clients_that_ask_for_it() {
    use futures::StreamExt;
    let server = RedisServer::start();
    rt().block_on(async {
        let a = client(&server.url(), "holder").await;
        let mut conn = raw(&server).await;
        let mut pubsub = redis::Client::open(server.url()).expect("client").get_async_pubsub().await.expect("pubsub");
        let (now_s, _): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.expect("time");
        let expires_ms = now_s * 1000 + 60_000;
        for (key, token, client_id) in [
            ("fair/older", "0123456789abcdef0123456789abcdef", "olderclient"),
            ("fair/newer", "fedcba9876543210fedcba9876543210", "newerclient.f"),
        ] {
            let g = a.mutex(key).fair(true).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
            let channel = format!("holdfast:c:{client_id}");
            pubsub.subscribe(&channel).await.expect("subscribe");
            let h = format!("{{holdfast:{key}}}");
            let entry = format!("{expires_ms} 30000 {client_id} queued-by-hand");
            let () = redis::pipe()
                .cmd("RPUSH")
                .arg(format!("{h}:q"))
                .arg(token)
                .ignore()
                .cmd("HSET")
                .arg(format!("{h}:e"))
                .arg(token)
                .arg(entry)
                .ignore()
                .cmd("HSET")
                .arg(&h)
                .arg("q")
                .arg("1")
                .ignore()
                .query_async(&mut conn)
                .await
                .expect("queue by hand");
            g.release().await.expect("release");
            let message = tokio::time::timeout(Duration::from_secs(5), pubsub.on_message().next())
                .await
                .expect("no hand-off message")
                .expect("message");
            assert_eq!(message.get_channel_name(), channel);
            let payload: String = message.get_payload().expect("payload");
            let holder = a.status(key).await.expect("status").holder.expect("handed off");
            assert_eq!(holder.label, "queued-by-hand");
            let expected =
                if client_id.ends_with(".f") { format!("{token} {}", holder.fence) } else { token.to_owned() };
            assert_eq!(payload, expected, "{key}");
            pubsub.unsubscribe(&channel).await.expect("unsubscribe");
        }
    });
}

/// A grant taken from a hand-off message keeps the `Backend` contract: its
/// start is taken before the request that earned it (the waiter's queue
/// request, so no earlier than the acquire call), and it is valid for what
/// the store keeps without a renewal: the claim window, the shorter of the
/// TTL and the queue entry's TTL. A composite that counts from the grant
/// (a fallback chain) then finds it live when `acquire` returns.
#[test]
fn a_hand_off_grant_starts_before_its_request_and_is_valid_for_the_claim_window() {
    use holdfast::backend::{AcquireRequest, Backend};
    use holdfast::stores::redis::RedisBackend;
    use holdfast::{LockKey, OwnerToken};
    let server = RedisServer::start();
    rt().block_on(async {
        let backend = Arc::new(RedisBackend::open_url(&server.url()).await.expect("open"));
        let mut conn = raw(&server).await;
        let key = LockKey::new("fair/honest").expect("key");
        let ttl = Duration::from_secs(30);
        let fair = |token| AcquireRequest::new(key.clone(), token, ttl).with_fair(true);
        let holder = OwnerToken::random();
        backend.acquire(&fair(holder)).await.expect("acquire");
        let called = Instant::now();
        let waiter = tokio::spawn({
            let (backend, req) = (backend.clone(), fair(OwnerToken::random()));
            async move { backend.acquire(&req).await.expect("wait") }
        });
        // Queued, and well inside its first refresh period (500 ms).
        tokio::time::sleep(Duration::from_millis(150)).await;
        let before = command_calls(&mut conn, "fcall").await;
        assert!(backend.release(&key, holder).await.expect("release"));
        let grant = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("stuck").expect("task");
        let returned = Instant::now();
        let calls = command_calls(&mut conn, "fcall").await - before;
        assert_eq!(calls, 1, "the waiter claimed ({calls} script calls), so this does not test a message grant");
        assert!(
            grant.attempt_started >= called,
            "the grant starts {:?} before the acquire call",
            called.saturating_duration_since(grant.attempt_started)
        );
        assert!(
            grant.valid_for <= Duration::from_secs(2),
            "valid for {:?}: longer than the claim window",
            grant.valid_for
        );
        assert!(grant.attempt_started + grant.valid_for > returned, "the grant had ended when acquire returned");
    });
}
