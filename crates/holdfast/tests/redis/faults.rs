//! Lost replies and clock trouble, through the raw store calls
//! (`holdfast::stores::connect`): a retried acquire, a re-sent release, a
//! fence kept past a lease that expired, and what one uncontended
//! acquisition costs the server, and a retry behind a waiting writer.

use std::collections::BTreeMap;
use std::time::Duration;

use holdfast::backend::{AcquireRequest, Backend, Grant, RenewRequest};
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::servers::redis::RedisServer;

use super::{client, raw, rt};

/// A request, and whether it is made by a waiting acquire or one try.
#[derive(Clone)]
struct Request {
    req: AcquireRequest,
    wait: bool,
}

impl std::ops::Deref for Request {
    type Target = AcquireRequest;
    fn deref(&self) -> &AcquireRequest {
        &self.req
    }
}

fn request(key: &str, token: OwnerToken, ttl: Duration, wait: bool, fair: bool) -> Request {
    let req = AcquireRequest::new(LockKey::new(key).expect("key"), token, ttl).with_label("faults").with_fair(fair);
    Request { req, wait }
}

/// Makes the request's attempt: a try, or a waiting acquire.
async fn attempt(backend: &dyn Backend, r: &Request) -> holdfast::Result<Option<Grant>> {
    if r.wait { backend.acquire(&r.req).await.map(Some) } else { backend.try_acquire(&r.req).await }
}

/// The lease time the server has left for lock `key`, by its own clock: the
/// lease's end (field `x` of the lock's hash, server ms) minus `TIME`. The
/// hash itself outlives the lease, to keep the lock's fence.
async fn lease_left(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Duration {
    let end: Option<i64> =
        redis::cmd("HGET").arg(format!("{{holdfast:{key}}}")).arg("x").query_async(conn).await.expect("hget x");
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await.expect("time");
    let now_ms = secs * 1000 + micros / 1000;
    Duration::from_millis((end.unwrap_or(0) - now_ms).max(0) as u64)
}

/// The hash of lock `key` carries fence `f`: overwrite it, as if the server's
/// clock had stepped back below the last fence.
async fn set_last_fence(conn: &mut redis::aio::MultiplexedConnection, key: &str, fence: u64) {
    let _: () = redis::cmd("HSET")
        .arg(format!("{{holdfast:{key}}}"))
        .arg("f")
        .arg(fence.to_string())
        .query_async(conn)
        .await
        .expect("hset f");
}

/// An acquire whose reply was lost is sent again with the same token. The
/// retry gets the same grant and a lease of its TTL from the retry on, since
/// the client counts its lease from the retry: otherwise the client believes
/// ~1 s remains while the server frees the key ~0.4 s later (two holders).
/// Every path: a try, a waiting acquire, and both in fair mode.
#[test]
fn retried_acquire_extends_the_lease_to_its_ttl() {
    let server = RedisServer::start();
    rt().block_on(async {
        let backend = holdfast::stores::connect(&server.url()).await.expect("connect");
        let ttl = Duration::from_millis(1000);
        let conn = raw(&server).await;
        let runs = [(false, false), (true, false), (false, true), (true, true)].map(|(wait, fair)| {
            let (backend, mut conn) = (backend.clone(), conn.clone());
            async move {
                let key = format!("retry/wait={wait}/fair={fair}");
                let req = request(&key, OwnerToken::random(), ttl, wait, fair);
                let first = attempt(&*backend, &req).await.expect("acquire").expect("a free key is granted");
                tokio::time::sleep(Duration::from_millis(600)).await;
                let again = attempt(&*backend, &req).await.expect("retry").expect("the retry gets the grant");
                assert_eq!(again.fence, first.fence, "{key}: a retry must return the same fence");
                let left = lease_left(&mut conn, &key).await;
                assert!(left > Duration::from_millis(800), "{key}: {left:?} left on the server after the retry");
                let status = backend.status(&req.key).await.expect("status");
                let store_left = status.holder.and_then(|h| h.ttl_left).expect("held, with a ttl");
                assert!(store_left > Duration::from_millis(800), "{key}: status says {store_left:?} left");
                assert!(backend.release(&req.key, req.token).await.expect("release"));
            }
        });
        futures::future::join_all(runs).await;
    });
}

/// A release sent again by the same token, as a separate call, owns nothing
/// and says so (`Ok(false)`, the `Backend::release` contract; conformance
/// `c4_release_repeated`), also when the first copy handed the lock to a
/// fair waiter, and it takes nothing from the waiter. (A call that re-sends
/// its own request after a lost connection counts its first copy's release:
/// `a_release_resent_after_a_lost_connection_says_released`.) A token that
/// never held the lock, or whose lease ran out unreleased, gets false too.
#[test]
fn a_release_repeated_by_the_same_token_says_not_held() {
    let server = RedisServer::start();
    rt().block_on(async {
        let backend = holdfast::stores::connect(&server.url()).await.expect("connect");
        let ttl = Duration::from_secs(10);

        let req = request("release/twice", OwnerToken::random(), ttl, false, false);
        attempt(&*backend, &req).await.expect("acquire").expect("granted");
        assert!(backend.release(&req.key, req.token).await.expect("release"));
        assert!(!backend.release(&req.key, req.token).await.expect("repeat"), "a repeated release said released");
        assert!(!backend.release(&req.key, OwnerToken::random()).await.expect("forged"), "a stranger released");

        // Fair: the first copy hands the lock to the queued waiter.
        let holder = request("release/handoff", OwnerToken::random(), ttl, true, true);
        attempt(&*backend, &holder).await.expect("acquire").expect("granted");
        let waiter = request("release/handoff", OwnerToken::random(), ttl, true, true);
        let waiting = {
            let (backend, waiter) = (backend.clone(), waiter.clone());
            tokio::spawn(async move { attempt(&*backend, &waiter).await })
        };
        wait_for_waiters(&*backend, &holder.key, 1).await;
        assert!(backend.release(&holder.key, holder.token).await.expect("release"));
        let handed = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("waiter stuck");
        handed.expect("task").expect("acquire").expect("handed off");
        assert!(!backend.release(&holder.key, holder.token).await.expect("repeat"), "repeat after a hand-off");
        assert!(backend.release(&waiter.key, waiter.token).await.expect("release"), "the waiter lost the lock");

        // A lease that ran out unreleased, then someone else took the key.
        let stale = request("release/stale", OwnerToken::random(), Duration::from_millis(200), false, false);
        attempt(&*backend, &stale).await.expect("acquire").expect("granted");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!backend.release(&stale.key, stale.token).await.expect("expired"), "an expired lease was released");
        let next = request("release/stale", OwnerToken::random(), ttl, false, false);
        attempt(&*backend, &next).await.expect("acquire").expect("granted after the expiry");
        assert!(!backend.release(&stale.key, stale.token).await.expect("stale"), "a stale token released");
        assert!(backend.status(&next.key).await.expect("status").holder.is_some(), "the stale release freed the key");
    });
}

async fn wait_for_waiters(backend: &dyn Backend, key: &LockKey, n: u64) {
    for _ in 0..100 {
        if backend.status(key).await.expect("status").waiters == Some(n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{key}: never saw {n} queued waiters");
}

/// A lease that expires (no release) must not take the lock's last fence
/// with it: the next grant's fence is above it even when the server clock
/// is below it (a clock stepped back). Here the last fence is set far above
/// the clock while the lease is held, as such a step would leave it.
#[test]
fn fence_outlives_an_expired_lease() {
    let server = RedisServer::start();
    rt().block_on(async {
        let backend = holdfast::stores::connect(&server.url()).await.expect("connect");
        let mut conn = raw(&server).await;
        let ttl = Duration::from_millis(300);
        let key = "fence/expired";
        let first = request(key, OwnerToken::random(), ttl, false, false);
        let fence = attempt(&*backend, &first).await.expect("acquire").expect("granted").fence;
        let high = fence + 1_000_000_000_000; // ~11.6 days of microseconds ahead of the clock
        set_last_fence(&mut conn, key, high).await;
        tokio::time::sleep(ttl + Duration::from_millis(200)).await;
        let next = request(key, OwnerToken::random(), ttl, false, false);
        let next_fence = attempt(&*backend, &next).await.expect("acquire").expect("expired, so free").fence;
        assert!(next_fence > high, "fence {next_fence} after an expired lease whose fence was {high}");
    });
}

/// The same after a lease was renewed for far longer than the fence is
/// kept (`fence_keep_ms`): each renewal must keep the lock's hash alive to
/// the lease's end plus the keep period.
#[test]
fn fence_outlives_a_long_renewed_lease() {
    let server = RedisServer::start();
    rt().block_on(async {
        let url = format!("{}?fence_keep_ms=1000", server.url());
        let backend = holdfast::stores::connect(&url).await.expect("connect");
        let mut conn = raw(&server).await;
        // Renewed every 100 ms for 2.5 s: long past the hash's first expiry
        // (grant + ttl + 1.5 keep = 2 s) unless renewals move it.
        let ttl = Duration::from_millis(500);
        let key = "fence/renewed";
        let req = request(key, OwnerToken::random(), ttl, false, false);
        let fence = attempt(&*backend, &req).await.expect("acquire").expect("granted").fence;
        let renew = [RenewRequest { key: req.key.clone(), token: req.token, ttl }];
        for _ in 0..25 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(backend.renew(&renew).await.expect("renew"), vec![true]);
        }
        let high = fence + 1_000_000_000_000;
        set_last_fence(&mut conn, key, high).await;
        tokio::time::sleep(ttl + Duration::from_millis(300)).await;
        assert_eq!(backend.renew(&renew).await.expect("renew"), vec![false], "an expired lease was renewed");
        let next = request(key, OwnerToken::random(), ttl, false, false);
        let next_fence = attempt(&*backend, &next).await.expect("acquire").expect("expired, so free").fence;
        assert!(next_fence > high, "fence {next_fence} after an expired lease whose fence was {high}");
    });
}

/// Commands the server ran, by name (INFO commandstats), without INFO itself.
async fn command_stats(conn: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.expect("info");
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(":calls=")?;
            Some((name.to_owned(), rest.split(',').next()?.parse().ok()?))
        })
        .filter(|(name, _)| name != "info")
        .collect()
}

/// What one uncontended acquire + release costs the server: commands sent by
/// the client (FCALL) and run inside the scripts, per iteration of a loop on
/// one key (its hash exists from the last iteration) and on a new key each
/// time. Before the fence outlived the lease: 12 and 12; before the scripts
/// skipped the fair queue and the publish when nobody waits: 11 and 12 (see
/// docs.md).
#[test]
fn uncontended_acquire_and_release_command_count() {
    let server = RedisServer::start();
    rt().block_on(async {
        let a = client(&server.url(), "count").await;
        let mut conn = raw(&server).await;
        // Warm up: the scripts are loaded.
        a.mutex("count").acquire().await.expect("acquire").release().await.expect("release");
        let n = 200;
        // On a new key the lock's hash is missing, so nothing says the fair
        // queue is empty: the script reads it (LINDEX), as it reads nothing
        // of it on a known key.
        for (what, same_key, bound) in [("one key", true, 8.0), ("a new key each time", false, 10.0)] {
            let before = command_stats(&mut conn).await;
            for i in 0..n {
                let key = if same_key { "count".to_owned() } else { format!("count/{i}") };
                a.mutex(key).acquire().await.expect("acquire").release().await.expect("release");
            }
            let after = command_stats(&mut conn).await;
            let per: BTreeMap<&str, f64> = after
                .iter()
                .map(|(k, v)| (k.as_str(), (v - before.get(k).copied().unwrap_or(0)) as f64 / n as f64))
                .filter(|(_, v)| *v > 0.0)
                .collect();
            let total: f64 = per.values().sum();
            println!("{what}: {total} server commands per uncontended acquire+release: {per:?}");
            // Functions (Redis 7+): one FCALL each, and no EVALSHA (which
            // runs the whole script body, helpers and all, at each call).
            assert_eq!(per.get("fcall").copied(), Some(2.0), "{what}: one round trip each: {per:?}");
            assert!(!per.contains_key("evalsha"), "{what}: {per:?}");
            assert!(total <= bound, "{what}: {total} server commands per acquire+release: {per:?}");
            let unneeded: &[&str] = if same_key { &["publish", "exists", "lindex"] } else { &["publish", "exists"] };
            for cmd in unneeded {
                assert!(!per.contains_key(cmd), "{what}: {cmd} with nobody waiting: {per:?}");
            }
        }
        // Renewal: one script call per batch, two commands per lease inside
        // it (before: the same two), plus one TIME per batch.
        let backend = holdfast::stores::connect(&server.url()).await.expect("connect");
        let ttl = Duration::from_secs(30);
        let mut leases = Vec::new();
        for i in 0..100 {
            let req = request(&format!("count/renew/{i}"), OwnerToken::random(), ttl, false, false);
            attempt(&*backend, &req).await.expect("acquire").expect("granted");
            leases.push(RenewRequest { key: req.key.clone(), token: req.token, ttl });
        }
        backend.renew(&leases[..1]).await.expect("renew"); // loads the script
        let before = command_stats(&mut conn).await;
        assert!(backend.renew(&leases).await.expect("renew").iter().all(|held| *held));
        let after = command_stats(&mut conn).await;
        let total: u64 = after.iter().map(|(k, v)| v - before.get(k).copied().unwrap_or(0)).sum();
        println!("renewing 100 leases in one batch: {total} server commands");
        assert!(total <= 2 * 100 + 2, "{total} server commands to renew 100 leases");
    });
}

/// A release call whose connection is lost after its request ran (its reply
/// dropped, then the connection cut) sends the request again on a new
/// connection; the second copy finds the token's own release and the call
/// answers released: no spurious `Error::Lost` for a lost reply.
#[test]
fn a_release_resent_after_a_lost_connection_says_released() {
    use holdfast_testkit::faults::FaultProxy;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(format!("127.0.0.1:{}", server.port()).parse().expect("addr"));
    rt().block_on(async {
        let backend =
            holdfast::stores::connect(&format!("redis://{}?timeout_ms=10000", proxy.addr())).await.expect("connect");
        let req = request("release/resent", OwnerToken::random(), Duration::from_secs(30), false, false);
        attempt(&*backend, &req).await.expect("acquire").expect("granted");
        proxy.drop_replies();
        let releasing = {
            let (backend, key, token) = (backend.clone(), req.key.clone(), req.token);
            tokio::spawn(async move { backend.release(&key, token).await })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while proxy.stats().bytes_dropped == 0 {
            assert!(std::time::Instant::now() < deadline, "the release's reply never came");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        proxy.forward();
        tokio::task::block_in_place(|| proxy.cut());
        let released = tokio::time::timeout(Duration::from_secs(20), releasing).await.expect("stuck").expect("task");
        assert!(released.expect("release"), "a release re-sent after a lost connection said not held");
    });
}

/// A holder's retried acquire (its reply lost) while a writer waits behind
/// it gets its own grant's fence back. The writer's reservation takes its
/// place from the fence counter, moving the lock's last fence `f` past the
/// held grant's (kept in `hf`); the retry used to answer `f`, the writer's
/// place, so the holder's fence changed under it and matched the place a
/// later grant was ordered by. Found while rewriting the hot path of
/// `acquire.lua` (issue 33), which now reads the whole lock for a retry.
#[test]
fn a_retried_acquire_behind_a_waiting_writer_keeps_its_fence() {
    use holdfast::backend::LeaseMode;
    let server = RedisServer::start();
    rt().block_on(async {
        let backend = holdfast::stores::connect(&server.url()).await.expect("connect");
        let ttl = Duration::from_secs(10);
        let holder = request("retry/behind-writer", OwnerToken::random(), ttl, false, false);
        let first = attempt(&*backend, &holder).await.expect("acquire").expect("a free key is granted");
        let writer = AcquireRequest::new(holder.key.clone(), OwnerToken::random(), ttl).with_mode(LeaseMode::Writer);
        let waiting = {
            let (backend, writer) = (backend.clone(), writer.clone());
            tokio::spawn(async move { backend.acquire(&writer).await })
        };
        // The writer's reservation is in the shares hash once it waits.
        let mut conn = raw(&server).await;
        for _ in 0..200 {
            let n: u64 =
                redis::cmd("HLEN").arg("{holdfast:retry/behind-writer}:s").query_async(&mut conn).await.expect("hlen");
            if n > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let again = attempt(&*backend, &holder).await.expect("retry").expect("the retry gets the grant");
        assert_eq!(again.fence, first.fence, "a retry behind a waiting writer must return its grant's fence");
        assert!(backend.release(&holder.key, holder.token).await.expect("release"));
        let granted = waiting.await.expect("join").expect("the writer is granted after the release");
        assert!(granted.fence > first.fence, "writer's fence {} after {}", granted.fence, first.fence);
        assert!(backend.release(&writer.key, writer.token).await.expect("release"));
    });
}
