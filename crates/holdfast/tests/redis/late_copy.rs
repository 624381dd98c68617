//! Where a guarantee ends on Redis: a copy of an attempt's acquire that the
//! server runs after the attempt's release (the client's requests held in a
//! partition on a connection it gave up on, delivered when it heals, after
//! the release went on a new one). Made exactly by sending the client's
//! recorded bytes to the server again after the release. The copy grants
//! the key again to a token nobody tracks: no one renews it, so it holds the
//! key for one TTL at most (unlike a session-bound store, where such a key
//! would live as long as its client; see the etcd store's epoch), and the
//! fence the other client then gets is above the copy's.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use holdfast_testkit::faults::FaultProxy;
use holdfast_testkit::servers::redis::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{client, rt};

const TTL: Duration = Duration::from_secs(4);

/// Sends `bytes` to `server` on a new connection and reads its replies for `listen`.
async fn replay(server: SocketAddr, bytes: &[u8], listen: Duration) {
    let mut conn = tokio::net::TcpStream::connect(server).await.expect("connect to redis");
    conn.write_all(bytes).await.expect("send the recorded bytes");
    let mut sink = vec![0u8; 64 * 1024];
    let _ = tokio::time::timeout(listen, async { while matches!(conn.read(&mut sink).await, Ok(n) if n > 0) {} }).await;
}

#[test]
fn a_late_copy_of_an_acquire_after_its_release_holds_the_key_one_ttl_at_most() {
    let server = RedisServer::start();
    let addr: SocketAddr = ([127, 0, 0, 1], server.port()).into();
    let proxy = FaultProxy::start(addr);
    proxy.record_requests();
    rt().block_on(async {
        let a = client(&format!("redis://{}", proxy.addr()), "a").await;
        let b = client(&server.url(), "b").await;
        let lock = "late-copy";
        let g = a.mutex(lock).ttl(TTL).acquire().await.expect("acquire");
        let fence = g.fence();
        let copies = proxy.recorded_requests();
        g.release().await.expect("release");
        for bytes in &copies {
            replay(addr, bytes, Duration::from_millis(300)).await;
        }
        let replayed = Instant::now();
        // The copy ran: the key is held again (this is what the test shows
        // the bound of, not a wish).
        assert!(b.mutex(lock).try_acquire().await.expect("b's try").is_none(), "the replayed acquire did not run");
        let g = loop {
            if let Some(g) = b.mutex(lock).try_acquire().await.expect("b's try") {
                break g;
            }
            assert!(replayed.elapsed() < TTL + Duration::from_secs(2), "a late copy held the key past its TTL");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        eprintln!("a late copy held the key {:?} (TTL {TTL:?})", replayed.elapsed());
        assert!(g.fence() > fence + 1, "the fence after the late copy's grant: {} (the release's {fence})", g.fence());
        g.release().await.expect("release");
    });
}
