//! The relay of each accepted connection: the accept loop, and the two
//! pumps of a connection (requests, replies) that apply the fault in force
//! to every chunk they move.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::{CHUNK, Fault, Shared, UPSTREAM_CONNECT_TIMEOUT};

pub(super) async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(e) => {
                // Out of file descriptors and the like: try again shortly.
                tracing::warn!(error = %e, "fault proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        if *shared.fault.borrow() == Fault::Refuse {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            // SO_LINGER 0: the close sends a reset, as a port nobody serves would.
            let _ = client.set_zero_linger();
            drop(client);
            continue;
        }
        // Subscribe before the id is visible to `cut`, so that no cut can be missed.
        let cuts = shared.cuts.subscribe();
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        shared.open_ids().insert(id);
        if let Some(by_id) = shared.recorded.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            by_id.insert(id, Vec::new());
        }
        let open = OpenConnection { id, shared: shared.clone() };
        tokio::spawn(async move {
            if let Err(e) = serve(client, upstream, &open.shared, cuts, id).await {
                tracing::debug!(error = %e, "fault proxy: connection ended");
            }
            drop(open);
        });
    }
}

/// Removes a connection's id from the open set when its task ends or is dropped.
struct OpenConnection {
    id: u64,
    shared: Arc<Shared>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.shared.open_ids().remove(&self.id);
    }
}

async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    shared: &Shared,
    mut cuts: watch::Receiver<u64>,
    id: u64,
) -> io::Result<()> {
    let relay = async move {
        let server = tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "upstream connect timed out"))??;
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::try_join!(
            pump_requests(client_read, server_write, shared, id),
            pump_replies(server_read, client_write, shared)
        )
        .map(|_| ())
    };
    tokio::select! {
        outcome = relay => outcome,
        // Dropping `relay` closes both sockets.
        _ = cuts.changed() => Ok(()),
    }
}

/// Waits while the fault is [`Fault::Blackhole`]; returns the fault then in force.
async fn unless_blackholed(fault: &mut watch::Receiver<Fault>) -> Fault {
    match fault.wait_for(|f| *f != Fault::Blackhole).await {
        Ok(f) => *f,
        // The sender lives as long as `Shared`, which this task holds.
        Err(_) => Fault::Forward,
    }
}

/// Reads a chunk from `from` into `buf`, unless the fault changes first;
/// `None` then, so that the caller looks at the new fault before reading on
/// (a blackhole must stop reading at once).
async fn read_chunk(
    from: &mut OwnedReadHalf,
    buf: &mut [u8],
    fault: &mut watch::Receiver<Fault>,
) -> io::Result<Option<usize>> {
    tokio::select! {
        read = from.read(buf) => read.map(Some),
        changed = fault.changed() => match changed {
            Ok(()) => Ok(None),
            Err(_) => std::future::pending().await,
        },
    }
}

/// Client to server: forwarded under every fault but a blackhole.
async fn pump_requests(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, shared: &Shared, id: u64) -> io::Result<()> {
    let mut fault = shared.fault.subscribe();
    let mut buf = vec![0u8; CHUNK];
    loop {
        unless_blackholed(&mut fault).await;
        let Some(n) = read_chunk(&mut from, &mut buf, &mut fault).await? else { continue };
        if n == 0 {
            // The client half-closed: pass it on, keep carrying replies.
            return to.shutdown().await;
        }
        // Bytes read just before a blackhole began are held with the rest.
        unless_blackholed(&mut fault).await;
        to.write_all(&buf[..n]).await?;
        shared.bytes_to_server.fetch_add(n as u64, Ordering::SeqCst);
        if let Some(bytes) =
            shared.recorded.lock().unwrap_or_else(|p| p.into_inner()).as_mut().and_then(|r| r.get_mut(&id))
        {
            bytes.extend_from_slice(&buf[..n]);
        }
    }
}

/// Server to client: read as they come, then written by [`write_replies`]
/// when due, so that a delay does not slow the reading down.
async fn pump_replies(mut from: OwnedReadHalf, to: OwnedWriteHalf, shared: &Shared) -> io::Result<()> {
    let (queue, queued) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut fault = shared.fault.subscribe();
        let mut buf = vec![0u8; CHUNK];
        loop {
            unless_blackholed(&mut fault).await;
            let Some(n) = read_chunk(&mut from, &mut buf, &mut fault).await? else { continue };
            if n == 0 {
                drop(queue); // the writer sends what is queued, then half-closes
                return Ok(());
            }
            let due = match unless_blackholed(&mut fault).await {
                Fault::DelayReplies(delay) => Instant::now() + delay,
                _ => Instant::now(),
            };
            // Fails only if the writer stopped, which ends the connection anyway.
            let _ = queue.send((due, buf[..n].to_vec()));
        }
    };
    tokio::try_join!(read, write_replies(queued, to, shared)).map(|_| ())
}

/// Writes queued replies in order once due, applying the fault in force at
/// writing time: held in a blackhole, discarded when replies are dropped
/// (after the allowance of [`Fault::DropRepliesAfter`] is spent).
async fn write_replies(
    mut queued: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    mut to: OwnedWriteHalf,
    shared: &Shared,
) -> io::Result<()> {
    let mut fault = shared.fault.subscribe();
    while let Some((due, bytes)) = queued.recv().await {
        tokio::time::sleep_until(due).await;
        let take_one = || shared.replies_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        let (drop, cut) = match unless_blackholed(&mut fault).await {
            Fault::DropReplies => (true, false),
            Fault::DropRepliesAfter(_) => (take_one().is_err(), false),
            Fault::CutAfterReplies(_) => (false, take_one() == Ok(1)),
            _ => (false, false),
        };
        if drop {
            shared.bytes_dropped.fetch_add(bytes.len() as u64, Ordering::SeqCst);
            continue;
        }
        to.write_all(&bytes).await?;
        shared.bytes_to_client.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        if cut {
            shared.fault.send_replace(Fault::Forward);
            // The error ends the relay, which closes both sockets.
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "cut after the last reply let through"));
        }
    }
    to.shutdown().await
}
