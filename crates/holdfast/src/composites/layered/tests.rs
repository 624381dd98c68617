//! Layering over two SQLite files (real stores; the server-backed tests are
//! in `tests/layered.rs` and `tests/conformance/layered.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::*;

#[tokio::test]
async fn bad_urls_are_typed_errors_without_passwords() {
    for bad in [
        "layered://redis://:secret@127.0.0.1:1",
        "layered://redis://:secret@127.0.0.1:1|",
        "layered://redis://:secret@127.0.0.1:1|b:2",
        "layered://redis://:secret@127.0.0.1:1|sqlite:///tmp/x.db|sqlite:///tmp/y.db",
        "layered://?nope=1|redis://:secret@127.0.0.1:1|sqlite:///tmp/x.db",
        "layered://redis://:secret@127.0.0.1:1|layered://a://b|c://d",
        "fallback://redis://:secret@127.0.0.1:1|sqlite:///tmp/x.db",
    ] {
        match Layered::open_url(bad).await {
            Err(Error::InvalidInput { reason, .. }) => assert!(!reason.contains("secret"), "{reason}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

#[cfg(feature = "sqlite")]
mod over_sqlite {
    use super::*;
    use crate::backend::LeaseMode;

    async fn two_files() -> (tempfile::TempDir, Arc<dyn Backend>, Arc<dyn Backend>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let open = |name: &str| format!("sqlite://{}", dir.path().join(name).display());
        let fast = crate::stores::connect(&open("fast.db")).await.expect("fast");
        let auth = crate::stores::connect(&open("auth.db")).await.expect("auth");
        (dir, fast, auth)
    }

    fn req(key: &str, ttl: Duration) -> AcquireRequest {
        AcquireRequest::new(LockKey::new(key).expect("key"), OwnerToken::random(), ttl)
    }

    #[tokio::test]
    async fn the_same_store_twice_is_refused() {
        let (_dir, fast, _) = two_files().await;
        assert!(matches!(Layered::new(fast.clone(), fast), Err(Error::InvalidInput { .. })));
    }

    #[tokio::test]
    async fn opens_from_a_url_and_takes_the_authoritative_fences() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (f, a) = (dir.path().join("f.db"), dir.path().join("a.db"));
        let url = format!("layered://sqlite://{}|sqlite://{}", f.display(), a.display());
        let layered = crate::stores::connect(&url).await.expect("layered URL");
        assert_eq!(layered.name(), "layered");
        let auth = crate::stores::connect(&format!("sqlite://{}", a.display())).await.expect("auth");
        // Raise the authoritative floor: the layered grant's fence comes from there.
        let key = LockKey::new("k").expect("key");
        let direct = req("k", Duration::from_secs(10));
        auth.try_acquire(&direct).await.expect("try").expect("free key");
        auth.raise_fence(&key, direct.token, 1_000).await.expect("raise");
        auth.release(&key, direct.token).await.expect("release");
        let r = req("k", Duration::from_secs(10));
        let g = layered.try_acquire(&r).await.expect("try").expect("free key");
        assert!(g.fence > 1_000, "fence {} not the authoritative store's", g.fence);
        assert_eq!(auth.status(&key).await.expect("status").holder.map(|h| h.fence), Some(g.fence));
        assert!(layered.release(&key, r.token).await.expect("release"));
    }

    #[tokio::test]
    async fn busy_on_the_authoritative_store_releases_the_fast_lease() {
        let (_dir, fast, auth) = two_files().await;
        let layered = Layered::new(fast.clone(), auth.clone()).expect("layered");
        let key = LockKey::new("busy").expect("key");
        let holder = req("busy", Duration::from_secs(10));
        auth.try_acquire(&holder).await.expect("try").expect("auth held directly");
        let r = req("busy", Duration::from_secs(10));
        assert!(layered.try_acquire(&r).await.expect("try").is_none(), "granted a key held on the authoritative store");
        assert!(fast.status(&key).await.expect("status").holder.is_none(), "the fast lease stayed");
        // Fast busy: busy without asking the authoritative store.
        auth.release(&key, holder.token).await.expect("release");
        let fast_holder = req("busy", Duration::from_secs(10));
        fast.try_acquire(&fast_holder).await.expect("try").expect("fast held directly");
        assert!(layered.try_acquire(&r).await.expect("try").is_none());
        assert!(auth.status(&key).await.expect("status").holder.is_none(), "the authoritative store was touched");
    }

    #[tokio::test]
    async fn a_waiter_holding_the_fast_lease_is_granted_when_the_authoritative_store_frees() {
        let (_dir, fast, auth) = two_files().await;
        let layered = Arc::new(Layered::new(fast.clone(), auth.clone()).expect("layered"));
        let key = LockKey::new("wait").expect("key");
        let holder = req("wait", Duration::from_secs(10));
        auth.try_acquire(&holder).await.expect("try").expect("auth held directly");
        let r = req("wait", Duration::from_millis(600));
        let waiting = {
            let (layered, r) = (layered.clone(), r.clone());
            tokio::spawn(async move { layered.acquire(&r).await })
        };
        // Longer than the fast lease's TTL: it is kept alive meanwhile.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let other = req("wait", Duration::from_secs(10));
        assert!(fast.try_acquire(&other).await.expect("try").is_none(), "the waiter's fast lease ran out");
        auth.release(&key, holder.token).await.expect("release");
        let g = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("granted").expect("task");
        g.expect("grant");
        assert!(layered.release(&key, r.token).await.expect("release"));
        assert!(fast.status(&key).await.expect("status").holder.is_none());
        assert!(auth.status(&key).await.expect("status").holder.is_none());
    }

    #[tokio::test]
    async fn a_fast_store_refusal_sends_the_request_to_the_authoritative_store_alone() {
        let (_dir, fast, auth) = two_files().await;
        let layered = Layered::new(fast.clone(), auth.clone()).expect("layered");
        let key = LockKey::new("sem").expect("key");
        // The fast store recorded a limit of 3 (a resize it missed); the
        // authoritative store has none: the authoritative answer wins.
        let stale = req("sem", Duration::from_secs(10)).with_mode(LeaseMode::Shared { weight: 1, limit: 3 });
        fast.try_acquire(&stale).await.expect("try").expect("fast share");
        let r = req("sem", Duration::from_secs(10)).with_mode(LeaseMode::Shared { weight: 1, limit: 2 });
        let g = layered.try_acquire(&r).await.expect("authoritative decides").expect("granted");
        assert_eq!(auth.status(&key).await.expect("status").shared.first().map(|h| h.fence), Some(g.fence));
        assert!(layered.fast_in_use(), "a refusal is not an outage");
        assert!(layered.release(&key, r.token).await.expect("release"));
    }

    #[tokio::test]
    async fn capabilities_are_the_authoritative_stores_where_that_is_the_truth() {
        let (_dir, fast, auth) = two_files().await;
        let layered = Layered::new(fast, auth.clone()).expect("layered");
        let (l, a) = (layered.capabilities(), auth.capabilities());
        assert_eq!(l.fence_durability, a.fence_durability);
        assert_eq!(l.fence_floor, a.fence_floor);
        assert_eq!(l.session_bound, a.session_bound);
        assert_eq!(l.shared_leases, a.shared_leases);
    }
}
