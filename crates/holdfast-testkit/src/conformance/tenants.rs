//! C18, records kept with a key, and C19, tenants of one store.
//!
//! A fallback chain keeps its mode in the record of its mode key on the
//! arbiter ([`Backend::write_record`]). The arbiter may serve other chains,
//! plain locks and RedLock members: on SQLite one fence counter serves the
//! whole file, and on PostgreSQL and MySQL the whole namespace, so nothing
//! one tenant does to the counter may move another's mode or grants.

use std::sync::Arc;
use std::time::Duration;

use holdfast::backend::{AcquireRequest, Backend, LeaseMode, UNLIMITED};
use holdfast::fallback::{Fallback, Mode};
use holdfast::{Error, LockKey, OwnerToken};

use super::{Store, fresh_key};

const TTL: Duration = Duration::from_secs(10);

fn key(what: &str) -> LockKey {
    LockKey::new(fresh_key(what)).expect("key")
}

/// Takes `key` in `mode` for a new token (which must be granted).
async fn hold(raw: &Arc<dyn Backend>, key: &LockKey, mode: LeaseMode, ttl: Duration) -> (OwnerToken, u64) {
    let req = AcquireRequest::new(key.clone(), OwnerToken::random(), ttl).with_mode(mode);
    match raw.try_acquire(&req).await {
        Ok(Some(g)) => (req.token, g.fence),
        Ok(None) => panic!("{key}: the free key was not granted in {mode:?}"),
        Err(e) => panic!("{key}: acquire in {mode:?} failed: {e}"),
    }
}

/// C18 (records): for a store that declares
/// [`records`](holdfast::Capabilities::records),
///
/// 1. a key never written has no record;
/// 2. the exclusive holder writes (`true`), and a writer (a
///    [`Writer`](LeaseMode::Writer) lease) does too, on a store with shared
///    leases; the value reads back, in full 64 bits;
/// 3. a token that holds nothing, a held share, and a holder whose lease
///    expired write nothing (`false`);
/// 4. the record outlives the release and the expiry of every lease of the
///    key, and records of two keys are apart;
/// 5. a fence floor raised on another key changes no record.
///
/// A store without the capability answers `Unsupported` to both calls.
pub async fn c18_records(store: &Store) {
    let raw = store.backend(&store.url).await.expect("raw store connection");
    let (k, other) = (key("c18-record"), key("c18-other"));
    if !raw.capabilities().records {
        assert!(matches!(raw.read_record(&k).await, Err(Error::Unsupported { .. })), "read_record not Unsupported");
        let write = raw.write_record(&k, OwnerToken::random(), 1).await;
        assert!(matches!(write, Err(Error::Unsupported { .. })), "write_record not Unsupported: {write:?}");
        return;
    }
    // 1.
    assert_eq!(raw.read_record(&k).await.expect("read"), None, "a fresh key has a record");

    // 2. The exclusive holder, then a writer.
    let (a, _) = hold(&raw, &k, LeaseMode::Exclusive, TTL).await;
    assert!(raw.write_record(&k, a, 7).await.expect("write by the holder"), "the holder was not held");
    assert_eq!(raw.read_record(&k).await.expect("read"), Some(7));
    // 3. A stranger writes nothing while a holds.
    assert!(!raw.write_record(&k, OwnerToken::random(), 8).await.expect("write by a stranger"));
    assert!(raw.release(&k, a).await.expect("release"), "a's grant was gone");
    let mut expected = 7;
    if raw.capabilities().shared_leases {
        let (w, _) = hold(&raw, &k, LeaseMode::Writer, TTL).await;
        assert!(raw.write_record(&k, w, u64::MAX).await.expect("write by a writer"), "the writer was not held");
        assert_eq!(raw.read_record(&k).await.expect("read"), Some(u64::MAX), "64 bits did not read back");
        assert!(raw.release(&k, w).await.expect("release"), "the writer's grant was gone");
        expected = u64::MAX;
        let (s, _) = hold(&raw, &k, LeaseMode::Shared { weight: 1, limit: UNLIMITED }, TTL).await;
        assert!(!raw.write_record(&k, s, 9).await.expect("write by a share"), "a share wrote the record");
        assert!(raw.release(&k, s).await.expect("release"), "the share was gone");
    }
    // 3. An expired holder writes nothing.
    let (c, _) = hold(&raw, &k, LeaseMode::Exclusive, holdfast::LockOptions::MIN_TTL).await;
    tokio::time::sleep(holdfast::LockOptions::MIN_TTL + store.expiry_slack + Duration::from_millis(50)).await;
    assert!(!raw.write_record(&k, c, 10).await.expect("write by an expired holder"), "an expired holder wrote");
    let _ = raw.release(&k, c).await;

    // 4. Still there with nothing held; apart from another key's.
    assert_eq!(raw.read_record(&k).await.expect("read"), Some(expected), "the record did not outlive its leases");
    assert_eq!(raw.read_record(&other).await.expect("read"), None, "another key has this key's record");
    let (o, _) = hold(&raw, &other, LeaseMode::Exclusive, TTL).await;
    assert!(raw.write_record(&other, o, 1).await.expect("write another key"));

    // 5. A floor raised on another key.
    if raw.capabilities().fence_floor {
        assert!(raw.raise_fence(&other, o, 1 << 51).await.expect("raise on another key"));
    }
    assert!(raw.release(&other, o).await.expect("release"));
    assert_eq!(raw.read_record(&k).await.expect("read"), Some(expected), "another key's write or raise moved it");
    assert_eq!(raw.read_record(&other).await.expect("read"), Some(1));
}

/// A chain named `name` over two connections to the store (the first store
/// and the arbiter are one server: what matters here is the arbiter).
async fn chain(store: &Store, name: &str) -> Fallback {
    let stores =
        vec![store.backend(&store.url).await.expect("first store"), store.backend(&store.url).await.expect("arbiter")];
    Fallback::new(stores)
        .and_then(|c| c.with_name(name))
        .and_then(|c| c.with_mode_ttl(Duration::from_millis(1000)))
        .expect("a chain over the store")
        .with_switch_after(Duration::from_millis(200))
        .with_fail_back_after(None)
}

/// `chain`'s grant of a fresh key: its fence.
async fn grant(chain: &Fallback, what: &str) -> u64 {
    let req = AcquireRequest::new(key(what), OwnerToken::random(), TTL);
    let fence = match chain.try_acquire(&req).await {
        Ok(Some(g)) => g.fence,
        other => panic!("{what}: the chain did not grant a fresh key: {:?}", other.map(|g| g.map(|g| g.fence))),
    };
    assert!(chain.release(&req.key, req.token).await.expect("release"), "{what}: the grant was gone");
    fence
}

/// C19 (tenants): on a store that can be a fallback chain's arbiter
/// ([`records`](holdfast::Capabilities::records) and shared leases), two
/// chains with other record names, plain locks and fence floors raised on
/// other keys (as a RedLock member's write-back) share the store, and
///
/// 1. a switch of chain `b` leaves chain `a` in its mode, with fences of
///    its epoch, and chain `b` grants in its new epoch;
/// 2. plain locks granted and floors raised on other keys (up to the
///    largest the store takes) move neither chain's mode;
/// 3. a chain of three stores on the same arbiter switches to its third;
///    a chain of two under that same name gets a typed error (the record
///    names a store it lacks), never a panic or a grant.
///
/// Skipped for a store that cannot be an arbiter.
pub async fn c19_tenants(store: &Store) {
    let raw = store.backend(&store.url).await.expect("raw store connection");
    let caps = raw.capabilities();
    if !caps.records || !caps.shared_leases || caps.session_bound {
        return;
    }
    let tag = fresh_key("c19").replace('/', "-");
    let (a, b) = (chain(store, &format!("{tag}-a")).await, chain(store, &format!("{tag}-b")).await);
    assert_eq!(grant(&a, "c19-a0").await >> 52, 0, "chain a's first grant is not from epoch 0");
    assert_eq!(b.switch_to(1).await.expect("chain b switches"), Mode { epoch: 1, active: 1 });
    assert_eq!(grant(&b, "c19-b1").await >> 52, 1, "chain b's grant is not from its epoch 1");
    let fresh_a = chain(store, &format!("{tag}-a")).await;
    assert_eq!(grant(&fresh_a, "c19-a1").await >> 52, 0, "chain b's switch moved chain a's fences");
    assert_eq!(fresh_a.mode(), Some(Mode::START), "chain b's switch moved chain a's mode");

    // 2. Plain locks and floors on other keys.
    let plain = key("c19-plain");
    // Floors below 2^52 only: here the store is a member of both chains as
    // well as their arbiter, and a member's own fences must stay below 2^52
    // (the chain refuses a grant above). Above that, the floors the old
    // layout read as epoch 1 store 1 and epoch 3 store 7 would have moved
    // both chains; here they must move neither.
    for floor in [1u64 << 44, 1 << 51, (1 << 52) - (1 << 45)] {
        let (t, _) = hold(&raw, &plain, LeaseMode::Exclusive, TTL).await;
        match raw.raise_fence(&plain, t, floor).await {
            Ok(held) => assert!(held, "the plain holder's raise to {floor:#x} said not held"),
            Err(Error::InvalidInput { .. }) if floor > 1 << 51 => {}
            Err(e) => panic!("raise to {floor:#x}: {e}"),
        }
        assert!(raw.release(&plain, t).await.expect("release"));
        for (name, epoch) in [("a", 0), ("b", 1)] {
            let fresh = chain(store, &format!("{tag}-{name}")).await;
            let fence = grant(&fresh, "c19-after-floor").await;
            assert_eq!(fence >> 52, epoch, "a floor {floor:#x} on another key moved chain {name}: {fence:#x}");
            assert_eq!(fresh.mode().map(|m| m.epoch), Some(epoch), "chain {name}'s mode moved");
        }
    }

    // 3. Another layout under one name.
    let three = Fallback::new(vec![
        store.backend(&store.url).await.expect("store"),
        store.backend(&store.url).await.expect("store"),
        store.backend(&store.url).await.expect("arbiter"),
    ])
    .and_then(|c| c.with_name(&format!("{tag}-three")))
    .and_then(|c| c.with_mode_ttl(Duration::from_millis(1000)))
    .expect("a chain of three");
    assert_eq!(three.switch_to(2).await.expect("switch to the third"), Mode { epoch: 1, active: 2 });
    let two = chain(store, &format!("{tag}-three")).await;
    let req = AcquireRequest::new(key("c19-two"), OwnerToken::random(), TTL);
    let got = tokio::spawn(async move { two.try_acquire(&req).await.map(|g| g.map(|g| g.fence)) })
        .await
        .expect("a chain reading a record of another layout panicked");
    assert!(matches!(got, Err(Error::InvalidInput { .. })), "expected InvalidInput, got {got:?}");
}
