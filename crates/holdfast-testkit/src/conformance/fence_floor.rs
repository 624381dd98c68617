//! C2, fence floors: [`Backend::raise_fence`] moves a key's fence floor up,
//! never down, so that the store's next grant of the key gets a fence above
//! the floor. RedLock relies on it: it writes the fence it chose back to the
//! majority that granted it, so the next majority (which shares a member)
//! issues a higher one.

use std::sync::Arc;
use std::time::Duration;

use holdfast::backend::{AcquireRequest, Backend};
use holdfast::{Error, LockKey, OwnerToken};

use super::{Store, fresh_key};

const TTL: Duration = Duration::from_secs(10);

/// Grants `key` to a new token, checks its fence is above `above`, and
/// releases it; returns the fence.
async fn grant_above(raw: &Arc<dyn Backend>, key: &LockKey, above: u64, what: &str) -> u64 {
    let req = AcquireRequest::new(key.clone(), OwnerToken::random(), TTL);
    let grant = match raw.try_acquire(&req).await {
        Ok(Some(g)) => g,
        Ok(None) => panic!("{what}: the free key was not granted"),
        Err(e) => panic!("{what}: acquire failed: {e}"),
    };
    assert!(grant.fence > above, "{what}: fence {} is not above {above}", grant.fence);
    assert!(raw.release(key, req.token).await.expect("release"), "{what}: the grant was gone at release");
    grant.fence
}

/// Acquires `key` for a new token (which must be granted) and returns it.
async fn hold(raw: &Arc<dyn Backend>, key: &LockKey, ttl: Duration, what: &str) -> (OwnerToken, u64) {
    let req = AcquireRequest::new(key.clone(), OwnerToken::random(), ttl);
    match raw.try_acquire(&req).await {
        Ok(Some(g)) => (req.token, g.fence),
        Ok(None) => panic!("{what}: the free key was not granted"),
        Err(e) => panic!("{what}: acquire failed: {e}"),
    }
}

/// C2 (fence floor): for a store that declares
/// [`fence_floor`](holdfast::Capabilities::fence_floor),
///
/// 1. a raise by the holder answers `true`, leaves its grant held, and the
///    next grant after it is above the floor;
/// 2. a raise to a floor below the last fence changes nothing: fences keep
///    increasing from where they were;
/// 3. a raise by a token that holds nothing answers `false` and raises
///    nothing, and neither does a raise by a holder whose lease expired
///    (the fallback chain's epoch switch relies on it);
/// 4. a floor the size of a Redis fence (microseconds since 1970, ~2^51)
///    is taken; one near the top of 64 bits (`i64::MAX`, `u64::MAX`) is
///    either taken (and the next two grants are above it, in order) or
///    refused with `InvalidInput`, and the key stays usable either way;
/// 5. a held share (on a store with shared leases) counts as held.
///
/// A store without the capability answers `Unsupported`.
pub async fn c2_fence_floor(store: &Store) {
    let raw = store.backend(&store.url).await.expect("raw store connection");
    let key = LockKey::new(fresh_key("c2-floor")).expect("key");
    if !raw.capabilities().fence_floor {
        match raw.raise_fence(&key, OwnerToken::random(), 1).await {
            Err(Error::Unsupported { .. }) => return,
            other => panic!("raise_fence on a store without fence_floor should be Unsupported, got {other:?}"),
        }
    }

    // 1. Raised by the holder.
    let (a, fence_a) = hold(&raw, &key, TTL, "A").await;
    let floor = fence_a + 1000;
    assert!(raw.raise_fence(&key, a, floor).await.expect("raise by the holder"), "the holder's raise said not held");
    assert!(raw.release(&key, a).await.expect("release A"), "the raise took the holder's grant away");
    let last = grant_above(&raw, &key, floor, "the grant after a raise to A's fence + 1000").await;

    // 2. A lower floor changes nothing.
    let (b, _) = hold(&raw, &key, TTL, "B").await;
    assert!(raw.raise_fence(&key, b, 1).await.expect("raise to 1"), "the holder's raise said not held");
    assert!(raw.release(&key, b).await.expect("release B"), "B's grant was gone at release");
    let last = grant_above(&raw, &key, last, "the grant after a raise to a lower floor").await;

    // 3. A token that holds nothing raises nothing; nor does an expired
    // holder. 2^40 above the last fence is far beyond any fence the store
    // would reach on its own meanwhile (a Redis fence is at least
    // microseconds since 1970: 2^40 us is 12 days).
    let far = last + (1 << 40);
    assert!(
        !raw.raise_fence(&key, OwnerToken::random(), far).await.expect("raise by a stranger"),
        "a stranger was held"
    );
    let last = grant_above(&raw, &key, last, "the grant after a stranger's raise").await;
    assert!(last < far, "a stranger's raise moved the floor: fence {last} is not below {far}");
    let (c, _) = hold(&raw, &key, holdfast::LockOptions::MIN_TTL, "C, with the shortest TTL").await;
    tokio::time::sleep(holdfast::LockOptions::MIN_TTL + store.expiry_slack + Duration::from_millis(50)).await;
    let expired = raw.raise_fence(&key, c, far).await.expect("raise by an expired holder");
    let last = grant_above(&raw, &key, last, "the grant after an expired holder's raise").await;
    assert!(!expired && last < far, "an expired holder's raise: held {expired}, next fence {last} (floor {far})");

    // 4. Large floors, raised by a holder. A Redis fence of about now must fit every store.
    let mut last = last;
    for floor in [1u64 << 51, i64::MAX as u64 - 1, i64::MAX as u64, u64::MAX - 1, u64::MAX] {
        let (d, _) = hold(&raw, &key, TTL, "D").await;
        match raw.raise_fence(&key, d, floor).await {
            Ok(held) => {
                assert!(held, "the holder's raise to {floor} said not held");
                assert!(raw.release(&key, d).await.expect("release D"), "D's grant was gone at release");
                last = grant_above(&raw, &key, floor, &format!("the grant after a raise to {floor}")).await;
                last = grant_above(&raw, &key, last, &format!("the second grant after a raise to {floor}")).await;
            }
            Err(Error::InvalidInput { .. }) if floor > 1 << 51 => {
                assert!(raw.release(&key, d).await.expect("release D"), "D's grant was gone at release");
                last = grant_above(&raw, &key, last, &format!("the grant after a refused floor {floor}")).await;
            }
            Err(e) => panic!("raise to {floor}: expected the floor taken or InvalidInput, got {e}"),
        }
    }

    // 5. A held share is held.
    if raw.capabilities().shared_leases {
        let key = LockKey::new(fresh_key("c2-floor-share")).expect("key");
        let share = AcquireRequest::new(key.clone(), OwnerToken::random(), TTL)
            .with_mode(holdfast::backend::LeaseMode::Shared { weight: 1, limit: 2 });
        let fence = raw.try_acquire(&share).await.expect("acquire a share").expect("a free key is granted").fence;
        assert!(
            raw.raise_fence(&key, share.token, fence + 10).await.expect("raise by a share"),
            "a share was not held"
        );
        assert!(raw.release(&key, share.token).await.expect("release the share"), "the share was gone at release");
        grant_above(&raw, &key, fence + 10, "the grant after a share's raise").await;
    }
}
