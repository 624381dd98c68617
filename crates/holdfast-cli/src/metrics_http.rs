//! `--metrics-addr ADDR`: serves the library's metrics (see
//! `holdfast::metrics`) in Prometheus text format at `http://ADDR/metrics`
//! while the command runs. The recorder is installed before the store is
//! connected, so every handle the client registers reaches it.
//!
//! The server is a few lines over a TCP listener: it answers every request
//! with the rendered metrics, one request per connection, and needs no HTTP
//! library. Only the CLI depends on the exporter; the library emits through
//! the `metrics` facade alone.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::exit::{Failure, INTERNAL};

/// How often histogram summaries are compacted.
const UPKEEP: Duration = Duration::from_secs(5);
/// The most of a request read before answering.
const MAX_REQUEST: usize = 8192;

/// Installs the Prometheus recorder and serves it on `addr` on a task of the
/// current runtime; returns the address bound (port 0 picks one).
///
/// # Cancel safety
///
/// Dropped before it returns, it has at most bound the address (released
/// with the dropped listener) and installed the recorder, which stays
/// installed for the process: a second call then fails.
pub async fn serve(addr: SocketAddr) -> Result<SocketAddr, Failure> {
    // The address is the caller's choice (in use, not ours to bind): a usage
    // error saying so, not an internal one.
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        Failure::usage(format!("--metrics-addr {addr}: cannot listen there: {e}; pick a free port (or port 0)"))
    })?;
    let bound = listener.local_addr().unwrap_or(addr);
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Failure::new(INTERNAL, format!("cannot install the metrics recorder: {e}")))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP).await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(answer(stream, handle.clone()));
                }
                Err(e) => tracing::debug!(error = %e, "metrics listener: accept failed"),
            }
        }
    });
    Ok(bound)
}

/// Reads the request head (whatever it asks) and answers with the metrics.
async fn answer(mut stream: TcpStream, handle: PrometheusHandle) {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    let read_head = async {
        while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < MAX_REQUEST {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(5), read_head).await.is_err() {
        return;
    }
    let body = handle.render();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
}
