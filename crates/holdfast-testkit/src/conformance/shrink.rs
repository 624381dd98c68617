//! C20: a held lease made smaller in place ([`Backend::shrink`]): a write
//! lock downgraded to a read lock with no writer granted in between, part of
//! a semaphore grant given back. A store that does not declare
//! [`shrink`](holdfast::Capabilities::shrink) must refuse both with
//! `Unsupported`, and each clause checks that instead.
//!
//! [`Backend::shrink`]: holdfast::backend::Backend::shrink

use std::time::Duration;

use holdfast::backend::{AcquireRequest, LeaseMode, UNLIMITED};
use holdfast::{Client, Error, LockKey, OwnerToken};

use super::{Store, client, fresh_key};

/// How long a waiter that now fits may take to be admitted (woken by the
/// store's notification, or its fallback poll).
const ADMITTED_WITHIN: Duration = Duration::from_secs(5);
/// How long a waiter that must not be admitted is watched.
const HELD_BACK_FOR: Duration = Duration::from_millis(700);

/// Whether the store declares shrinking; if not, checks that a downgrade
/// and a partial release are refused with `Unsupported`.
async fn declares_shrink(c: &Client, key: &str) -> bool {
    if c.capabilities().shrink {
        return true;
    }
    if !c.capabilities().shared_leases {
        return false;
    }
    let w = c.rwlock(key).write().acquire().await.expect("write");
    assert!(matches!(w.downgrade().await, Err(Error::Unsupported { .. })), "downgrade not refused");
    let mut p = c.semaphore(key, 2).acquire_many(2).await.expect("2 of 2");
    assert!(matches!(p.release_some(1).await, Err(Error::Unsupported { .. })), "partial release not refused");
    p.release().await.expect("release");
    false
}

/// The fence of the key's one shared lease, as the store reports it.
async fn shared_fences(c: &Client, key: &str) -> Vec<(u64, u32)> {
    let status = c.status(key).await.expect("status");
    assert!(status.holder.is_none(), "an exclusive holder after a shrink: {status:?}");
    let mut shares: Vec<(u64, u32)> = status.shared.iter().map(|h| (h.fence, h.weight)).collect();
    shares.sort_unstable();
    shares
}

/// C20, downgrade: a writer holds the key; a reader waits, then a writer
/// waits behind it. The downgrade keeps the fence, admits the waiting
/// reader, and the waiting writer is not granted until both read leases are
/// released (the rejected "release the write lease, then acquire a read
/// lease" lets it in between). The shrunk lease is renewed past its TTL.
pub async fn c20_downgrade(store: &Store) {
    let key = fresh_key("c20-down");
    let (a, b, c) = (client(store, "c20d-a").await, client(store, "c20d-b").await, client(store, "c20d-c").await);
    if !declares_shrink(&a, &key).await {
        return;
    }
    let ttl = Duration::from_secs(1);
    let write = a.rwlock(&key).write().ttl(ttl).acquire().await.expect("write");
    let fence = write.fence();
    let reader = b.rwlock(&key).read().ttl(Duration::from_secs(30));
    let reading = tokio::spawn(async move { reader.acquire_timeout(Duration::from_secs(60)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let writer = c.rwlock(&key).write().ttl(Duration::from_secs(30));
    let writing = tokio::spawn(async move { writer.acquire_timeout(Duration::from_secs(60)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!reading.is_finished() && !writing.is_finished(), "a waiter got in with a writer");

    let read = tokio::time::timeout(ADMITTED_WITHIN, write.downgrade())
        .await
        .expect("the downgrade did not return within 5 s (a writer granted in between would hold its read back)")
        .expect("downgrade");
    assert!(!writing.is_finished(), "a waiting writer was granted during the downgrade");
    assert_eq!(read.fence(), fence, "the downgrade changed the fence");
    let other_read = tokio::time::timeout(ADMITTED_WITHIN, reading)
        .await
        .expect("the reader that waited for the writer was not admitted after the downgrade")
        .expect("reader task")
        .expect("read");
    let shares = shared_fences(&a, &key).await;
    assert!(shares.contains(&(fence, 1)), "the downgraded lease is not a read lease of the same fence: {shares:?}");
    // Past the write lease's TTL: the read lease is renewed as it was.
    tokio::time::sleep(ttl + HELD_BACK_FOR).await;
    assert!(!writing.is_finished(), "a waiting writer was granted while the downgraded read lease was held");
    assert!(!read.is_lost(), "the downgraded lease was not renewed");
    assert!(c.rwlock(&key).write().try_acquire().await.expect("try").is_none(), "a writer got in with a reader");
    other_read.release().await.expect("release");
    tokio::time::sleep(HELD_BACK_FOR).await;
    assert!(!writing.is_finished(), "a waiting writer was granted while the downgraded read lease was held");
    read.release().await.expect("release of the downgraded lease");
    let granted = tokio::time::timeout(ADMITTED_WITHIN + Duration::from_secs(5), writing)
        .await
        .expect("the waiting writer was not granted after the read leases were released")
        .expect("writer task")
        .expect("write");
    assert!(granted.fence() > fence, "the writer's fence is not above the downgraded lease's");
    granted.release().await.expect("release");
}

/// C20, partial release: 4 of 4 permits held, a request for 3 waits; giving
/// back 2 (2 left) does not admit it, giving back 1 more does. The fence
/// stays and the store shows the smaller weight.
pub async fn c20_partial_release(store: &Store) {
    let key = fresh_key("c20-part");
    let (a, b) = (client(store, "c20p-a").await, client(store, "c20p-b").await);
    if !declares_shrink(&a, &key).await {
        return;
    }
    let mut permit = a.semaphore(&key, 4).ttl(Duration::from_secs(1)).acquire_many(4).await.expect("4 of 4");
    let fence = permit.fence();
    let sem = b.semaphore(&key, 4).ttl(Duration::from_secs(30));
    let waiting = tokio::spawn(async move { sem.acquire_many_timeout(3, Duration::from_secs(60)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "3 of 4 granted with 4 held");

    permit.release_some(2).await.expect("give back 2");
    assert_eq!((permit.permits(), permit.fence()), (2, fence), "after giving back 2 of 4");
    assert_eq!(shared_fences(&a, &key).await, vec![(fence, 2)], "the store's view after giving back 2");
    tokio::time::sleep(HELD_BACK_FOR).await;
    assert!(!waiting.is_finished(), "3 of 4 granted with 2 still held");

    permit.release_some(1).await.expect("give back 1 more");
    let three = tokio::time::timeout(ADMITTED_WITHIN, waiting)
        .await
        .expect("the waiting request for 3 was not admitted once it fit")
        .expect("waiter task")
        .expect("3 permits");
    assert_eq!(three.permits(), 3);
    assert!(three.fence() > fence, "the new grant's fence is not above the shrunk one's");
    assert_eq!(shared_fences(&a, &key).await, vec![(fence, 1), (three.fence(), 3)], "after the waiter got in");
    assert!(b.semaphore(&key, 4).try_acquire().await.expect("try").is_none(), "a fifth permit");
    // Past the first TTL: the shrunk lease is renewed as it was.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!permit.is_lost(), "the shrunk lease was not renewed");
    three.release().await.expect("release");
    permit.release().await.expect("release of the shrunk lease");
}

/// C20, bad input and lost leases: a mode that is not smaller is refused
/// with `InvalidInput` and changes nothing; a token that holds nothing
/// (released, or never granted) shrinks nothing and gets `Ok(false)`; a
/// guard whose lease was removed gets `Lost`.
pub async fn c20_shrink_refused(store: &Store) {
    let key = fresh_key("c20-bad");
    let a = client(store, "c20b-a").await;
    if !declares_shrink(&a, &key).await {
        return;
    }
    let backend = store.backend(&store.url).await.expect("backend");
    let lock_key = LockKey::new(key.clone()).expect("key");
    let invalid = |r: holdfast::Result<bool>| matches!(r, Err(Error::InvalidInput { .. }));
    let read = LeaseMode::Shared { weight: 1, limit: UNLIMITED };

    // A writer's lease shrinks only to a share of weight 1.
    let token = OwnerToken::random();
    let req = AcquireRequest::new(lock_key.clone(), token, Duration::from_secs(30)).with_mode(LeaseMode::Writer);
    let fence = backend.try_acquire(&req).await.expect("try").expect("a writer on a free key").fence;
    assert!(invalid(backend.shrink(&lock_key, token, LeaseMode::Exclusive).await), "shrunk to exclusive");
    let two = LeaseMode::Shared { weight: 2, limit: 4 };
    assert!(invalid(backend.shrink(&lock_key, token, two).await), "shrunk to a weight of 2");
    assert!(a.rwlock(&key).read().try_acquire().await.expect("try").is_none(), "a refused shrink admitted a reader");
    assert!(backend.shrink(&lock_key, token, read).await.expect("downgrade"), "downgrade of a held writer");
    // Applied once, the same shrink is no longer smaller.
    assert!(invalid(backend.shrink(&lock_key, token, read).await), "a read lease shrunk to a read lease");
    assert!(invalid(backend.shrink(&lock_key, token, LeaseMode::Writer).await), "a read lease upgraded");
    assert_eq!(shared_fences(&a, &key).await, vec![(fence, 1)], "the refused shrinks changed the lease");
    assert!(backend.release(&lock_key, token).await.expect("release"), "the downgraded lease was not held");
    // Released, the token holds nothing: nothing shrinks.
    assert!(!backend.shrink(&lock_key, token, read).await.expect("shrink of a released lease"), "released");
    assert!(!backend.shrink(&lock_key, OwnerToken::random(), read).await.expect("shrink"), "never granted");

    // The client refuses a partial release that is not one before any I/O.
    let mut permit = a.semaphore(&key, 4).acquire_many(2).await.expect("2 of 4");
    for n in [0, 2, 3] {
        match permit.release_some(n).await {
            Err(Error::InvalidInput { .. }) => {}
            other => panic!("giving back {n} of 2 permits should be InvalidInput, got {other:?}"),
        }
    }
    assert_eq!(shared_fences(&a, &key).await, vec![(permit.fence(), 2)], "a refused partial release wrote");
    permit.release().await.expect("release");

    // A guard whose lease was removed under it: `Lost`, and nothing granted.
    if a.capabilities().admin {
        let write = a.rwlock(&key).write().acquire().await.expect("write");
        a.force_release(&key).await.expect("force release");
        match write.downgrade().await {
            Err(Error::Lost { .. }) => {}
            other => panic!("downgrading a removed lease should be Lost, got {other:?}"),
        }
        let status = a.status(&key).await.expect("status");
        assert!(status.shared.is_empty() && status.holder.is_none(), "a lost downgrade left a lease: {status:?}");
    }
}
