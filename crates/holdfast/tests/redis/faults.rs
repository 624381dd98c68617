//! Lost replies and clock trouble, through the raw store calls
//! (`holdfast::backend::connect`): a retried acquire, a re-sent release, a
//! fence kept past a lease that expired, and what one uncontended
//! acquisition costs the server.

use std::collections::BTreeMap;
use std::time::Duration;

use holdfast::backend::AcquireRequest;
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::servers::redis::RedisServer;

use super::{client, raw, rt};

fn request(key: &str, token: OwnerToken, ttl: Duration, wait: bool, fair: bool) -> AcquireRequest {
    AcquireRequest { key: LockKey::new(key).expect("key"), token, ttl, label: "faults".to_owned(), wait, fair }
}

/// The lease time the server has left for lock `key`, by its own clock.
async fn lease_left(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Duration {
    let pttl: i64 = redis::cmd("PTTL").arg(format!("{{holdfast:{key}}}")).query_async(conn).await.expect("pttl");
    Duration::from_millis(pttl.max(0) as u64)
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
        let backend = holdfast::backend::connect(&server.url()).await.expect("connect");
        let ttl = Duration::from_millis(1000);
        let conn = raw(&server).await;
        let runs = [(false, false), (true, false), (false, true), (true, true)].map(|(wait, fair)| {
            let (backend, mut conn) = (backend.clone(), conn.clone());
            async move {
                let key = format!("retry/wait={wait}/fair={fair}");
                let req = request(&key, OwnerToken::random(), ttl, wait, fair);
                let first = backend.acquire(&req).await.expect("acquire").expect("a free key is granted");
                tokio::time::sleep(Duration::from_millis(600)).await;
                let again = backend.acquire(&req).await.expect("retry").expect("the retry gets the grant");
                assert_eq!(again.fence, first.fence, "{key}: a retry must return the same fence");
                let left = lease_left(&mut conn, &key).await;
                assert!(left > Duration::from_millis(900), "{key}: {left:?} left on the server after the retry");
                let status = backend.status(&req.key).await.expect("status");
                let store_left = status.holder.and_then(|h| h.ttl_left).expect("held, with a ttl");
                assert!(store_left > Duration::from_millis(900), "{key}: status says {store_left:?} left");
                assert!(backend.release(&req.key, req.token).await.expect("release"));
            }
        });
        futures::future::join_all(runs).await;
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
/// the client (EVALSHA) and run inside the scripts, per iteration of a loop.
#[test]
fn uncontended_acquire_and_release_command_count() {
    let server = RedisServer::start();
    rt().block_on(async {
        let a = client(&server.url(), "count").await;
        let mut conn = raw(&server).await;
        // Warm up: scripts loaded, the key's hash exists as in a steady loop.
        for _ in 0..3 {
            a.mutex("count").acquire().await.expect("acquire").release().await.expect("release");
        }
        let before = command_stats(&mut conn).await;
        let n = 200;
        for _ in 0..n {
            a.mutex("count").acquire().await.expect("acquire").release().await.expect("release");
        }
        let after = command_stats(&mut conn).await;
        let per: BTreeMap<&str, f64> = after
            .iter()
            .map(|(k, v)| (k.as_str(), (v - before.get(k).copied().unwrap_or(0)) as f64 / n as f64))
            .filter(|(_, v)| *v > 0.0)
            .collect();
        let total: f64 = per.values().sum();
        println!("per uncontended acquire+release: {total} server commands: {per:?}");
        assert_eq!(per.get("evalsha").copied(), Some(2.0), "one round trip each: {per:?}");
        assert!(total <= 12.0, "{total} server commands per acquire+release: {per:?}");
    });
}
