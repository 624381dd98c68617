//! The fault proxy against a small loopback echo server that also records
//! what it received, so a test can tell "the request arrived" from "the
//! reply came back".

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast_testkit::faults::{Fault, FaultProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An echo server; returns its address and every byte it has received.
async fn echo_server() -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let received = Arc::new(Mutex::new(Vec::new()));
    let log = received.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    log.lock().expect("log").extend_from_slice(&buf[..n]);
                    if conn.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, received)
}

fn received(log: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&log.lock().expect("log")).into_owned()
}

/// Reads exactly `len` bytes, or `None` if they do not arrive within `within`.
async fn read_within(conn: &mut TcpStream, len: usize, within: Duration) -> Option<String> {
    let mut buf = vec![0u8; len];
    match tokio::time::timeout(within, conn.read_exact(&mut buf)).await {
        Ok(Ok(_)) => Some(String::from_utf8_lossy(&buf).into_owned()),
        _ => None,
    }
}

/// True if the connection is closed (EOF or reset) within `within`.
async fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(tokio::time::timeout(within, conn.read(&mut buf)).await, Ok(Ok(0) | Err(_)))
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "{what} not true within 5 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn forwards_and_counts() {
    let (server, _) = echo_server().await;
    let proxy = FaultProxy::start(server);
    assert_eq!(proxy.upstream(), server);
    let mut conn = TcpStream::connect(proxy.addr()).await.expect("connect");
    conn.write_all(b"hello").await.expect("write");
    assert_eq!(read_within(&mut conn, 5, Duration::from_secs(5)).await.as_deref(), Some("hello"));
    // The counters are bumped right after each write, so they may trail the bytes a little.
    let counts = || {
        let s = proxy.stats();
        (s.accepted, s.open, s.bytes_to_server, s.bytes_to_client)
    };
    wait_for("counters", || counts() == (1, 1, 5, 5)).await;
    drop(conn);
    wait_for("connection closed", || proxy.stats().open == 0).await;
}

#[tokio::test]
async fn drop_replies_applies_requests_and_loses_replies() {
    let (server, log) = echo_server().await;
    let proxy = FaultProxy::start(server);
    let mut conn = TcpStream::connect(proxy.addr()).await.expect("connect");
    conn.write_all(b"a").await.expect("write");
    assert_eq!(read_within(&mut conn, 1, Duration::from_secs(5)).await.as_deref(), Some("a"));
    proxy.drop_replies();
    assert_eq!(proxy.fault(), Fault::DropReplies);
    conn.write_all(b"bc").await.expect("write");
    wait_for("request delivered", || received(&log) == "abc").await;
    assert_eq!(read_within(&mut conn, 1, Duration::from_millis(300)).await, None, "a reply got through");
    wait_for("reply dropped", || proxy.stats().bytes_dropped == 2).await;
    // The stream is out of step now: cut, then forward on a new connection.
    proxy.cut();
    assert_eq!(proxy.stats().open, 0);
    assert!(closed_within(&mut conn, Duration::from_secs(2)).await, "cut left the client connected");
    proxy.forward();
    let mut conn = TcpStream::connect(proxy.addr()).await.expect("reconnect");
    conn.write_all(b"d").await.expect("write");
    assert_eq!(read_within(&mut conn, 1, Duration::from_secs(5)).await.as_deref(), Some("d"));
}

#[tokio::test]
async fn drop_replies_after_lets_n_replies_through() {
    let (server, log) = echo_server().await;
    let proxy = FaultProxy::start(server);
    let mut conn = TcpStream::connect(proxy.addr()).await.expect("connect");
    proxy.drop_replies_after(2);
    for (request, reply) in [("a", Some("a")), ("b", Some("b")), ("c", None)] {
        conn.write_all(request.as_bytes()).await.expect("write");
        let within = if reply.is_some() { Duration::from_secs(5) } else { Duration::from_millis(300) };
        assert_eq!(read_within(&mut conn, 1, within).await.as_deref(), reply, "reply to {request}");
    }
    assert_eq!(received(&log), "abc", "every request was delivered");
    let counts = || {
        let s = proxy.stats();
        (s.replies_left, s.bytes_to_client, s.bytes_dropped)
    };
    wait_for("counters", || counts() == (0, 2, 1)).await;
}

#[tokio::test]
async fn delay_replies_delays_only_replies() {
    let (server, log) = echo_server().await;
    let proxy = FaultProxy::start(server);
    let mut conn = TcpStream::connect(proxy.addr()).await.expect("connect");
    let delay = Duration::from_millis(400);
    proxy.delay_replies(delay);
    let sent = Instant::now();
    conn.write_all(b"xy").await.expect("write");
    wait_for("request delivered", || received(&log) == "xy").await;
    assert!(sent.elapsed() < delay, "the request was delayed too");
    assert_eq!(read_within(&mut conn, 2, Duration::from_secs(5)).await.as_deref(), Some("xy"));
    let took = sent.elapsed();
    assert!(took >= delay && took < delay + Duration::from_secs(2), "round trip took {took:?}");
    // Back to normal on the same connection: the stream stayed in step.
    proxy.forward();
    let sent = Instant::now();
    conn.write_all(b"z").await.expect("write");
    assert_eq!(read_within(&mut conn, 1, Duration::from_secs(5)).await.as_deref(), Some("z"));
    assert!(sent.elapsed() < delay, "still delayed after forward()");
}

#[tokio::test]
async fn blackhole_holds_everything_until_forward() {
    let (server, log) = echo_server().await;
    let proxy = FaultProxy::start(server);
    let mut conn = TcpStream::connect(proxy.addr()).await.expect("connect");
    conn.write_all(b"1").await.expect("write");
    assert_eq!(read_within(&mut conn, 1, Duration::from_secs(5)).await.as_deref(), Some("1"));
    proxy.blackhole();
    conn.write_all(b"2").await.expect("write");
    assert_eq!(read_within(&mut conn, 1, Duration::from_millis(300)).await, None, "a reply got through");
    assert_eq!(received(&log), "1", "a request got through the blackhole");
    // A new connection is accepted and stays open, silent.
    let mut other = TcpStream::connect(proxy.addr()).await.expect("connect during blackhole");
    other.write_all(b"3").await.expect("write");
    assert!(!closed_within(&mut other, Duration::from_millis(200)).await, "blackhole closed a connection");
    assert_eq!(proxy.stats().open, 2);
    // A healed partition delivers what was held, in order.
    proxy.forward();
    assert_eq!(read_within(&mut conn, 1, Duration::from_secs(5)).await.as_deref(), Some("2"));
    assert_eq!(read_within(&mut other, 1, Duration::from_secs(5)).await.as_deref(), Some("3"));
}

#[tokio::test]
async fn cut_discards_what_a_blackhole_held() {
    let (server, log) = echo_server().await;
    let proxy = FaultProxy::start(server);
    let mut conn = TcpStream::connect(proxy.addr()).await.expect("connect");
    conn.write_all(b"1").await.expect("write");
    assert_eq!(read_within(&mut conn, 1, Duration::from_secs(5)).await.as_deref(), Some("1"));
    proxy.blackhole();
    conn.write_all(b"lost").await.expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.cut();
    proxy.forward();
    assert!(closed_within(&mut conn, Duration::from_secs(2)).await, "cut left the client connected");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(received(&log), "1", "bytes held by the blackhole reached the server after a cut");
}

#[tokio::test]
async fn refuse_resets_new_connections_only() {
    let (server, _) = echo_server().await;
    let proxy = FaultProxy::start(server);
    let mut open = TcpStream::connect(proxy.addr()).await.expect("connect");
    open.write_all(b"a").await.expect("write");
    assert_eq!(read_within(&mut open, 1, Duration::from_secs(5)).await.as_deref(), Some("a"));
    proxy.refuse();
    let mut refused = TcpStream::connect(proxy.addr()).await.expect("the accept itself succeeds");
    assert!(closed_within(&mut refused, Duration::from_secs(2)).await, "a refused connection stayed open");
    wait_for("refusal counted", || proxy.stats().refused == 1).await;
    // The connection opened before still forwards.
    open.write_all(b"b").await.expect("write");
    assert_eq!(read_within(&mut open, 1, Duration::from_secs(5)).await.as_deref(), Some("b"));
    proxy.forward();
    let mut again = TcpStream::connect(proxy.addr()).await.expect("connect");
    again.write_all(b"c").await.expect("write");
    assert_eq!(read_within(&mut again, 1, Duration::from_secs(5)).await.as_deref(), Some("c"));
}

#[test]
fn outlives_runtimes_and_closes_everything_on_drop() {
    let rt = || tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let server_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("rt");
    let (server, _) = server_rt.block_on(echo_server());
    let proxy = FaultProxy::start(server);
    let addr = proxy.addr();
    // A connection made on one runtime that is then dropped; the proxy carries on.
    rt().block_on(async {
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        conn.write_all(b"a").await.expect("write");
        assert_eq!(read_within(&mut conn, 1, Duration::from_secs(5)).await.as_deref(), Some("a"));
    });
    rt().block_on(async {
        let mut conn = TcpStream::connect(addr).await.expect("connect from a second runtime");
        conn.write_all(b"b").await.expect("write");
        assert_eq!(read_within(&mut conn, 1, Duration::from_secs(5)).await.as_deref(), Some("b"));
        drop(proxy);
        assert!(closed_within(&mut conn, Duration::from_secs(2)).await, "a connection outlived the proxy");
        assert!(TcpStream::connect(addr).await.is_err(), "the proxy's port still accepts");
    });
}
