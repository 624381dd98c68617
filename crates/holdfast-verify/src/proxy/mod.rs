//! A TCP proxy between a client and a store that injects faults on demand.
//!
//! The proxy runs on its own OS thread with its own single-threaded tokio
//! runtime, so it keeps working while a test's runtime is blocked, and
//! outlives it: a test can build and drop runtimes around one proxy.
//! Every accepted connection is forwarded to the upstream address through
//! two pumps (requests: client to server; replies: server to client) that
//! consult the current [`Fault`] for every chunk they move, so switching
//! faults applies to open connections at once as well as to new ones.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

mod relay;
use relay::accept_loop;

/// How long the proxy waits for the upstream to accept a connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`FaultProxy::cut`] waits for the cut connections to be gone.
const CUT_TIMEOUT: Duration = Duration::from_secs(5);
const CHUNK: usize = 16 * 1024;

/// What the proxy does with the traffic it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Bytes flow both ways unchanged.
    Forward,
    /// Requests reach the server (and are applied); every reply byte is
    /// discarded. The client's byte stream is then out of step with the
    /// server's, so [`cut`](FaultProxy::cut) before going back to
    /// [`Forward`](Fault::Forward).
    DropReplies,
    /// The next `n` reply chunks reach the client, then every reply byte is
    /// discarded as with [`DropReplies`](Fault::DropReplies). A chunk is what
    /// one read from the server returned, usually one reply of a
    /// request-reply protocol (counted over all connections). For stores whose
    /// operation takes several round trips (a transaction, a read before a
    /// create), letting n replies through loses the reply of a later step:
    /// the one that applied the change.
    DropRepliesAfter(u64),
    /// The next `n` reply chunks reach the client (counted as with
    /// [`DropRepliesAfter`](Fault::DropRepliesAfter)); right after the
    /// last of them, its connection is closed, both sides, and the proxy
    /// forwards again: a connection lost just after a reply arrived, before
    /// the client's next request.
    CutAfterReplies(u64),
    /// Every reply byte reaches the client this much later than it left the
    /// server (order kept); requests flow unchanged.
    DelayReplies(Duration),
    /// Nothing moves either way and connections stay open: a hung store or
    /// a partition. The proxy stops reading, so bytes sent meanwhile wait in
    /// the kernel's socket buffers: [`forward`](FaultProxy::forward)
    /// delivers them late (a healed partition), [`cut`](FaultProxy::cut)
    /// discards them (connections that died in the partition).
    Blackhole,
    /// New connections are accepted and reset at once (a store that is
    /// down); open connections keep forwarding, so pair it with
    /// [`cut`](FaultProxy::cut) to make the store unreachable.
    Refuse,
}

/// Counters for assertions; all are totals since the proxy started, except `open`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted (refused ones included).
    pub accepted: u64,
    /// Connections reset at once under [`Fault::Refuse`].
    pub refused: u64,
    /// Connections open now.
    pub open: u64,
    /// Reply chunks still let through under [`Fault::DropRepliesAfter`].
    pub replies_left: u64,
    /// Bytes delivered to the server.
    pub bytes_to_server: u64,
    /// Bytes delivered to clients.
    pub bytes_to_client: u64,
    /// Reply bytes discarded under [`Fault::DropReplies`].
    pub bytes_dropped: u64,
}

/// State shared by the proxy handle and its connection tasks.
struct Shared {
    fault: watch::Sender<Fault>,
    /// Bumped by every cut; each connection closes when it changes.
    cuts: watch::Sender<u64>,
    /// Ids of the open connections, so that `cut` can wait for them to close.
    open: Mutex<HashSet<u64>>,
    next_id: AtomicU64,
    /// Reply chunks still to let through under [`Fault::DropRepliesAfter`].
    replies_left: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    bytes_to_server: AtomicU64,
    bytes_to_client: AtomicU64,
    bytes_dropped: AtomicU64,
    /// Once [`FaultProxy::record_requests`] was called: the bytes each
    /// connection (by id) delivered to the server.
    recorded: Mutex<Option<std::collections::BTreeMap<u64, Vec<u8>>>>,
}

impl Shared {
    fn open_ids(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        // A poisoned set only means a connection task panicked; the ids are still right.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A fault-injecting TCP proxy on `127.0.0.1`, forwarding to one upstream.
/// Dropping it stops it and closes every connection.
///
/// ```no_run
/// # fn demo(redis: std::net::SocketAddr) {
/// use holdfast_verify::proxy::FaultProxy;
/// let proxy = FaultProxy::start(redis);
/// let url = format!("redis://{}?timeout_ms=1000", proxy.addr());
/// // ... a client connects to `url` and holds a lock ...
/// proxy.drop_replies(); // requests still applied, replies lost
/// // ... the client's next call fails after its timeout ...
/// proxy.cut(); // the stream is out of step: start over
/// proxy.forward();
/// # }
/// ```
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("fault", &self.fault())
            .field("stats", &self.stats())
            .finish()
    }
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on a free loopback port, forwarding.
    /// Blocks only to bind the port and start the thread; panics if either fails.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let listener =
            StdTcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("fault proxy: cannot bind a port: {e}"));
        listener.set_nonblocking(true).unwrap_or_else(|e| panic!("fault proxy: set_nonblocking: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("fault proxy: local_addr: {e}"));
        let shared = Arc::new(Shared {
            fault: watch::Sender::new(Fault::Forward),
            cuts: watch::Sender::new(0),
            open: Mutex::new(HashSet::new()),
            next_id: AtomicU64::new(0),
            replies_left: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            bytes_to_server: AtomicU64::new(0),
            bytes_to_client: AtomicU64::new(0),
            bytes_dropped: AtomicU64::new(0),
            recorded: Mutex::new(None),
        });
        let (stop, stopped) = oneshot::channel();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap_or_else(|e| panic!("fault proxy: tokio runtime: {e}"));
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener)
                        .unwrap_or_else(|e| panic!("fault proxy: listener into tokio: {e}"));
                    tokio::select! {
                        _ = stopped => {}
                        _ = accept_loop(listener, upstream, thread_shared) => {}
                    }
                });
                // Dropping the runtime drops every connection task, and with
                // them both sockets of every connection.
                drop(rt);
            })
            .unwrap_or_else(|e| panic!("fault proxy: cannot spawn its thread: {e}"));
        FaultProxy { addr, upstream, shared, stop: Some(stop), thread: Some(thread) }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address traffic is forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        *self.shared.fault.borrow()
    }

    /// Switches to `fault`, for open and new connections alike.
    pub fn set(&self, fault: Fault) {
        self.shared.fault.send_replace(fault);
    }

    /// Forwards normally. After [`drop_replies`](Self::drop_replies),
    /// [`cut`](Self::cut) first: open connections are out of step.
    pub fn forward(&self) {
        self.set(Fault::Forward);
    }

    /// Applies requests, loses replies: see [`Fault::DropReplies`].
    pub fn drop_replies(&self) {
        self.set(Fault::DropReplies);
    }

    /// Lets `n` more reply chunks through, then loses replies: see
    /// [`Fault::DropRepliesAfter`]. [`cut`](Self::cut) before forwarding again.
    pub fn drop_replies_after(&self, n: u64) {
        self.shared.replies_left.store(n, Ordering::SeqCst);
        self.set(Fault::DropRepliesAfter(n));
    }

    /// Lets `n` more reply chunks through, then closes the connection that
    /// carried the last: see [`Fault::CutAfterReplies`].
    pub fn cut_after_replies(&self, n: u64) {
        self.shared.replies_left.store(n, Ordering::SeqCst);
        self.set(Fault::CutAfterReplies(n));
    }

    /// Delays every reply by `delay`: see [`Fault::DelayReplies`].
    pub fn delay_replies(&self, delay: Duration) {
        self.set(Fault::DelayReplies(delay));
    }

    /// Moves nothing, keeps connections open: see [`Fault::Blackhole`].
    pub fn blackhole(&self) {
        self.set(Fault::Blackhole);
    }

    /// Resets new connections at once: see [`Fault::Refuse`].
    pub fn refuse(&self) {
        self.set(Fault::Refuse);
    }

    /// Closes every open connection, both sides, and returns once they are
    /// closed (bytes the proxy still held are discarded). The fault in force
    /// is unchanged; connections made afterwards are new ones. Blocks the
    /// calling thread for the few milliseconds that takes (the proxy runs on
    /// its own thread, so this is safe inside a test's runtime).
    pub fn cut(&self) {
        let cut: Vec<u64> = self.shared.open_ids().iter().copied().collect();
        self.shared.cuts.send_modify(|generation| *generation += 1);
        let deadline = std::time::Instant::now() + CUT_TIMEOUT;
        loop {
            let still_open = {
                let open = self.shared.open_ids();
                cut.iter().filter(|id| open.contains(id)).count()
            };
            if still_open == 0 {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "fault proxy: {still_open} connection(s) still open {CUT_TIMEOUT:?} after cut()"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// From now on, keeps a copy of every byte each new connection delivers
    /// to the server, for [`recorded_requests`](Self::recorded_requests).
    pub fn record_requests(&self) {
        self.shared.recorded.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_default();
    }

    /// What each connection accepted since [`record_requests`](Self::record_requests)
    /// delivered to the server so far, in the order they were accepted: sent
    /// again from the start on a new connection, it makes the server run
    /// every request again (a late copy of a client's requests).
    pub fn recorded_requests(&self) -> Vec<Vec<u8>> {
        let recorded = self.shared.recorded.lock().unwrap_or_else(|p| p.into_inner());
        recorded.iter().flat_map(|by_id| by_id.values().cloned()).collect()
    }

    /// The counters so far.
    pub fn stats(&self) -> ProxyStats {
        let s = &self.shared;
        ProxyStats {
            accepted: s.accepted.load(Ordering::SeqCst),
            refused: s.refused.load(Ordering::SeqCst),
            open: s.open_ids().len() as u64,
            replies_left: s.replies_left.load(Ordering::SeqCst),
            bytes_to_server: s.bytes_to_server.load(Ordering::SeqCst),
            bytes_to_client: s.bytes_to_client.load(Ordering::SeqCst),
            bytes_dropped: s.bytes_dropped.load(Ordering::SeqCst),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
