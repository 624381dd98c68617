//! The key watch: what it costs a short grant, and what it still hears.

use super::*;

/// Holds lock `anchor` until its key watch is on the client's watch stream,
/// so that the stream is open for the keys watched after it (a client with
/// no watched key has no stream, and sends nothing on it).
async fn open_stream(c: &Client, anchor: &str) -> holdfast::MutexGuard {
    let g = c.mutex(anchor).ttl(Duration::from_secs(30)).acquire().await.expect("anchor");
    tokio::time::sleep(Duration::from_millis(400)).await;
    g
}

/// The key watch costs a short grant nothing: a lock released within the
/// watch's deferral never puts a watcher on the stream, so an uncontended
/// cycle is its two writes and nothing more (before, every grant of a client
/// whose watch stream was open sent a watch creation and a cancellation: 2
/// stream messages per cycle).
#[test]
fn short_grants_send_nothing_on_the_watch_stream() {
    let server = EtcdCluster::start();
    let url = server.url();
    let member = &server.members[0];
    let watch_messages = || member.metric(&["grpc_server_msg_received_total", "grpc_method=\"Watch\""]);
    rt().block_on(async {
        let c = client(&url, "short").await;
        let anchor = open_stream(&c, "short/anchor").await;
        let before = watch_messages();
        let cycles = 50;
        for i in 0..cycles {
            let g = c.mutex(format!("short/{}", i % 4)).try_acquire().await.expect("try").expect("free");
            g.release().await.expect("release");
        }
        let per_cycle = (watch_messages() - before) / f64::from(cycles);
        eprintln!("watch stream messages per short cycle: {per_cycle:.2}");
        // Not 0 on a loaded machine, where a cycle may outlast the deferral.
        assert!(per_cycle < 0.5, "{per_cycle:.2} watch stream messages per cycle");
        anchor.release().await.expect("release");
    });
}

/// A deletion behind the client's back before the grant's watcher is on the
/// stream is not missed, whether the client's stream is open or not: the
/// watcher starts at the revision after the one that wrote the key, so the
/// server replays the deletion, and `lost()` fires within the deferral plus
/// a round trip.
#[test]
fn a_deletion_before_the_watcher_starts_fires_lost() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        for with_stream in [false, true] {
            let c = client(&url, "early").await;
            let anchor = if with_stream { Some(open_stream(&c, "early-anchor").await) } else { None };
            let g = c.mutex("early").ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
            let deleted_at = Instant::now();
            let resp = raw(&url)
                .await
                .delete("holdfast/early/", Some(etcd_client::DeleteOptions::new().with_prefix()))
                .await
                .expect("delete");
            assert_eq!(resp.deleted(), 1, "the holder's key");
            tokio::time::timeout(Duration::from_secs(5), g.lost()).await.expect("lost() did not fire");
            eprintln!("stream open: {with_stream}; lost() {:?} after the delete was sent", deleted_at.elapsed());
            assert!(matches!(g.release().await, Err(Error::Lost { .. })));
            if let Some(a) = anchor {
                a.release().await.expect("release");
            }
        }
    });
}
