//! Session leases: one etcd lease per lease TTL in use, kept alive by one
//! keep-alive stream, whose loss cancels the session's token.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Conn;
use crate::error::{Error, Result};

type Confirm = oneshot::Sender<Result<()>>;

/// One session lease. Every key the client writes with this lease TTL is
/// attached to it, so one keep-alive message renews all of them.
#[derive(Debug)]
pub(super) struct Session {
    /// The etcd lease id.
    pub(super) lease: i64,
    /// Cancelled when the lease may have expired on the server: the server
    /// said it is gone, or no keep-alive was confirmed within its TTL.
    pub(super) lost: CancellationToken,
    confirm_tx: mpsc::Sender<Confirm>,
}

impl Session {
    /// Grants a lease of `ttl_secs` and starts its keep-alive task, which
    /// ends (revoking the lease) when `shutdown` is cancelled.
    pub(super) async fn start(conn: &Conn, ttl_secs: i64, shutdown: CancellationToken) -> Result<Arc<Session>> {
        let sent = Instant::now();
        let granted = conn.call("lease grant", |mut c| async move { c.lease_grant(ttl_secs, None).await }).await?;
        if granted.ttl() <= 0 || !granted.error().is_empty() {
            return Err(Error::backend(super::STORE, true, format!("lease grant refused: {}", granted.error())));
        }
        let ttl = Duration::from_secs(granted.ttl() as u64);
        let (confirm_tx, confirm_rx) = mpsc::channel(64);
        let session = Arc::new(Session { lease: granted.id(), lost: CancellationToken::new(), confirm_tx });
        let task = KeepAlive {
            conn: conn.clone(),
            lease: granted.id(),
            ttl,
            confirmed_until: sent + ttl - margin(ttl),
            lost: session.lost.clone(),
            shutdown,
            rx: confirm_rx,
        };
        tokio::spawn(task.run());
        Ok(session)
    }

    /// Sends one keep-alive now and waits for the server's answer: `Ok` means
    /// the lease was extended to its full TTL from a moment after this call.
    pub(super) async fn confirm(&self) -> Result<()> {
        if self.lost.is_cancelled() {
            return Err(session_lost());
        }
        let (tx, rx) = oneshot::channel();
        self.confirm_tx.send(tx).await.map_err(|_| session_lost())?;
        rx.await.map_err(|_| session_lost())?
    }
}

/// The error of an operation whose session lease is gone.
pub(super) fn session_lost() -> Error {
    Error::backend(super::STORE, true, "the etcd session lease expired or was revoked")
}

/// The client's view of a lease ends this much before the server's (clock-rate drift).
fn margin(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(1)
}

struct KeepAlive {
    conn: Conn,
    lease: i64,
    ttl: Duration,
    /// Until when the server is known to keep the lease (client clock).
    confirmed_until: Instant,
    lost: CancellationToken,
    shutdown: CancellationToken,
    rx: mpsc::Receiver<Confirm>,
}

impl KeepAlive {
    async fn run(mut self) {
        let outcome = self.keep_alive().await;
        self.lost.cancel();
        if outcome == Ended::Shutdown {
            // Best effort: free every key of this session now rather than at expiry.
            let lease = self.lease;
            let conn = self.conn.clone();
            let _ = tokio::time::timeout(Duration::from_secs(1), async move {
                conn.call("lease revoke", |mut c| async move { c.lease_revoke(lease).await }).await
            })
            .await;
        }
        self.rx.close();
        while let Ok(tx) = self.rx.try_recv() {
            let _ = tx.send(Err(session_lost()));
        }
    }

    async fn keep_alive(&mut self) -> Ended {
        let interval = (self.ttl / 3).max(Duration::from_millis(100));
        // A keep-alive answers in milliseconds; one sent on a connection to a
        // dead member never does. Give up on a stream well before the lease
        // runs out, so there is time to reopen it on another endpoint.
        let per_try = (self.ttl / 4).clamp(Duration::from_millis(250), self.conn.timeout);
        loop {
            let left = self.confirmed_until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(lease = self.lease, "etcd session lease not confirmed within its TTL: session lost");
                return Ended::Lost;
            }
            let mut client = self.conn.client.clone();
            let opened = tokio::select! {
                _ = self.shutdown.cancelled() => return Ended::Shutdown,
                r = tokio::time::timeout(left.min(per_try), client.lease_keep_alive(self.lease)) => r,
            };
            let (mut keeper, mut stream) = match opened {
                Ok(Ok(pair)) => pair,
                other => {
                    tracing::debug!(lease = self.lease, ?other, "etcd keep-alive stream failed to open; retrying");
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return Ended::Shutdown,
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                    continue;
                }
            };
            let mut next = Instant::now();
            loop {
                let mut waiting = Vec::new();
                tokio::select! {
                    _ = self.shutdown.cancelled() => return Ended::Shutdown,
                    _ = tokio::time::sleep_until(next) => {}
                    Some(tx) = self.rx.recv() => waiting.push(tx),
                }
                while let Ok(tx) = self.rx.try_recv() {
                    waiting.push(tx);
                }
                let sent = Instant::now();
                let left = self.confirmed_until.saturating_duration_since(sent);
                let answer = tokio::time::timeout(left.min(per_try), async {
                    keeper.keep_alive().await?;
                    stream.message().await
                })
                .await;
                match answer {
                    Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                        let ttl = Duration::from_secs(resp.ttl() as u64);
                        self.confirmed_until = sent + ttl - margin(ttl);
                        next = sent + interval;
                        for tx in waiting {
                            let _ = tx.send(Ok(()));
                        }
                    }
                    Ok(Ok(Some(_))) => {
                        tracing::warn!(lease = self.lease, "etcd session lease expired or revoked: session lost");
                        for tx in waiting {
                            let _ = tx.send(Err(session_lost()));
                        }
                        return Ended::Lost;
                    }
                    other => {
                        tracing::debug!(lease = self.lease, ?other, "etcd keep-alive failed; reopening the stream");
                        for tx in waiting {
                            let _ = tx.send(Err(Error::backend(super::STORE, true, "etcd keep-alive failed")));
                        }
                        break;
                    }
                }
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Ended {
    Lost,
    Shutdown,
}
