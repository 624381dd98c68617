//! A hand-over whose reply is lost (model: holdfast-models' `handover` and
//! `share_handover`, their `Fail` and late-copy paths), on a real server: the
//! releasing client's connection loses the hand-over call's reply after the
//! server applied it, then is cut. The releaser releases its own token, then
//! tells the waiter, which attempts and finds the handed grant as its own;
//! a copy of the call sent again finds no lease to hand. Whatever path the
//! client takes: the waiter is granted, nobody else is while it holds, and
//! once it releases the key is free at once (leases last 30 s).

use std::time::{Duration, Instant};

use holdfast::Client;
use holdfast_testkit::faults::FaultProxy;
use holdfast_testkit::servers::redis::RedisServer;

use super::{client, raw, rt};

/// A fallback poll far longer than the tests wait (see handover.rs).
const SLOW_POLL: &str = "poll_min_ms=20000&poll_max_ms=20000";
const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(20);

/// A lease of `key` taken by `client`: its mutex, or a permit of a
/// semaphore of one.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Mutex,
    Permit,
}

enum Lease {
    Guard(holdfast::MutexGuard),
    Permit(holdfast::Permit),
}

impl Lease {
    fn fence(&self) -> u64 {
        match self {
            Lease::Guard(g) => g.fence(),
            Lease::Permit(p) => p.fence(),
        }
    }

    async fn release(self) -> holdfast::Result<()> {
        match self {
            Lease::Guard(g) => g.release().await,
            Lease::Permit(p) => p.release().await,
        }
    }
}

async fn take(client: &Client, key: &str, kind: Kind, wait: Option<Duration>) -> holdfast::Result<Option<Lease>> {
    match kind {
        Kind::Mutex => {
            let m = client.mutex(key).ttl(TTL);
            match wait {
                Some(d) => m.acquire_timeout(d).await.map(|g| Some(Lease::Guard(g))),
                None => m.try_acquire().await.map(|g| g.map(Lease::Guard)),
            }
        }
        Kind::Permit => {
            let s = client.semaphore(key, 1).ttl(TTL);
            match wait {
                Some(d) => s.acquire_timeout(d).await.map(|p| Some(Lease::Permit(p))),
                None => s.try_acquire().await.map(|p| p.map(Lease::Permit)),
            }
        }
    }
}

/// What the server says holds `key`: the mutex's owner field, or the
/// tokens of the held share entries.
async fn holders(conn: &mut redis::aio::MultiplexedConnection, key: &str, kind: Kind) -> Vec<String> {
    let h = format!("{{holdfast:{key}}}");
    match kind {
        Kind::Mutex => {
            let o: Option<String> = redis::cmd("HGET").arg(&h).arg("o").query_async(conn).await.expect("hget");
            o.into_iter().collect()
        }
        Kind::Permit => {
            // Held entries (a waiter's reservation starts with 0).
            let entries: Vec<(String, String)> =
                redis::cmd("HGETALL").arg(format!("{h}:s")).query_async(conn).await.expect("hgetall");
            let mut held: Vec<String> =
                entries.into_iter().filter(|(_, v)| v.starts_with("1 ")).map(|(token, _)| token).collect();
            held.sort();
            held
        }
    }
}

/// When the network heals after the hand-over was applied.
#[derive(Clone, Copy, Debug)]
enum Heal {
    /// At once: the client sends the call again on a new connection.
    AtOnce,
    /// After the call's timeout (2 s) has passed: the call failed.
    AfterTimeout,
}

fn lost_hand_over_reply(kind: Kind, heal: Heal) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(format!("127.0.0.1:{}", server.port()).parse().expect("addr"));
    rt().block_on(async {
        let key = format!("handover-faults/{kind:?}/{heal:?}");
        let a = client(&format!("redis://{}/?{SLOW_POLL}&timeout_ms=2000", proxy.addr()), "a").await;
        let b = client(&server.url(), "b").await;
        let mut conn = raw(&server).await;

        let first = take(&a, &key, kind, Some(WAIT)).await.expect("acquire").expect("granted");
        let first_fence = first.fence();
        let waiter = {
            let (a, key) = (a.clone(), key.clone());
            tokio::spawn(async move { take(&a, &key, kind, Some(WAIT)).await })
        };
        // The waiter leaves its offer, asks once, and parks on its notification.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = holders(&mut conn, &key, kind).await;
        assert_eq!(before.len(), 1, "{kind:?}: one holder before the release, found {before:?}");

        proxy.drop_replies();
        let released_at = Instant::now();
        let releasing = tokio::spawn(async move { first.release().await });
        // The hand-over applied (the holder changed on the server) and its reply lost.
        loop {
            let now = holders(&mut conn, &key, kind).await;
            if now.len() == 1 && now != before && proxy.stats().bytes_dropped > 0 {
                break;
            }
            assert!(released_at.elapsed() < Duration::from_secs(5), "{kind:?}: no hand-over applied: {now:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if let Heal::AfterTimeout = heal {
            tokio::time::sleep(Duration::from_millis(2500)).await;
        }
        proxy.forward();
        tokio::task::block_in_place(|| proxy.cut());

        let released = tokio::time::timeout(WAIT, releasing).await.expect("release stuck").expect("task");
        match (heal, released) {
            (_, Ok(())) => {}
            // The call failed, and so may the release after it (the
            // network still silent); it goes on in the background.
            (Heal::AfterTimeout, Err(e)) => println!("{kind:?}: release during the fault: {e}"),
            (Heal::AtOnce, Err(e)) => panic!("{kind:?}: the releaser's release failed: {e}"),
        }
        let handed = tokio::time::timeout(WAIT, waiter).await.expect("waiter stuck").expect("task");
        let handed = handed.unwrap_or_else(|e| panic!("{kind:?}: the waiter was not granted: {e}")).expect("granted");
        assert!(handed.fence() > first_fence, "{kind:?}: fence {} after {first_fence}", handed.fence());
        let now = holders(&mut conn, &key, kind).await;
        assert_eq!(now.len(), 1, "{kind:?}: one holder while the waiter holds, found {now:?}");
        if let Kind::Mutex = kind {
            // The waiter's fence is the lock's last one: no copy of the call
            // handed the key again after the grant the waiter returned.
            let h = format!("{{holdfast:{key}}}");
            let last: u64 = redis::cmd("HGET").arg(&h).arg("f").query_async(&mut conn).await.expect("hget f");
            assert_eq!(handed.fence(), last, "{kind:?}: the waiter's fence is not the lock's last");
        }
        if let Some(other) = take(&b, &key, kind, None).await.expect("try") {
            panic!("{kind:?}: another client granted (fence {}) while the handed grant is held", other.fence());
        }
        handed.release().await.expect("the waiter's release");
        let next = take(&b, &key, kind, None).await.expect("try");
        let next = next.unwrap_or_else(|| panic!("{kind:?}: key not free after the waiter released"));
        assert!(next.fence() > first_fence);
        next.release().await.expect("release");
    });
}

/// `hand_over.lua`'s reply lost: a mutex handed to a waiting task of the
/// same client.
#[test]
fn a_mutex_hand_over_whose_reply_is_lost_grants_the_waiter_once() {
    lost_hand_over_reply(Kind::Mutex, Heal::AtOnce);
    lost_hand_over_reply(Kind::Mutex, Heal::AfterTimeout);
}

/// `share_hand_over.lua`'s reply lost: a permit handed to a waiting task of
/// the same client.
#[test]
fn a_permit_hand_over_whose_reply_is_lost_grants_the_waiter_once() {
    lost_hand_over_reply(Kind::Permit, Heal::AtOnce);
    lost_hand_over_reply(Kind::Permit, Heal::AfterTimeout);
}
