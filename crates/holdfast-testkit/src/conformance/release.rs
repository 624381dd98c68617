//! C4 (release by token), the repeat: what a release sent again by the same
//! token answers once the first took effect.

use std::time::Duration;

use holdfast::backend::{AcquireRequest, LeaseMode};
use holdfast::{LockKey, OwnerToken};

use super::{Store, fresh_key};

/// C4: a release repeated by the same token after its first copy removed
/// the grant (a resend whose first reply was lost) answers `Ok(false)`, as
/// the `Backend::release` contract says of a token that owns none, and
/// changes nothing: a later holder keeps its grant. Exclusive and shared
/// leases alike.
pub async fn c4_release_repeated(store: &Store) {
    let raw = store.backend(&store.url).await.expect("raw store connection");
    let ttl = Duration::from_secs(30);
    for (what, mode) in [("exclusive", LeaseMode::Exclusive), ("shared", LeaseMode::Shared { weight: 1, limit: 1 })] {
        if !mode.is_exclusive() && !raw.capabilities().shared_leases {
            continue;
        }
        let key = LockKey::new(fresh_key(&format!("c4-repeat-{what}"))).expect("key");
        let request = |token| AcquireRequest::new(key.clone(), token, ttl).with_mode(mode);
        let first = OwnerToken::random();
        raw.try_acquire(&request(first)).await.expect("acquire").expect("a fresh key is free");
        assert!(raw.release(&key, first).await.expect("release"), "{what}: the holder's release said not held");
        assert!(!raw.release(&key, first).await.expect("repeat"), "{what}: a repeated release said released");
        let second = OwnerToken::random();
        let granted = raw.try_acquire(&request(second)).await.expect("acquire").is_some();
        assert!(granted, "{what}: the key is not free after its release");
        assert!(!raw.release(&key, first).await.expect("late repeat"), "{what}: a late repeat said released");
        assert!(
            raw.try_acquire(&request(OwnerToken::random())).await.expect("try").is_none(),
            "{what}: a repeated release freed the next holder's grant"
        );
        assert!(raw.release(&key, second).await.expect("release"), "{what}: the next holder lost its grant");
    }
}
