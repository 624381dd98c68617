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

/// C2 (fence floor): for a store that declares
/// [`fence_floor`](holdfast::Capabilities::fence_floor),
///
/// 1. a raise by the holder answers `true`, leaves its grant held, and the
///    next grant after it is above the floor;
/// 2. a raise to a floor below the last fence changes nothing: fences keep
///    increasing from where they were;
/// 3. a raise by a token that holds nothing answers `false` and still
///    raises;
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
    let a = AcquireRequest::new(key.clone(), OwnerToken::random(), TTL);
    let fence_a = raw.try_acquire(&a).await.expect("acquire A").expect("a free key is granted").fence;
    let floor = fence_a + 1000;
    assert!(
        raw.raise_fence(&key, a.token, floor).await.expect("raise by the holder"),
        "the holder's raise said not held"
    );
    assert!(raw.release(&key, a.token).await.expect("release A"), "the raise took the holder's grant away");
    let last = grant_above(&raw, &key, floor, "the grant after a raise to A's fence + 1000").await;

    // 2. A lower floor changes nothing.
    let stranger = OwnerToken::random();
    assert!(!raw.raise_fence(&key, stranger, 1).await.expect("raise to 1"), "a token holding nothing was held");
    let last = grant_above(&raw, &key, last, "the grant after a raise to a lower floor").await;

    // 3. A token that holds nothing still raises.
    let floor = last + 5000;
    assert!(!raw.raise_fence(&key, stranger, floor).await.expect("raise by a stranger"), "a stranger was held");
    grant_above(&raw, &key, floor, "the grant after a stranger's raise").await;

    // 4. Large floors. A Redis fence of about now must fit every store.
    let floor = 1u64 << 51;
    assert!(!raw.raise_fence(&key, stranger, floor).await.expect("raise to 2^51"), "a stranger was held");
    let mut last = grant_above(&raw, &key, floor, "the grant after a raise to 2^51").await;
    for floor in [i64::MAX as u64 - 1, i64::MAX as u64, u64::MAX - 1, u64::MAX] {
        match raw.raise_fence(&key, stranger, floor).await {
            Ok(held) => {
                assert!(!held, "a stranger was held");
                last = grant_above(&raw, &key, floor, &format!("the grant after a raise to {floor}")).await;
                last = grant_above(&raw, &key, last, &format!("the second grant after a raise to {floor}")).await;
            }
            Err(Error::InvalidInput { .. }) => {
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
