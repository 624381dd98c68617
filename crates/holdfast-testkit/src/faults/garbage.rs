//! A hostile network peer: a TCP listener on loopback that answers every
//! connection with a script of garbage instead of a store's protocol.
//!
//! It stands where a store should be (a port reused by another service, a
//! middlebox, a store that crashed half-way through a reply, an attacker on
//! the path) and tests what a client does then: a typed error within its
//! timeout, no panic, no hang, no gigabyte buffer for a length prefix that
//! promises gigabytes. [`lookalikes`] gives byte strings that start like each
//! store's protocol (a RESP bulk string of a million bytes, a PostgreSQL
//! message of 2 GiB, a MySQL handshake cut short, an HTTP/2 frame of 16 MiB,
//! a ZooKeeper connect response of the wrong length) for scripts to send,
//! whole, cut or mutated.
//!
//! Like [`FaultProxy`](super::FaultProxy), the peer runs on its own OS thread
//! with its own tokio runtime, so a client that blocks the test's runtime
//! cannot stop it from following its script.

use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// How long a [`Step::Read`] waits for the client's first byte.
const READ_WAIT: Duration = Duration::from_secs(2);
/// How long [`Step::Silence`] keeps a connection open at most.
const SILENCE_LIMIT: Duration = Duration::from_secs(60);

/// One thing a peer does on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Writes these bytes (a write the client never reads is given up on
    /// when the client closes).
    Send(Vec<u8>),
    /// Writes `pattern` again and again until `bytes` bytes are sent (or the
    /// client closes): a reply that never ends where a parser waits for its
    /// end.
    Flood {
        /// What is repeated; empty sends nothing.
        pattern: Vec<u8>,
        /// How many bytes in all.
        bytes: usize,
    },
    /// Waits up to 2 s for the client to send something, then reads what it
    /// sent so far (discarded).
    Read,
    /// Waits this long.
    Pause(Duration),
    /// Closes the connection (FIN): the client reads end of stream.
    Close,
    /// Resets the connection (RST): the client's next read or write fails.
    Reset,
    /// Relays between the client and the peer's upstream (a real store, if
    /// the peer was started with [`GarbagePeer::relaying`]) until the store's
    /// `n`th reply chunk (one read from the store) reached the client, then
    /// goes on with the script: a store whose replies turn to garbage after
    /// the handshake, or in the middle of a call. Without an upstream it
    /// does nothing.
    Relay(u32),
    /// Keeps the connection open without a byte more, reading and
    /// discarding what the client sends, until the client closes (at most a
    /// minute): a peer that never replies.
    Silence,
}

/// What a peer does on one connection: its steps in order, then it closes
/// (unless a step closed, reset or went silent first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Script {
    /// The steps, in order.
    pub steps: Vec<Step>,
}

impl Script {
    /// A script of these steps.
    pub fn new(steps: Vec<Step>) -> Self {
        Script { steps }
    }
}

/// Counters for assertions; totals since the peer started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GarbageStats {
    /// Connections accepted.
    pub connections: u64,
    /// Bytes received from clients.
    pub bytes_in: u64,
    /// Bytes written to clients.
    pub bytes_out: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// A garbage peer on a free `127.0.0.1` port. Connection `i` (counting from
/// 0) follows `scripts[i % scripts.len()]`. Dropping the peer stops it and
/// closes every connection.
///
/// ```no_run
/// use holdfast_testkit::faults::{GarbagePeer, Script, Step};
/// // A RESP bulk string that promises a million bytes and sends two.
/// let peer = GarbagePeer::start(vec![Script::new(vec![
///     Step::Read,
///     Step::Send(b"$1000000\r\nab".to_vec()),
///     Step::Silence,
/// ])]);
/// let url = format!("redis://{}?timeout_ms=200", peer.addr());
/// // ... every call of a client of `url` fails with a typed error, promptly ...
/// ```
pub struct GarbagePeer {
    addr: SocketAddr,
    counters: Arc<Counters>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for GarbagePeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GarbagePeer").field("addr", &self.addr).field("stats", &self.stats()).finish()
    }
}

impl GarbagePeer {
    /// Starts a peer following `scripts` (one per connection, in turn; an
    /// empty list closes every connection at once). Blocks only to bind the
    /// port and start the thread; panics if either fails.
    pub fn start(scripts: Vec<Script>) -> GarbagePeer {
        Self::start_with(None, scripts)
    }

    /// Starts a peer whose [`Step::Relay`] steps relay to the store at
    /// `upstream` (one connection to it per client connection).
    pub fn relaying(upstream: SocketAddr, scripts: Vec<Script>) -> GarbagePeer {
        Self::start_with(Some(upstream), scripts)
    }

    fn start_with(upstream: Option<SocketAddr>, scripts: Vec<Script>) -> GarbagePeer {
        let listener =
            StdTcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("garbage peer: cannot bind a port: {e}"));
        listener.set_nonblocking(true).unwrap_or_else(|e| panic!("garbage peer: set_nonblocking: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("garbage peer: local_addr: {e}"));
        let counters = Arc::new(Counters::default());
        let (stop, stopped) = oneshot::channel();
        let thread_counters = counters.clone();
        let thread = std::thread::Builder::new()
            .name(format!("garbage-peer-{}", addr.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap_or_else(|e| panic!("garbage peer: tokio runtime: {e}"));
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener)
                        .unwrap_or_else(|e| panic!("garbage peer: listener into tokio: {e}"));
                    tokio::select! {
                        _ = stopped => {}
                        _ = accept_loop(listener, upstream, Arc::new(scripts), thread_counters) => {}
                    }
                });
                // Dropping the runtime drops every connection task and its socket.
                drop(rt);
            })
            .unwrap_or_else(|e| panic!("garbage peer: cannot spawn its thread: {e}"));
        GarbagePeer { addr, counters, stop: Some(stop), thread: Some(thread) }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counters so far.
    pub fn stats(&self) -> GarbageStats {
        GarbageStats {
            connections: self.counters.connections.load(Ordering::SeqCst),
            bytes_in: self.counters.bytes_in.load(Ordering::SeqCst),
            bytes_out: self.counters.bytes_out.load(Ordering::SeqCst),
        }
    }
}

impl Drop for GarbagePeer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: Option<SocketAddr>,
    scripts: Arc<Vec<Script>>,
    counters: Arc<Counters>,
) {
    let mut n = 0usize;
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        counters.connections.fetch_add(1, Ordering::SeqCst);
        let script = if scripts.is_empty() { Script::default() } else { scripts[n % scripts.len()].clone() };
        n += 1;
        tokio::spawn(follow(stream, upstream, script, counters.clone()));
    }
}

/// Follows `script` on one connection; any I/O error (the client closed)
/// ends it.
async fn follow(mut stream: TcpStream, upstream: Option<SocketAddr>, script: Script, counters: Arc<Counters>) {
    let _ = stream.set_nodelay(true);
    let mut buf = vec![0u8; 16 * 1024];
    let mut store: Option<TcpStream> = None;
    for step in script.steps {
        match step {
            Step::Relay(n) => {
                let Some(addr) = upstream else { continue };
                if store.is_none() {
                    match TcpStream::connect(addr).await {
                        Ok(s) => store = Some(s),
                        Err(_) => return,
                    }
                }
                let Some(server) = store.as_mut() else { return };
                let mut from_store = vec![0u8; 16 * 1024];
                let mut left = n;
                while left > 0 {
                    tokio::select! {
                        read = stream.read(&mut buf) => match read {
                            Ok(0) | Err(_) => return,
                            Ok(k) => {
                                if server.write_all(&buf[..k]).await.is_err() {
                                    return;
                                }
                                counters.bytes_in.fetch_add(k as u64, Ordering::SeqCst);
                            }
                        },
                        read = server.read(&mut from_store) => match read {
                            Ok(0) | Err(_) => break,
                            Ok(k) => {
                                if stream.write_all(&from_store[..k]).await.is_err() {
                                    return;
                                }
                                counters.bytes_out.fetch_add(k as u64, Ordering::SeqCst);
                                left -= 1;
                            }
                        },
                    }
                }
            }
            Step::Send(bytes) => {
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
                counters.bytes_out.fetch_add(bytes.len() as u64, Ordering::SeqCst);
            }
            Step::Flood { pattern, bytes } => {
                if pattern.is_empty() {
                    continue;
                }
                let chunk: Vec<u8> = pattern.iter().copied().cycle().take(bytes.min(64 * 1024)).collect();
                let mut left = bytes;
                while left > 0 {
                    let piece = &chunk[..left.min(chunk.len())];
                    if stream.write_all(piece).await.is_err() {
                        return;
                    }
                    counters.bytes_out.fetch_add(piece.len() as u64, Ordering::SeqCst);
                    left -= piece.len();
                }
            }
            Step::Read => match tokio::time::timeout(READ_WAIT, stream.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(n)) => {
                    counters.bytes_in.fetch_add(n as u64, Ordering::SeqCst);
                    // What else the client sent with it, without waiting.
                    while let Ok(n) = stream.try_read(&mut buf) {
                        if n == 0 {
                            return;
                        }
                        counters.bytes_in.fetch_add(n as u64, Ordering::SeqCst);
                    }
                }
                Err(_) => {}
            },
            Step::Pause(d) => tokio::time::sleep(d).await,
            Step::Close => break,
            Step::Reset => {
                let _ = stream.set_zero_linger();
                return;
            }
            Step::Silence => {
                let _ = tokio::time::timeout(SILENCE_LIMIT, async {
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => counters.bytes_in.fetch_add(n as u64, Ordering::SeqCst),
                        };
                    }
                })
                .await;
                return;
            }
        }
    }
    let _ = stream.shutdown().await;
}

/// A store's wire protocol, for [`lookalikes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Redis (RESP2/RESP3): Redis, Sentinel, Cluster, RedLock members.
    Resp,
    /// PostgreSQL's frontend/backend protocol.
    Postgres,
    /// MySQL's client/server protocol (MariaDB too).
    Mysql,
    /// HTTP/2, as gRPC to etcd speaks it.
    Http2,
    /// ZooKeeper's jute-encoded protocol.
    ZooKeeper,
}

/// Byte strings that start like `protocol`'s replies but are wrong: a
/// truncated message, a length prefix far beyond the bytes that follow
/// (up to gigabytes), a reply of the wrong type, a negative count. A script
/// sends them whole, cut short, or mutated.
pub fn lookalikes(protocol: Protocol) -> Vec<Vec<u8>> {
    let v = |b: &[u8]| b.to_vec();
    match protocol {
        Protocol::Resp => vec![
            v(b"$1000000\r\nab"),
            v(b"*-5\r\n"),
            v(b"*2147483647\r\n"),
            v(b"$9223372036854775807\r\n"),
            v(b"$-2\r\n"),
            v(b"*3\r\n:1\r\n"),
            v(b":not-a-number\r\n"),
            v(b"+OK"),
            v(b"+OK\r\n"),
            v(b":1\r\n"),
            v(b"-ERR garbage\r\n"),
            v(b"-NOSCRIPT No matching script\r\n"),
            v(b"%2147483647\r\n"),
            v(b">3\r\n$7\r\nmessage\r\n"),
            v(b"_\r\n"),
            v(b",inf\r\n#t\r\n"),
            v(b"=15\r\ntxt:short\r\n"),
            v(b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n"),
        ],
        Protocol::Postgres => vec![
            // Authentication request of 2 GiB.
            v(b"R\x7f\xff\xff\xff\x00\x00\x00\x00"),
            // An unknown authentication method.
            v(b"R\x00\x00\x00\x08\x00\x00\x00\x63"),
            // SASL with a mechanism nobody knows, then nothing.
            v(b"R\x00\x00\x00\x17\x00\x00\x00\x0aGARBAGE-SHA\x00\x00"),
            // Authentication OK, then a ReadyForQuery of 4 GiB.
            v(b"R\x00\x00\x00\x08\x00\x00\x00\x00Z\xff\xff\xff\xff"),
            // A length below the header's own 4 bytes.
            v(b"E\x00\x00\x00\x02"),
            // An error response cut short.
            v(b"E\x00\x00\x00\x40SFATAL\x00C28P01\x00Mpassword"),
            // Authentication OK and ready, then a DataRow of 1 GiB.
            v(b"R\x00\x00\x00\x08\x00\x00\x00\x00Z\x00\x00\x00\x05ID\x40\x00\x00\x00\x00\x01"),
            // The answer to an SSL request, then garbage.
            v(b"S\x16\x03\x01\xff\xff"),
            v(b"N"),
        ],
        Protocol::Mysql => vec![
            // A handshake packet cut in the middle of the server version.
            v(b"\x4a\x00\x00\x00\x0a5.5.5-10.11"),
            // A packet of 16 MiB - 1 (the largest length) with no body.
            v(b"\xff\xff\xff\x00"),
            // Protocol version 9.
            v(b"\x10\x00\x00\x00\x09garbage\x00\x01\x00\x00\x00"),
            // An ERR packet as a greeting, cut short.
            v(b"\x17\x00\x00\x00\xff\x15\x04#28000Access den"),
            // A whole-looking handshake v10 with an unknown auth plugin and bogus capabilities.
            {
                let mut body = vec![0x0a];
                body.extend_from_slice(b"8.0.0-garbage\0");
                body.extend_from_slice(&[1, 0, 0, 0]);
                body.extend_from_slice(b"abcdefgh\0");
                body.extend_from_slice(&[0xff, 0xff, 0x21, 0x02, 0x00, 0xff, 0xff, 0xff]);
                body.extend_from_slice(&[0u8; 10]);
                body.extend_from_slice(b"ijklmnopqrst\0garbage_plugin\0");
                let mut p = vec![body.len() as u8, 0, 0, 0];
                p.extend_from_slice(&body);
                p
            },
            // An OK packet where the handshake belongs.
            v(b"\x07\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00"),
            // Sequence number out of order.
            v(b"\x01\x00\x00\x07\x0a"),
        ],
        Protocol::Http2 => vec![
            // SETTINGS announcing a frame of 16 MiB, then only its header.
            v(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x05\x00\xff\xff\xff\x00\xff\xff\xff\x00\x00\x00\x00\x01"),
            // The client's connection preface, echoed back, then garbage.
            v(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x07\x00\x00\x00\x00\x00garbage"),
            // An empty SETTINGS, then GOAWAY with an unknown error code.
            v(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x08\x07\x00\x00\x00\x00\x00\x7f\xff\xff\xff\xde\xad\xbe\xef"),
            // An HTTP/1.1 reply.
            v(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 999999999\r\n\r\n"),
            // SETTINGS then HEADERS on stream 1 of garbage HPACK.
            v(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x05\x01\x04\x00\x00\x00\x01\xff\xff\xff\xff\xff"),
            // SETTINGS then DATA on stream 1: a gRPC message of 4 GiB.
            v(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x01\x00\xff\xff\xff\xff"),
        ],
        Protocol::ZooKeeper => vec![
            // A connect response whose length says 2 GiB.
            v(b"\x7f\xff\xff\xff\x00\x00\x00\x00"),
            // A negative length.
            v(b"\xff\xff\xff\xff\x00\x00\x00\x00"),
            // A length of 4: too short for a connect response.
            v(b"\x00\x00\x00\x04\x00\x00\x00\x00"),
            // A whole connect response whose password length is 2 GiB.
            v(b"\x00\x00\x00\x24\x00\x00\x00\x00\x00\x00\x75\x30\x00\x00\x00\x00\x00\x00\x00\x01\x7f\xff\xff\xff\x00"),
            // A connect response with a timeout of 0 and a session of -1.
            v(b"\x00\x00\x00\x25\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x10\
                0123456789abcdef\x00"),
            // A reply header for an xid never sent, with an error code.
            v(b"\x00\x00\x00\x10\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00\x01\xff\xff\xff\x9c"),
        ],
    }
}
