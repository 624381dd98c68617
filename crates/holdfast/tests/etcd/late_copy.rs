//! A copy of an attempt's first write that etcd applies after the attempt's
//! release: made exactly, by sending the client's own bytes again. The
//! client reaches etcd through the fault proxy, which keeps what the
//! client's connection delivered; the network is silent past a try's
//! timeout, so the client sends its write again, and both copies reach etcd
//! when it heals (the attempt is one whose write may land late). After the release,
//! the recorded connection is sent to etcd again from its start on a new
//! connection: every request in it runs again, the attempt's write among
//! them, as a copy that a healed partition delivers late would. No key may
//! come back: not while the release is minutes old (the design before this
//! one deleted such a key again after 1 s, 3 s, ... 127 s) and not later.

use std::net::SocketAddr;

use holdfast_testkit::faults::FaultProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// Sends each of `connections` (a client's bytes, from the start of its
/// connection) to `server` on a new connection, reads what etcd answers
/// for `listen`, and closes.
async fn replay(server: SocketAddr, connections: Vec<Vec<u8>>, listen: Duration) {
    let mut tasks = Vec::new();
    for bytes in connections {
        tasks.push(tokio::spawn(async move {
            let mut conn = tokio::net::TcpStream::connect(server).await.expect("connect to etcd");
            conn.write_all(&bytes).await.expect("send the recorded bytes");
            let mut sink = vec![0u8; 64 * 1024];
            let _ =
                tokio::time::timeout(listen, async { while matches!(conn.read(&mut sink).await, Ok(n) if n > 0) {} })
                    .await;
        }));
    }
    for t in tasks {
        t.await.expect("replay task");
    }
}

fn late_copy_of_a_resent_write(waiting: bool) {
    let server = EtcdCluster::start();
    let direct = server.url();
    let etcd: SocketAddr = ([127, 0, 0, 1], server.members[0].client_port).into();
    let proxy = FaultProxy::start(etcd);
    proxy.record_requests();
    // A try lasts half the operation timeout: 2 s.
    let url = format!("etcd://{}?timeout_ms=4000", proxy.addr());
    let lock = if waiting { "late-copy-acquire" } else { "late-copy-try" };
    rt().block_on(async {
        let a = client(&url, "a").await;
        let b = client(&direct, "b").await;
        // The session's lease exists before the attempt: its grant is not
        // what is sent again.
        a.mutex("late-copy-warm-up")
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .expect("warm up")
            .release()
            .await
            .ok();
        proxy.blackhole();
        let m = a.mutex(lock).ttl(Duration::from_secs(30));
        let attempt = tokio::spawn(async move {
            if waiting { m.acquire_timeout(Duration::from_secs(10)).await.map(Some) } else { m.try_acquire().await }
        });
        // The first try timed out at 2 s and the second is sent: heal,
        // leaving the second try 1.5 s to be answered.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        proxy.forward();
        let g = attempt.await.expect("attempt task").expect("the attempt").expect("the lock was free");
        let copies = proxy.recorded_requests();
        g.release().await.expect("release");
        assert!(queue_of(&direct, lock).await.is_empty(), "the release left a key");
        replay(etcd, copies, Duration::from_millis(500)).await;
        let left = queue_of(&direct, lock).await;
        assert!(left.is_empty(), "a late copy of the attempt's write put its key back after the release: {left:?}");
        let other = b.mutex(lock).try_acquire().await.expect("b's try_acquire");
        assert!(other.is_some(), "another client is refused after the late copy");
        if let Some(g) = other {
            g.release().await.expect("release");
        }
        // A's session lives on and its next attempt is granted at once.
        let g = a.mutex(lock).ttl(Duration::from_secs(30)).try_acquire().await.expect("a again").expect("free");
        g.release().await.expect("release");
    });
}

#[test]
fn a_late_copy_of_a_try_acquire_after_its_release_writes_nothing() {
    late_copy_of_a_resent_write(false);
}

#[test]
fn a_late_copy_of_an_enqueue_after_its_release_writes_nothing() {
    late_copy_of_a_resent_write(true);
}
