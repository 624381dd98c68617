//! Telling a connection that reaches a PostgreSQL backend of its own from
//! one through a pooler, so that named prepared statements (session state)
//! are only used where the session is the connection's own, and only a
//! direct connection's backend is ended when the connection is lost
//! (`lost`).
//!
//! A pooler answers the client's startup itself, before it knows which
//! server connection later statements will run on, so the BackendKeyData it
//! sends (the key a client quotes to cancel a query) cannot be the key of the
//! backend a statement meets: PgBouncer, Odyssey and pgcat make up their own.
//! A backend's key carries its process id, so a connection is direct exactly
//! when that id is the `pg_backend_pid()` its statements report.

use std::future::{Ready, ready};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio_postgres::Client as PgClient;
use tokio_postgres::tls::{ChannelBinding, TlsConnect, TlsStream};

/// The SSLRequest message: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
/// The head of a CancelRequest message: length 16, code 80877102; the
/// process id and the secret follow.
const CANCEL_REQUEST: [u8; 8] = [0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e];

/// The process id in the BackendKeyData `client` received at startup.
/// tokio-postgres keeps it private but writes it into a cancel request, so
/// it writes one into an in-memory pipe here and the id is read back out;
/// nothing is sent to any server.
pub(super) async fn announced_pid(client: &PgClient) -> Option<i32> {
    let (ours, theirs) = tokio::io::duplex(64);
    let token = client.cancel_token();
    let (_, pid) = tokio::join!(token.cancel_query_raw(theirs, InMemory), read_cancel_request(ours));
    pid
}

/// Plays the server's part of a cancel request: accepts the TLS request if
/// one comes (the "TLS" is [`InMemory`]) and returns the process id.
async fn read_cancel_request(mut pipe: DuplexStream) -> Option<i32> {
    let mut head = [0u8; 8];
    pipe.read_exact(&mut head).await.ok()?;
    if head == SSL_REQUEST {
        pipe.write_all(b"S").await.ok()?;
        pipe.read_exact(&mut head).await.ok()?;
    }
    if head != CANCEL_REQUEST {
        return None;
    }
    let mut pid = [0u8; 4];
    pipe.read_exact(&mut pid).await.ok()?;
    Some(i32::from_be_bytes(pid))
}

/// A "TLS" connector that leaves the in-memory pipe as it is, whatever
/// `sslmode` the connection's cancel token asks for.
struct InMemory;

/// The pipe, as the stream [`InMemory`] hands back.
struct InMemoryStream(DuplexStream);

impl TlsConnect<DuplexStream> for InMemory {
    type Stream = InMemoryStream;
    type Error = io::Error;
    type Future = Ready<io::Result<InMemoryStream>>;

    fn connect(self, stream: DuplexStream) -> Self::Future {
        ready(Ok(InMemoryStream(stream)))
    }
}

impl TlsStream for InMemoryStream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for InMemoryStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for InMemoryStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
