//! Session leases: what a revoked or expired session does to holders and waiters.

use super::*;

/// Revoking the session lease behind two guards fires `lost()` on both, and
/// the keys are gone; the next acquisition starts a new session.
#[test]
fn session_loss_fires_lost_for_every_guard() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let a = client(&url, "a").await;
        let g1 = a.mutex("s/one").ttl(Duration::from_secs(5)).acquire().await.expect("one");
        let g2 = a.mutex("s/two").ttl(Duration::from_secs(5)).acquire().await.expect("two");
        let mut etcd = raw(&url).await;
        let kv =
            etcd.get("holdfast/s%2Fone/", Some(etcd_client::GetOptions::new().with_prefix())).await.expect("get").kvs()
                [0]
            .clone();
        let other =
            etcd.get("holdfast/s%2Ftwo/", Some(etcd_client::GetOptions::new().with_prefix())).await.expect("get").kvs()
                [0]
            .lease();
        assert_eq!(kv.lease(), other, "two locks of one TTL share one session lease");
        etcd.lease_revoke(kv.lease()).await.expect("revoke");
        let lost = async {
            g1.lost().await;
            g2.lost().await;
        };
        tokio::time::timeout(Duration::from_secs(5), lost).await.expect("lost() did not fire after the lease went");
        assert!(matches!(g1.release().await, Err(Error::Lost { .. })));
        drop(g2);
        let b = client(&url, "b").await;
        let g = b.mutex("s/one").try_acquire().await.expect("try").expect("free after the session went");
        g.release().await.expect("release");
        let g = a.mutex("s/one").ttl(Duration::from_secs(5)).acquire().await.expect("a new session");
        g.release().await.expect("release");
    });
}
