//! The fence floor of a request (`AcquireRequest::fence_floor`) on every
//! store that declares `Capabilities::fence_floor`, through the store's own
//! grant path (the try and the waiting acquire): a grant's fence is the
//! higher of what the store would issue (its counter plus one; on Redis also
//! its clock in µs) and the floor; the counter afterwards stands at least at
//! that fence, so a later grant without a floor, or with a stale lower one,
//! is above it; a floor above the store's cap is refused before any I/O.

use std::time::Duration;

use holdfast::backend::{AcquireRequest, Backend};
use holdfast::{Error, LockKey, OwnerToken};

/// Far enough above a Redis fence (the server clock in µs) that the floor
/// wins: 1000 s.
const AHEAD: u64 = 1_000_000_000;

async fn grant(store: &dyn Backend, key: &LockKey, floor: u64, waiting: bool) -> u64 {
    let req = AcquireRequest::new(key.clone(), OwnerToken::random(), Duration::from_secs(30))
        .with_label("floor")
        .with_fence_floor(floor);
    let fence = if waiting {
        tokio::time::timeout(Duration::from_secs(10), store.acquire(&req))
            .await
            .expect("a free key is granted at once")
            .expect("acquire")
            .fence
    } else {
        store.try_acquire(&req).await.expect("try").expect("the key is free").fence
    };
    assert!(store.release(key, req.token).await.expect("release"), "the grant was not held");
    fence
}

/// The floor rule on `store`, whose floors go up to `cap`.
async fn check_floor(store: &dyn Backend, cap: u64) {
    assert!(store.capabilities().fence_floor, "{} does not declare fence floors", store.name());
    let key = LockKey::new("floor/rule").expect("key");
    let f0 = grant(store, &key, 0, false).await;
    // One above the last fence (what RedLock sends): exactly that fence,
    // also on Redis, whose clock has moved past it since (members whose
    // clocks differ must agree on it).
    let fa = grant(store, &key, f0 + 1, false).await;
    assert_eq!(fa, f0 + 1, "{}: a floor of the last fence + 1 is the fence", store.name());
    let f0 = fa;
    // Above the counter: the floor itself, in both paths.
    let floor = f0 + AHEAD;
    let f1 = grant(store, &key, floor, false).await;
    assert_eq!(f1, floor, "{}: a floor above the counter is the fence", store.name());
    let f2 = grant(store, &key, f1 + 7, true).await;
    assert_eq!(f2, f1 + 7, "{}: the waiting path honours the floor", store.name());
    // The counter stands at the fence: no floor, then a stale floor (below
    // the counter), each give the next fence, never the floor.
    let f3 = grant(store, &key, 0, true).await;
    assert_eq!(f3, f2 + 1, "{}: the counter after a floored grant is its fence", store.name());
    let f4 = grant(store, &key, f1, false).await;
    assert_eq!(f4, f3 + 1, "{}: a stale floor below the counter changes nothing", store.name());
    // A floor of exactly counter + 1: the same fence as without one.
    let f5 = grant(store, &key, f4 + 1, false).await;
    assert_eq!(f5, f4 + 1, "{}", store.name());
    // A floor above the cap is refused before any write.
    let over =
        AcquireRequest::new(key.clone(), OwnerToken::random(), Duration::from_secs(30)).with_fence_floor(cap + 1);
    match store.try_acquire(&over).await {
        Err(Error::InvalidInput { .. }) => {}
        other => panic!("{}: a floor above {cap} must be refused, got {other:?}", store.name()),
    }
    let f6 = grant(store, &key, 0, false).await;
    assert_eq!(f6, f5 + 1, "{}: the refused floor wrote nothing", store.name());
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_honours_the_fence_floor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("floor.db");
    let store =
        holdfast::stores::sqlite::SqliteBackend::open_url(&format!("sqlite://{}", path.display())).await.expect("open");
    check_floor(&store, 1 << 62).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_honours_the_fence_floor() {
    let server = holdfast_testkit::servers::redis::RedisServer::start();
    let store = holdfast::stores::redis::RedisBackend::open_url(&server.url()).await.expect("open");
    check_floor(&store, 1 << 52).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_honours_the_fence_floor() {
    let server = holdfast_testkit::servers::postgres::PostgresServer::start();
    let store = holdfast::stores::postgres::PostgresBackend::open_url(&server.url()).await.expect("open");
    check_floor(&store, 1 << 62).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_store_honours_the_fence_floor() {
    let server = holdfast_testkit::servers::mysql::MysqlServer::start();
    let store = holdfast::stores::mysql::MysqlBackend::open_url(&server.url()).await.expect("open");
    check_floor(&store, 1 << 62).await;
}
