//! Redis through Sentinel on real servers (a master, a replica, three
//! sentinels started by the testkit): a client follows the master through
//! a failover; how many grants a failover loses with and without
//! `replicas=1` (`WAIT`); and fences still protect a resource after a
//! failover lost a grant. Each test costs one failover (~2-3 s).
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error, MutexGuard};
use holdfast_testkit::servers::redis::RedisSentinel;

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

const MINUTE: Duration = Duration::from_secs(60);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

/// `options` appended to the sentinel URL of `set`.
fn url_with(set: &RedisSentinel, options: &str) -> String {
    if options.is_empty() { set.url() } else { format!("{}?{options}", set.url()) }
}

/// Acquires `n` locks `prefix/0..n` at once; returns each grant that
/// returned (key, fence, guard) and the number of acquires that failed.
async fn grant_many(c: &Client, prefix: &str, n: usize, ttl: Duration) -> (Vec<(String, u64, MutexGuard)>, usize) {
    let calls = (0..n).map(|i| {
        let key = format!("{prefix}/{i}");
        async move {
            let r = c.mutex(&key).ttl(ttl).acquire_timeout(Duration::from_secs(5)).await;
            (key, r)
        }
    });
    let mut granted = Vec::new();
    let mut failed = 0;
    for (key, r) in futures::future::join_all(calls).await {
        match r {
            Ok(g) => granted.push((key, g.fence(), g)),
            Err(e) => {
                assert!(e.is_retryable(), "a grant refused for want of replicas must be retryable: {e}");
                failed += 1;
            }
        }
    }
    (granted, failed)
}

/// How many of `grants` the server on `port` still holds (the lock hash
/// with the grant's fence).
async fn kept(port: u16, grants: &[(String, u64, MutexGuard)]) -> usize {
    let raw = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("client");
    let mut conn = raw.get_multiplexed_async_connection().await.expect("connect to the promoted master");
    let mut n = 0;
    for (key, fence, _) in grants {
        let f: Option<String> =
            redis::cmd("HGET").arg(format!("{{holdfast:{key}}}")).arg("f").query_async(&mut conn).await.expect("HGET");
        if f.as_deref() == Some(fence.to_string().as_str()) {
            n += 1;
        }
    }
    n
}

/// Acquires `key` until granted (the first calls after a failover may
/// fail while the client follows the master); panics after `within`.
async fn acquire_until(c: &Client, key: &str, within: Duration) -> MutexGuard {
    let deadline = Instant::now() + within;
    loop {
        match c.mutex(key).ttl(Duration::from_secs(10)).acquire_timeout(Duration::from_secs(2)).await {
            Ok(g) => return g,
            Err(e) if Instant::now() < deadline => {
                assert!(e.is_retryable() || matches!(e, Error::Timeout { .. }), "{e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("no grant of {key} within {within:?}: {e}"),
        }
    }
}

/// (a) A client keeps locking across a failover: the master is SIGKILLed
/// while a loop acquires and releases a lock every ~20 ms; the client
/// follows the promoted replica and grants again. A lease granted well
/// before the kill (so on the replica) stays held through it: its renewals
/// follow the master too.
#[test]
fn follows_the_master_through_a_failover() {
    let mut set = RedisSentinel::start();
    let url = set.url();
    rt().block_on(async {
        let c = client(&url, "follower").await;
        // A waiter that only pub/sub can wake in time (its fallback poll is 5 s),
        // connected before the failover and idle through it.
        let w = client(&format!("{url}?poll_min_ms=5000&poll_max_ms=5000"), "waiter").await;
        let held = c.mutex("sentinel/held").ttl(Duration::from_secs(10)).acquire().await.expect("acquire");
        let held_fence = held.fence();
        tokio::time::sleep(Duration::from_millis(300)).await; // replicated by now
        let looping = c.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let turns = tokio::spawn(async move {
            let mut grants: Vec<(Instant, u64)> = Vec::new();
            let mut errors = 0u32;
            let mut stop = rx;
            loop {
                if stop.try_recv().is_ok() {
                    return (grants, errors);
                }
                let call = looping.mutex("sentinel/loop").ttl(Duration::from_secs(5));
                match call.acquire_timeout(Duration::from_secs(1)).await {
                    Ok(g) => {
                        grants.push((Instant::now(), g.fence()));
                        let _ = g.release().await;
                    }
                    Err(_) => errors += 1,
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let killed_at = Instant::now();
        let old = tokio::task::block_in_place(|| set.kill_master());
        let (new, promoted_after) = tokio::task::block_in_place(|| set.wait_promoted(old, Duration::from_secs(20)));
        // Keep looping until the client granted on the new master.
        let deadline = Instant::now() + Duration::from_secs(15);
        let first_after = loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let probe = c.mutex("sentinel/probe").ttl(Duration::from_secs(5));
            if let Ok(Some(g)) = probe.try_acquire().await {
                let at = Instant::now();
                let _ = g.release().await;
                break at;
            }
            assert!(Instant::now() < deadline, "the client did not follow the master within 15 s");
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = tx.send(());
        let (grants, errors) = turns.await.expect("loop task");
        let first_loop_grant = grants.iter().find(|(t, _)| *t > killed_at).map(|(t, _)| *t - killed_at);
        let fences: Vec<u64> = grants.iter().map(|(_, f)| *f).collect();
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences of the loop must increase: {fences:?}");
        assert!(first_loop_grant.is_some(), "the loop never granted after the kill");
        // The lease granted before the kill is still held, renewed on the new master.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!held.is_lost(), "a lease replicated before the failover must survive it");
        assert_eq!(held.fence(), held_fence);
        println!(
            "failover {old} -> {new}: sentinels promoted after {promoted_after:?}; first grant of the loop {:?} \
             after the kill, of a probe {:?}; {} loop grants, {errors} failed turns",
            first_loop_grant.unwrap_or_default(),
            first_after - killed_at,
            grants.len()
        );
        assert!(first_loop_grant.unwrap_or_default() < Duration::from_secs(10));
        held.release().await.expect("release after the failover");
        // Pub/sub followed the master too: a release on the new master wakes
        // a waiter of another client well before its 5 s poll.
        let blocker = acquire_until(&c, "sentinel/wake", Duration::from_secs(5)).await;
        let waiting = tokio::spawn(async move {
            let g = w.mutex("sentinel/wake").ttl(Duration::from_secs(5)).acquire_timeout(Duration::from_secs(8)).await;
            (Instant::now(), g.map(|g| g.fence()))
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let released = Instant::now();
        blocker.release().await.expect("release");
        let (woke, granted) = waiting.await.expect("waiter");
        granted.expect("the waiter got the lock");
        let wake = woke - released;
        println!("after the failover, a waiter was woken {wake:?} after the release (its poll: 5 s)");
        assert!(wake < Duration::from_secs(2), "woken by its poll, not by pub/sub: {wake:?}");
    });
}

/// (b) Lost grants, healthy replica: two clients, one plain and one with
/// `replicas=1`, each take 200 locks at once; the master is SIGKILLed the
/// moment both are done. Counted on the promoted replica: grants whose hash
/// (with the grant's fence) is gone.
#[test]
fn grants_lost_when_the_master_dies_right_after_them() {
    let mut set = RedisSentinel::start();
    rt().block_on(async {
        let plain = client(&url_with(&set, ""), "plain").await;
        let waited = client(&url_with(&set, "replicas=1"), "waited").await;
        let master = set.master_port().expect("master");
        let ((p, p_failed), (w, w_failed)) = tokio::join!(
            grant_many(&plain, "healthy/plain", 200, MINUTE),
            grant_many(&waited, "healthy/wait", 200, MINUTE)
        );
        tokio::task::block_in_place(|| set.kill_node(master));
        let (new, took) = tokio::task::block_in_place(|| set.wait_promoted(master, Duration::from_secs(20)));
        let (p_kept, w_kept) = (kept(new, &p).await, kept(new, &w).await);
        println!(
            "healthy replica, kill right after the grants (promoted in {took:?}): without WAIT {} of {} grants lost \
             ({p_failed} acquires failed); with replicas=1 {} of {} acknowledged grants lost ({w_failed} failed)",
            p.len() - p_kept,
            p.len(),
            w.len() - w_kept,
            w.len()
        );
        assert_eq!(w_kept, w.len(), "a grant WAIT confirmed was lost");
        assert_eq!(p_failed, 0);
    });
}

/// (b) Lost grants, lagging replica, and (c) fences: the replica's link is
/// blackholed (the proxy it replicates through stops moving bytes), then a
/// plain client takes 50 locks and a `replicas=1` client tries 10; the
/// master is SIGKILLed and the replica promoted. Every plain grant is lost
/// and every `replicas=1` acquire failed (none was acknowledged, none is
/// lost). A new client is then granted a lock whose grant the failover
/// lost, while the old holder still believes it holds it: two holders. The
/// new fence is above the old one (fences are the server clock in µs,
/// `max(last + 1, TIME)`, and the promoted replica runs on the same clock
/// here), so a register that keeps the highest fence refuses the old
/// holder's late write. The old holder's `lost()` fires at its next renewal.
#[test]
fn lagging_replica_loses_unconfirmed_grants_and_fences_still_protect() {
    let mut set = RedisSentinel::start_with_replication_proxy();
    rt().block_on(async {
        let plain = client(&url_with(&set, ""), "plain").await;
        let waited = client(&url_with(&set, "replicas=1&replicas_timeout_ms=100"), "waited").await;
        let master = set.master_port().expect("master");
        set.replication_proxy().expect("proxy").blackhole();
        let (p, p_failed) = grant_many(&plain, "lag/plain", 50, Duration::from_secs(6)).await;
        let (w, w_failed) = grant_many(&waited, "lag/wait", 10, Duration::from_secs(6)).await;
        // The fenced resource: it keeps the highest fence it accepted.
        let mut register = 0u64;
        let mut write = |fence: u64| {
            if fence < register {
                return false;
            }
            register = fence;
            true
        };
        let (stale_key, stale_fence, stale_guard) = &p[0];
        assert!(write(*stale_fence), "the first write is accepted");
        tokio::task::block_in_place(|| set.kill_node(master));
        let (new, took) = tokio::task::block_in_place(|| set.wait_promoted(master, Duration::from_secs(20)));
        let (p_kept, w_kept) = (kept(new, &p).await, kept(new, &w).await);
        println!(
            "lagging replica (promoted in {took:?}): without WAIT {} of {} grants lost ({p_failed} failed); \
             with replicas=1 {} acquires refused unconfirmed, {} of {} acknowledged grants lost",
            p.len() - p_kept,
            p.len(),
            w_failed,
            w.len() - w_kept,
            w.len()
        );
        assert_eq!(w_kept, w.len(), "a grant WAIT confirmed was lost");
        assert_eq!(w.len(), 0, "no replica acknowledged, so no replicas=1 grant may have been returned");
        assert_eq!(p_kept, 0, "the replica saw none of the plain grants, so the failover loses all of them");

        // (c) The lost grant's key is free on the new master: a second holder.
        let other = client(&set.url(), "second").await;
        let second = acquire_until(&other, stale_key, Duration::from_secs(15)).await;
        assert!(
            second.fence() > *stale_fence,
            "the fence after the failover ({}) must be above the lost grant's ({stale_fence})",
            second.fence()
        );
        assert!(write(second.fence()), "the new holder's write is accepted");
        assert!(!write(*stale_fence), "the stale holder's late write must be refused");
        // The stale holder learns it at its next renewal (every ttl/3 = 2 s; it renews on the new master,
        // where another client holds the lock) at the latest.
        tokio::time::timeout(Duration::from_secs(10), stale_guard.lost()).await.expect("lost() of the stale holder");
        println!(
            "fence of the lost grant {stale_fence}, of the grant after the failover {} (+{} µs); the stale write was refused",
            second.fence(),
            second.fence() - stale_fence
        );
    });
}
