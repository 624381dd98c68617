//! The key watch: what it costs a short grant, and what it still hears.

use super::*;

/// The key watch costs a short grant nothing: a lock released within the
/// watch's deferral never puts a watcher on the stream, so an uncontended
/// cycle is its two writes and nothing more (before, every grant sent a
/// watch creation and a cancellation: 2 stream messages per cycle).
#[test]
fn short_grants_send_nothing_on_the_watch_stream() {
    let server = EtcdCluster::start();
    let url = server.url();
    let member = &server.members[0];
    let watch_messages = || member.metric(&["grpc_server_msg_received_total", "grpc_method=\"Watch\""]);
    rt().block_on(async {
        let c = client(&url, "short").await;
        let before = watch_messages();
        let cycles = 50;
        for i in 0..cycles {
            let g = c.mutex(&format!("short/{}", i % 4)).try_acquire().await.expect("try").expect("free");
            g.release().await.expect("release");
        }
        let per_cycle = (watch_messages() - before) / f64::from(cycles);
        eprintln!("watch stream messages per short cycle: {per_cycle:.2}");
        // Not 0 on a loaded machine, where a cycle may outlast the deferral.
        assert!(per_cycle < 0.5, "{per_cycle:.2} watch stream messages per cycle");
    });
}

/// A deletion behind the client's back before the grant's watcher is on the
/// stream is not missed: the watcher starts at the revision after the one
/// that wrote the key, so the server replays the deletion, and `lost()`
/// fires within the deferral plus a round trip.
#[test]
fn a_deletion_before_the_watcher_starts_fires_lost() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let c = client(&url, "early").await;
        let g = c.mutex("early").ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let deleted_at = Instant::now();
        let resp = raw(&url)
            .await
            .delete("holdfast/early/", Some(etcd_client::DeleteOptions::new().with_prefix()))
            .await
            .expect("delete");
        assert_eq!(resp.deleted(), 1, "the holder's key");
        tokio::time::timeout(Duration::from_secs(5), g.lost()).await.expect("lost() did not fire");
        eprintln!("lost() {:?} after the delete was sent", deleted_at.elapsed());
        assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    });
}
