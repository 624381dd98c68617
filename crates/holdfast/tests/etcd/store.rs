//! The raw store calls (`holdfast::stores::connect`), as the client's
//! background release and renewal see them.

use holdfast::backend::{AcquireRequest, RenewRequest};
use holdfast::{LockKey, OwnerToken};

use super::*;

fn request(lock: &str) -> AcquireRequest {
    AcquireRequest::new(LockKey::new(lock).expect("key"), OwnerToken::random(), Duration::from_secs(30))
}

fn renewal(req: &AcquireRequest) -> RenewRequest {
    RenewRequest { key: req.key.clone(), token: req.token, ttl: req.ttl }
}

/// A release that fails while etcd does not answer keeps the grant: the
/// retry (the client's, in the background) deletes the key and reports the
/// grant as released; a further release reports nothing left.
#[test]
fn failed_release_keeps_the_grant_for_its_retry() {
    let server = EtcdCluster::start();
    let url = format!("{}?timeout_ms=1000", server.url());
    let member = &server.members[0];
    rt().block_on(async {
        let store = holdfast::stores::connect(&url).await.expect("connect");
        let req = request("raw-release");
        store.try_acquire(&req).await.expect("try").expect("granted");
        member.pause();
        let first = store.release(&req.key, req.token).await;
        member.resume();
        match first {
            Err(e) => assert!(e.is_retryable(), "a release while etcd is stopped: {e}"),
            Ok(held) => panic!("a release while etcd was stopped answered {held}"),
        }
        assert!(store.release(&req.key, req.token).await.expect("retry"), "the retry did not release the grant");
        assert!(holdfast_keys(&server.url()).await.is_empty(), "the key is still there");
        assert!(!store.release(&req.key, req.token).await.expect("again"), "released twice");
        assert_eq!(store.renew(&[renewal(&req)]).await.expect("renew"), vec![false]);
    });
}

/// Once a grant's session lease is revoked, its signal fires, renew says it
/// is not held, and release answers `Ok(false)` (the grant can no longer
/// exist), which ends the client's retries.
#[test]
fn grant_of_a_revoked_session_is_gone_for_renew_and_release() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let store = holdfast::stores::connect(&url).await.expect("connect");
        let req = request("raw-revoked");
        let grant = store.try_acquire(&req).await.expect("try").expect("granted");
        assert_eq!(store.renew(&[renewal(&req)]).await.expect("renew"), vec![true]);
        let lease = queue_of(&url, "raw-revoked").await[0].1;
        raw(&url).await.lease_revoke(lease).await.expect("revoke");
        let signal = grant.session_lost.expect("etcd grants carry a session signal");
        tokio::time::timeout(Duration::from_secs(1), signal.cancelled()).await.expect("no signal within 1 s");
        assert_eq!(store.renew(&[renewal(&req)]).await.expect("renew"), vec![false]);
        assert!(!store.release(&req.key, req.token).await.expect("release"));
    });
}
