//! C17 admin: `list` shows exactly the held keys under a prefix, and
//! `force_release` frees a key whatever its owner, with fences that never
//! go backwards, waiters woken promptly and the old holder told.

use std::time::{Duration, Instant};

use holdfast::{Error, LockStatus};

use super::Store;
use super::clauses::{client, fresh_key};

/// The removed holders' TTL: far longer than any bound checked below, so a
/// waiter granted or a key free within them was freed by the forced release.
const LONG_TTL: Duration = Duration::from_secs(30);

/// Their renewal period: `lost()` must fire within about one of these.
const RENEW_EVERY: Duration = Duration::from_millis(500);

/// How long after a forced release the old holder's `lost()` may fire at the
/// latest: one renewal period, plus room for a loaded machine's renewal call.
const LOST_WITHIN: Duration = Duration::from_secs(3);

/// How soon a waiter must be granted after a forced release (the TTL is 30 s).
const WAKE_WITHIN: Duration = Duration::from_secs(3);

/// Waits for `lost` (a guard's `lost()`), failing after [`LOST_WITHIN`].
async fn lost_soon(what: &str, lost: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(LOST_WITHIN, lost).await.is_err() {
        panic!("{what}: lost() did not fire within {LOST_WITHIN:?} of the forced release");
    }
}

fn find<'a>(all: &'a [LockStatus], key: &str) -> &'a LockStatus {
    match all.iter().find(|s| s.key == key) {
        Some(s) => s,
        None => panic!("list did not show the held key {key:?}: {all:#?}"),
    }
}

/// C17: the admin calls, on a store that declares `admin` (the others must
/// answer `Unsupported` to both):
///
/// 1. `list(prefix)` shows exactly the held keys under the prefix (not a
///    released one, not one outside it), with holders' labels and fences
///    and the shared leases of a semaphore;
/// 2. `force_release` of a held mutex returns its fence; the key is granted
///    at once with a higher fence, and the old guard's `lost()` fires
///    within about one renewal period;
/// 3. a waiter blocked on a key is granted promptly after its holder is
///    forced out (long before the 30 s TTL);
/// 4. `force_release` of a free key says free;
/// 5. a semaphore's permits are all removed, their holders told;
/// 6. bad prefixes are `InvalidInput`.
pub async fn c17_admin(store: &Store) {
    let (a, b, c) = (client(store, "c17-a").await, client(store, "c17-b").await, client(store, "c17-c").await);
    let base = fresh_key("c17");
    if !a.capabilities().admin {
        for outcome in [a.list(Some(&base)).await.map(|_| ()), a.force_release(&base).await.map(|_| ())] {
            match outcome {
                Err(Error::Unsupported { .. }) => {}
                other => panic!("an admin call on a store without `admin` should be Unsupported, got {other:?}"),
            }
        }
        return;
    }
    let shared = a.capabilities().shared_leases;
    let prefix = format!("{base}/");
    let (k1, k2, k_free) = (format!("{prefix}one"), format!("{prefix}permits"), format!("{prefix}free"));
    let outside = format!("{base}-outside/one");

    // 1. list
    let mutex = |cl: &holdfast::Client, k: &str| cl.mutex(k).ttl(LONG_TTL).renew_every(RENEW_EVERY);
    let g1 = mutex(&a, &k1).acquire().await.expect("acquire k1");
    let g_out = mutex(&b, &outside).acquire().await.expect("acquire outside");
    mutex(&a, &k_free).acquire().await.expect("acquire k_free").release().await.expect("release k_free");
    let permits = if shared {
        let sem = |cl: &holdfast::Client| cl.semaphore(&k2, 3).ttl(LONG_TTL).renew_every(RENEW_EVERY);
        let pb = sem(&b).acquire().await.expect("permit b");
        let pc = sem(&c).acquire().await.expect("permit c");
        Some((pb, pc))
    } else {
        None
    };
    let all = a.list(Some(&prefix)).await.expect("list");
    let mut keys: Vec<&str> = all.iter().map(|s| s.key.as_str()).collect();
    keys.sort_unstable();
    let mut want = vec![k1.as_str()];
    if shared {
        want.push(k2.as_str());
    }
    want.sort_unstable();
    assert_eq!(keys, want, "list({prefix:?}) must show exactly the held keys under the prefix: {all:#?}");
    let s1 = find(&all, &k1);
    let h1 = s1.holder.as_ref().unwrap_or_else(|| panic!("k1 listed without its holder: {s1:?}"));
    assert_eq!((h1.label.as_str(), h1.fence), ("c17-a", g1.fence()), "k1's holder as listed");
    assert!(h1.ttl_left.is_none_or(|t| t <= LONG_TTL), "k1's TTL left {:?} is above its TTL", h1.ttl_left);
    assert!(s1.shared.is_empty(), "k1 listed with shares: {s1:?}");
    if let Some((pb, pc)) = &permits {
        let s2 = find(&all, &k2);
        assert!(s2.holder.is_none(), "a semaphore listed with an exclusive holder: {s2:?}");
        let mut got: Vec<(String, u64)> = s2.shared.iter().map(|h| (h.label.clone(), h.fence)).collect();
        got.sort();
        let mut exp = vec![("c17-b".to_owned(), pb.fence()), ("c17-c".to_owned(), pc.fence())];
        exp.sort();
        assert_eq!(got, exp, "the semaphore's permits as listed");
    }
    // The store itself (not only the client, which sorts and filters): no key outside the prefix.
    let raw = store.backend(&store.url).await.expect("raw store connection");
    let mut raw_keys: Vec<String> = raw.list(&prefix).await.expect("raw list").into_iter().map(|s| s.key).collect();
    raw_keys.sort();
    assert_eq!(raw_keys, want, "the store's own list({prefix:?})");
    let everything = a.list(None).await.expect("list(None)");
    assert!(everything.iter().any(|s| s.key == outside), "list(None) misses {outside:?}");
    assert!(everything.iter().any(|s| s.key == k1), "list(None) misses {k1:?}");

    // 2. force_release of a held mutex: its fence, a regrant at once with a higher fence, lost().
    let lost1 = g1.lost();
    let removed = b.force_release(&k1).await.expect("force_release k1");
    assert_eq!(removed.exclusive, Some(g1.fence()), "force_release must return the holder's fence: {removed:?}");
    assert!(removed.shared.is_empty(), "a mutex has no shares: {removed:?}");
    let g2 = match c.mutex(&k1).ttl(LONG_TTL).renew_every(RENEW_EVERY).try_acquire().await {
        Ok(Some(g)) => g,
        other => panic!("the key was not free at once after force_release: {other:?}"),
    };
    assert!(g2.fence() > g1.fence(), "fence went backwards: {} after forced-out {}", g2.fence(), g1.fence());
    lost_soon("the forced-out mutex holder", lost1).await;
    assert!(g1.is_lost());
    assert!(matches!(g1.release().await, Err(Error::Lost { .. }) | Ok(())), "release of a forced-out guard");

    // 3. a waiter is granted promptly.
    let waiter = {
        let (b, k1) = (b.clone(), k1.clone());
        tokio::spawn(async move {
            let g = b.mutex(&k1).ttl(LONG_TTL).acquire_timeout(Duration::from_secs(30)).await.expect("waiter");
            (Instant::now(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter was granted a held key");
    let lost2 = g2.lost();
    let forced_at = Instant::now();
    let removed = a.force_release(&k1).await.expect("force_release k1 again");
    assert_eq!(removed.exclusive, Some(g2.fence()), "the second forced release's fence");
    let (granted_at, g3) =
        tokio::time::timeout(LONG_TTL / 2, waiter).await.expect("waiter never granted").expect("task");
    let wake = granted_at.saturating_duration_since(forced_at);
    assert!(wake < WAKE_WITHIN, "the waiter was granted {wake:?} after the forced release (TTL {LONG_TTL:?})");
    assert!(g3.fence() > g2.fence(), "waiter's fence {} not above the removed {}", g3.fence(), g2.fence());
    lost_soon("the second forced-out holder", lost2).await;
    g3.release().await.expect("release the waiter's grant");

    // 4. a free key.
    let removed = a.force_release(&k_free).await.expect("force_release of a free key");
    assert!(removed.was_free(), "force_release of a free key removed {removed:?}");

    // 5. a semaphore's permits.
    if let Some((pb, pc)) = permits {
        let (lost_b, lost_c) = (pb.lost(), pc.lost());
        let removed = a.force_release(&k2).await.expect("force_release of a semaphore");
        let mut exp = vec![pb.fence(), pc.fence()];
        exp.sort_unstable();
        assert_eq!((removed.exclusive, removed.shared.clone()), (None, exp), "a semaphore's removed permits");
        lost_soon("permit holder b", lost_b).await;
        lost_soon("permit holder c", lost_c).await;
        let full = a.semaphore(&k2, 3).ttl(LONG_TTL);
        let mut again = Vec::new();
        for i in 0..3 {
            match full.try_acquire().await {
                Ok(Some(g)) => {
                    assert!(g.fence() > removed.highest().unwrap_or(0), "permit fence went backwards");
                    again.push(g);
                }
                other => panic!("permit {i} of 3 not granted after the forced release: {other:?}"),
            }
        }
        for g in again {
            g.release().await.expect("release permit");
        }
    }
    let after = a.list(Some(&prefix)).await.expect("list after");
    assert!(after.is_empty(), "keys still listed after every lease was forced out or released: {after:#?}");

    // 6. bad prefixes.
    for bad in ["a\nb".to_owned(), "x".repeat(holdfast::LockKey::MAX_BYTES + 1)] {
        match a.list(Some(&bad)).await {
            Err(Error::InvalidInput { what: "prefix", .. }) => {}
            other => panic!("list with a bad prefix should be InvalidInput, got {other:?}"),
        }
    }
    match a.force_release("").await {
        Err(Error::InvalidInput { what: "key", .. }) => {}
        other => panic!("force_release of an empty key should be InvalidInput, got {other:?}"),
    }
    g_out.release().await.expect("release outside");
}
