//! The LISTEN connection that wakes this client's waiters, started when a
//! waiter first meets a busy key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio_postgres::AsyncMessage;
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::error::{map_err, timed_out};
use super::{PostgresBackend, STORE};
use crate::backend::wait::LocalWakeups;
use crate::vocabulary::error::{Error, Result};

/// Back-off of listener reconnects.
const RECONNECT_MIN: Duration = Duration::from_millis(25);
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// How often an idle listener checks that its connection still answers.
const LISTENER_PING: Duration = Duration::from_secs(10);

/// Keys that waiters of this client wait on, so a reconnected listener can
/// wake one waiter per key (notifications sent while it was down are lost).
#[derive(Debug, Default)]
pub(super) struct WaitingKeys(Mutex<HashMap<String, usize>>);

impl WaitingKeys {
    pub(super) fn enter(self: &Arc<Self>, key: &str) -> WaitingGuard {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()).entry(key.to_owned()).or_default() += 1;
        WaitingGuard { keys: self.clone(), key: key.to_owned() }
    }

    /// How many waiters of this client wait for `key`.
    pub(super) fn count(&self, key: &str) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied().unwrap_or(0)
    }

    fn poke_all(&self, wakeups: &LocalWakeups) {
        let keys: Vec<String> = self.0.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        for k in keys {
            wakeups.wake_one(&k);
        }
    }
}

pub(super) struct WaitingGuard {
    keys: Arc<WaitingKeys>,
    key: String,
}

impl Drop for WaitingGuard {
    fn drop(&mut self) {
        let mut map = self.keys.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// The listener task's handle: readiness, and a guard that stops it.
pub(super) struct Listener {
    ready: watch::Receiver<bool>,
    _stop: DropGuard,
}

impl PostgresBackend {
    /// Starts the listener on first use; returns whether it is listening now.
    pub(super) async fn ensure_listener(&self) -> bool {
        let i = &self.inner;
        let Some(cfg) = i.config.listen.clone() else { return false };
        let listener = i.listener.get_or_init(|| {
            let (tx, rx) = watch::channel(false);
            let stop = CancellationToken::new();
            let task = ListenTask {
                pg: cfg,
                tls: i.pool.tls.clone(),
                channel: i.channel.clone(),
                wakeups: i.wakeups.clone(),
                waiting: i.waiting.clone(),
                ready: tx,
                stop: stop.clone(),
                connect_timeout: i.config.op_timeout,
            };
            tokio::spawn(task.run());
            Listener { ready: rx, _stop: stop.drop_guard() }
        });
        let mut ready = listener.ready.clone();
        if *ready.borrow() {
            return true;
        }
        // The first waiter gives the listener a moment to LISTEN, so that
        // the first release is not missed; later ones poll while it reconnects.
        matches!(
            tokio::time::timeout(Duration::from_secs(2).min(i.config.op_timeout), ready.wait_for(|r| *r)).await,
            Ok(Ok(_))
        )
    }

    pub(super) fn listening(&self) -> bool {
        self.inner.listener.get().is_some_and(|l| *l.ready.borrow())
    }
}

/// The one LISTEN connection of a client: every notification on the
/// namespace channel wakes one local waiter of the key in its payload.
struct ListenTask {
    pg: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    channel: String,
    wakeups: Arc<LocalWakeups>,
    waiting: Arc<WaitingKeys>,
    ready: watch::Sender<bool>,
    stop: CancellationToken,
    connect_timeout: Duration,
}

impl ListenTask {
    async fn run(self) {
        let mut pause = RECONNECT_MIN;
        loop {
            let was_ready = *self.ready.borrow();
            let outcome = tokio::select! {
                _ = self.stop.cancelled() => return,
                r = self.session() => r,
            };
            if was_ready || *self.ready.borrow() {
                pause = RECONNECT_MIN; // it had been up: reconnect at once
            }
            self.ready.send_replace(false);
            if let Err(e) = outcome {
                tracing::debug!(error = %e, "postgres listener disconnected; waiters poll until it is back");
            }
            // Notifications sent while disconnected are lost: let every
            // waiter look again, now, after each failed reconnect, and once
            // more when LISTEN is back (in `session`).
            self.waiting.poke_all(&self.wakeups);
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(RECONNECT_MAX);
        }
    }

    /// One listening session; returns when the connection fails.
    async fn session(&self) -> Result<()> {
        let (client, mut connection) = tokio::time::timeout(self.connect_timeout, self.pg.connect(self.tls.clone()))
            .await
            .map_err(|_| timed_out("listener connect", self.connect_timeout))?
            .map_err(map_err)?;
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        // The channel name is ours ("holdfast_" + hex), quoted as an identifier.
        let listen = format!("LISTEN \"{}\"", self.channel);
        self.drive(&mut messages, client.batch_execute(&listen)).await?;
        self.ready.send_replace(true);
        // Releases between the last session and this LISTEN were missed.
        self.waiting.poke_all(&self.wakeups);
        let mut ping = tokio::time::interval(LISTENER_PING);
        ping.reset();
        loop {
            tokio::select! {
                m = messages.next() => self.dispatch(m)?,
                _ = ping.tick() => {
                    // A health check; its reply arrives while `messages` is polled.
                    self.drive(&mut messages, client.simple_query("")).await?;
                }
            }
        }
    }

    /// Polls the connection (dispatching notifications) until `request`
    /// completes, within the connect timeout.
    async fn drive<S, T>(
        &self,
        messages: &mut S,
        request: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<()>
    where
        S: futures::Stream<Item = std::result::Result<AsyncMessage, tokio_postgres::Error>> + Unpin,
    {
        let mut request = std::pin::pin!(request);
        let deadline = tokio::time::sleep(self.connect_timeout);
        let mut deadline = std::pin::pin!(deadline);
        loop {
            tokio::select! {
                r = &mut request => return r.map(|_| ()).map_err(map_err),
                m = messages.next() => self.dispatch(m)?,
                _ = &mut deadline => return Err(timed_out("listener request", self.connect_timeout)),
            }
        }
    }

    /// Handles one message of the listening connection.
    fn dispatch(&self, m: Option<std::result::Result<AsyncMessage, tokio_postgres::Error>>) -> Result<()> {
        match m {
            Some(Ok(AsyncMessage::Notification(n))) => {
                self.wakeups.wake_one(n.payload());
                Ok(())
            }
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(map_err(e)),
            None => Err(Error::backend(STORE, true, "listener connection closed")),
        }
    }
}
