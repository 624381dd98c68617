//! Tenants of one arbiter store: chains with other record names, plain
//! locks and fence floors raised on other keys. A chain's mode is its own:
//! nothing another tenant does to the arbiter moves it.

use std::time::Duration;

use holdfast::backend::{AcquireRequest, Backend, Grant};
use holdfast::fallback::{Fallback, Mode};
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::servers::redis::RedisServer;

const OPTIONS: &str = "mode_ttl_ms=1000&switch_after_ms=200&fail_back_after_ms=0";

fn redis_url(server: &RedisServer) -> String {
    format!("redis://127.0.0.1:{}?timeout_ms=300", server.port())
}

async fn chain(name: &str, stores: &[&str]) -> Fallback {
    let url = format!("fallback://?name={name}&{OPTIONS}|{}", stores.join("|"));
    Fallback::open_url(&url).await.expect("open the chain")
}

fn request(key: &LockKey) -> AcquireRequest {
    AcquireRequest::new(key.clone(), OwnerToken::random(), Duration::from_secs(10))
}

/// `chain`'s grant of `key` (a fresh token), or `None` if the key is busy.
async fn try_grant(chain: &Fallback, key: &LockKey) -> Option<Grant> {
    chain.try_acquire(&request(key)).await.expect("try_acquire through the chain")
}

/// The reported double grant: A1 of chain `a` holds K on Redis A; chain `b`
/// (another record name, the same arbiter) switches to the arbiter; a fresh
/// client A2 of chain `a` must still see chain `a` in its first mode, so K
/// is busy for it.
async fn a_switch_of_one_chain_leaves_another_chain_alone(arbiter: &str) {
    let (redis_a, redis_b) = (RedisServer::start(), RedisServer::start());
    let (url_a, url_b) = (redis_url(&redis_a), redis_url(&redis_b));
    let key = LockKey::new("tenants/K").expect("key");
    let a1 = chain("a", &[&url_a, arbiter]).await;
    let held = try_grant(&a1, &key).await.expect("A1 is granted K on Redis A");
    assert_eq!(held.fence >> 52, 0, "A1's grant is not from epoch 0: {:#x}", held.fence);

    // Chain b moves to the arbiter (the same record write a switch after
    // Redis B failed makes).
    let b = chain("b", &[&url_b, arbiter]).await;
    assert_eq!(b.switch_to(1).await.expect("chain b switches"), Mode { epoch: 1, active: 1 });

    let a2 = chain("a", &[&url_a, arbiter]).await;
    let got = a2.try_acquire(&request(&key)).await;
    assert!(matches!(got, Ok(None)), "A2 of chain a was granted K while A1 holds it on Redis A: {got:?}");
    assert_eq!(a2.mode(), Some(Mode::START), "chain b's switch moved chain a's mode");
    // And chain b really grants from its arbiter, in its epoch 1.
    let on_b = try_grant(&b, &key).await.expect("chain b grants K from its arbiter");
    assert_eq!(on_b.fence >> 52, 1, "chain b's grant is not from epoch 1: {:#x}", on_b.fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_switch_of_one_chain_leaves_another_chain_alone_on_a_sqlite_arbiter() {
    let dir = tempfile::tempdir().expect("tempdir");
    a_switch_of_one_chain_leaves_another_chain_alone(&format!("sqlite://{}/arbiter.db", dir.path().display())).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_switch_of_one_chain_leaves_another_chain_alone_on_a_postgres_arbiter() {
    let pg = holdfast_testkit::servers::postgres::PostgresServer::start();
    a_switch_of_one_chain_leaves_another_chain_alone(&pg.url()).await;
}

/// Another tenant of the arbiter raises a fence floor on its own key (as a
/// RedLock member's write-back does): on SQLite that moves the file's one
/// counter. The chain's mode and fences must not follow it, whatever the
/// floor reads as (here: epoch 1, store 1; then a store the chain lacks).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fence_floor_raised_by_another_tenant_moves_no_chain() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let arbiter = format!("sqlite://{}/arbiter.db", dir.path().display());
    let url = redis_url(&redis);
    let key = LockKey::new("tenants/K").expect("key");
    let first = chain("a", &[&url, &arbiter]).await;
    let held = request(&key);
    first.try_acquire(&held).await.expect("try_acquire").expect("granted K on Redis");

    let plain = holdfast::stores::connect(&arbiter).await.expect("the arbiter as a plain store");
    let other = LockKey::new("someone/else").expect("key");
    for floor in [(1u64 << 52) | (1 << 44), (3u64 << 52) | (7 << 44)] {
        let r = request(&other);
        plain.try_acquire(&r).await.expect("plain lock").expect("the other key is free");
        assert!(plain.raise_fence(&other, r.token, floor).await.expect("raise"), "the raise found no holder");
        plain.release(&other, r.token).await.expect("release");

        let fresh = chain("a", &[&url, &arbiter]).await;
        let got = fresh.try_acquire(&request(&key)).await;
        assert!(matches!(got, Ok(None)), "after a floor {floor:#x} on another key, K was granted again: {got:?}");
        assert_eq!(fresh.mode(), Some(Mode::START), "a floor {floor:#x} on another key moved the chain");
    }
    assert!(first.release(&key, held.token).await.expect("release"), "K was not held on Redis");
}

/// A chain whose arbiter is Redis switches, and grants from the arbiter in
/// the new epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chain_with_a_redis_arbiter_switches_and_grants_from_it() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let first = format!("sqlite://{}/first.db", dir.path().display());
    let c = chain("r", &[&first, &redis_url(&redis)]).await;
    let key = LockKey::new("tenants/redis-arbiter").expect("key");
    let before = try_grant(&c, &key).await.expect("granted from the first store");
    assert_eq!(before.fence >> 52, 0);
    let mode = c.switch_to(1).await.expect("a switch to the Redis arbiter");
    assert_eq!(mode, Mode { epoch: 1, active: 1 });
    let after =
        try_grant(&c, &LockKey::new("tenants/redis-arbiter/2").expect("key")).await.expect("granted from the arbiter");
    assert_eq!(after.fence >> 52, 1, "not from epoch 1: {:#x}", after.fence);
    assert!(after.fence > before.fence, "fence {:#x} not above {:#x}", after.fence, before.fence);
    // Back to the first store: epoch 2, and still increasing.
    assert_eq!(c.switch_to(0).await.expect("switch back"), Mode { epoch: 2, active: 0 });
    let back = try_grant(&c, &key).await;
    // K from epoch 0 may still be held on the first store (try_grant never released it).
    assert!(back.as_ref().is_none_or(|g| g.fence >> 52 == 2), "{back:?}");
}

/// A chain of three stores switches to its third; a chain of two on the
/// same arbiter (another name) has no store 2, and must neither panic nor
/// follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mode_naming_a_store_a_chain_lacks_never_panics() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let arbiter = format!("sqlite://{}/arbiter.db", dir.path().display());
    let url = redis_url(&redis);
    let three = chain("three", &[&url, &url, &arbiter]).await;
    assert_eq!(three.switch_to(2).await.expect("switch"), Mode { epoch: 1, active: 2 });
    let two = chain("two", &[&url, &arbiter]).await;
    let key = LockKey::new("tenants/two").expect("key");
    let got = tokio::spawn(async move { two.try_acquire(&request(&key)).await.map(|g| g.map(|g| g.fence)) })
        .await
        .expect("the two-store chain panicked");
    let fence = got.expect("the two-store chain grants").expect("the key is free");
    assert_eq!(fence >> 52, 0, "the two-store chain left its first mode: {fence:#x}");
}
