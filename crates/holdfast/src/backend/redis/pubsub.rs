//! The one pub/sub connection of a client, shared by all its waiters.
//!
//! Non-fair waiters of a key share one subscription to the key's channel for as
//! long as any of them waits; a message wakes **one** of them
//! ([`LocalWakeups::wake_one`]). Fair waiters are woken through the client's
//! own channel, whose messages name the waiter's token; only that waiter wakes.
//!
//! Subscribe and unsubscribe commands go through one task, in order, so an
//! unsubscribe of a key whose last waiter left can never overtake the
//! subscribe of a waiter that arrived after it. A channel is unsubscribed
//! lazily, once nobody waited on it for about a second.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::{PushInfo, PushKind, Value};
use tokio::sync::{Notify, mpsc, oneshot};

use super::link::Link;
use crate::wait::{KeyWaiters, LocalWakeups};

enum Request {
    Subscribe(String, oneshot::Sender<redis::RedisResult<()>>),
    Unsubscribe(String),
}

/// Routes pub/sub messages to waiters and keeps the subscriptions.
#[derive(Debug)]
pub(super) struct Notifier {
    /// Channel name prefix of per-lock channels; the rest is the lock key.
    lock_prefix: String,
    /// This client's own channel (fair hand-offs).
    client_channel: String,
    /// Set once the client channel's subscription was confirmed; the
    /// connection manager resubscribes it after reconnects.
    client_subscribed: AtomicBool,
    wakeups: LocalWakeups,
    /// Fair waiters of this client by token (hex).
    fair: Mutex<HashMap<String, Arc<Notify>>>,
    /// Waiters per lock key (the channel is `lock_prefix` + key).
    counts: Arc<Mutex<HashMap<String, usize>>>,
    requests: mpsc::UnboundedSender<Request>,
}

impl Notifier {
    /// Creates the notifier and the push handler to give the pub/sub connection.
    pub(super) fn new(
        lock_prefix: String,
        client_channel: String,
    ) -> (Arc<Self>, impl Fn(PushInfo) -> Result<(), redis::aio::SendError> + Send + Sync + 'static, Pending) {
        let (tx, rx) = mpsc::unbounded_channel();
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let notifier = Arc::new(Notifier {
            lock_prefix: lock_prefix.clone(),
            client_channel,
            client_subscribed: AtomicBool::new(false),
            wakeups: LocalWakeups::default(),
            fair: Mutex::new(HashMap::new()),
            counts: counts.clone(),
            requests: tx,
        });
        let weak: Weak<Notifier> = Arc::downgrade(&notifier);
        let handler = move |info: PushInfo| {
            if let Some(n) = weak.upgrade() {
                n.on_push(info);
            }
            Ok(())
        };
        (notifier, handler, Pending { rx, counts, lock_prefix })
    }

    fn on_push(&self, info: PushInfo) {
        match info.kind {
            PushKind::Message => {
                let text = |v: Option<&Value>| match v {
                    Some(Value::BulkString(b)) => String::from_utf8(b.clone()).ok(),
                    Some(Value::SimpleString(s)) => Some(s.clone()),
                    _ => None,
                };
                let (Some(channel), payload) = (text(info.data.first()), text(info.data.get(1))) else {
                    return;
                };
                if channel == self.client_channel {
                    let fair = self.fair.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(n) = payload.and_then(|t| fair.get(&t).cloned()) {
                        n.notify_one();
                    }
                } else if let Some(key) = channel.strip_prefix(&self.lock_prefix) {
                    self.wakeups.wake_one(key);
                }
            }
            PushKind::Disconnection => {
                // Messages sent while disconnected are lost: every waiter tries again.
                tracing::debug!("redis pub/sub connection lost; waking all waiters");
                let keys: Vec<String> = self.counts.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
                for key in keys {
                    self.wakeups.wake_one(&key);
                }
                for n in self.fair.lock().unwrap_or_else(|p| p.into_inner()).values() {
                    n.notify_one();
                }
            }
            _ => {}
        }
    }

    /// Whether waiters of this client already wait on `key` (its channel is
    /// subscribed, or being subscribed).
    pub(super) fn has_waiters(&self, key: &str) -> bool {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).contains_key(key)
    }

    /// The channel a release of `key` publishes on.
    pub(super) fn lock_channel(&self, key: &str) -> String {
        let mut channel = String::with_capacity(self.lock_prefix.len() + key.len());
        channel.push_str(&self.lock_prefix);
        channel.push_str(key);
        channel
    }

    /// The wake-up handle of non-fair waiters of `key`.
    pub(super) fn key_wakeup(&self, key: &str) -> Arc<KeyWaiters> {
        self.wakeups.subscribe(key)
    }

    /// Makes sure this client is subscribed to the channel of `key` while the
    /// returned guard lives. Resolves once the server confirmed the
    /// subscription (or failed: then waiting falls back to polling).
    pub(super) async fn watch_key(self: &Arc<Self>, key: &str, timeout: Duration) -> KeyWatch {
        *self.counts.lock().unwrap_or_else(|p| p.into_inner()).entry(key.to_owned()).or_insert(0) += 1;
        let watch = KeyWatch { notifier: self.clone(), key: key.to_owned() };
        self.subscribe(self.lock_channel(key), timeout).await;
        watch
    }

    /// Registers a fair waiter by token; it is woken by a hand-off message
    /// naming it. Subscribes to the client's channel first if needed.
    pub(super) async fn watch_token(self: &Arc<Self>, token_hex: String, timeout: Duration) -> TokenWatch {
        let notify = Arc::new(Notify::new());
        self.fair.lock().unwrap_or_else(|p| p.into_inner()).insert(token_hex.clone(), notify.clone());
        let watch = TokenWatch { notifier: self.clone(), token_hex, notify };
        if !self.client_subscribed.load(Ordering::Acquire) && self.subscribe(self.client_channel.clone(), timeout).await
        {
            self.client_subscribed.store(true, Ordering::Release);
        }
        watch
    }

    /// Asks the subscription task to subscribe; true once confirmed.
    async fn subscribe(&self, channel: String, timeout: Duration) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.requests.send(Request::Subscribe(channel.clone(), tx)).is_err() {
            return false;
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(()))) => true,
            Ok(Ok(Err(e))) => {
                tracing::warn!(%channel, error = %e, "subscribe failed; waiting by polling");
                false
            }
            _ => {
                tracing::warn!(%channel, "subscribe timed out; waiting by polling");
                false
            }
        }
    }
}

/// A waiter's hold on a lock channel subscription.
pub(super) struct KeyWatch {
    notifier: Arc<Notifier>,
    key: String,
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        let mut counts = self.notifier.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = counts.get_mut(&self.key) {
            *c -= 1;
            if *c == 0 {
                counts.remove(&self.key);
                let _ = self.notifier.requests.send(Request::Unsubscribe(self.notifier.lock_channel(&self.key)));
            }
        }
    }
}

/// A fair waiter's registration.
pub(super) struct TokenWatch {
    notifier: Arc<Notifier>,
    token_hex: String,
    notify: Arc<Notify>,
}

impl TokenWatch {
    /// The wake-up of this waiter.
    pub(super) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for TokenWatch {
    fn drop(&mut self) {
        self.notifier.fair.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.token_hex);
    }
}

/// The subscription task's inputs, until it is started on a connection.
pub(super) struct Pending {
    rx: mpsc::UnboundedReceiver<Request>,
    counts: Arc<Mutex<HashMap<String, usize>>>,
    lock_prefix: String,
}

impl Pending {
    /// Runs the subscription task on `conn` until the notifier is dropped.
    pub(super) fn spawn(self, conn: Link, timeout: Duration) {
        tokio::spawn(run(self, conn, timeout));
    }
}

/// How long a lock channel nobody waits on stays subscribed.
const IDLE_UNSUBSCRIBE: Duration = Duration::from_secs(1);

/// After the connection moved to another master (Sentinel), subscribes
/// there again to every channel subscribed before; a channel that fails is
/// dropped from `subscribed`, and its waiters poll.
async fn follow_master(conn: &mut Link, seen: &mut u64, subscribed: &mut HashSet<String>, timeout: Duration) {
    let now = conn.generation();
    if now == *seen {
        return;
    }
    *seen = now;
    let channels: Vec<String> = subscribed.drain().collect();
    for channel in channels {
        if let Ok(Ok(())) = tokio::time::timeout(timeout, conn.subscribe(&channel)).await {
            subscribed.insert(channel);
        }
    }
}

async fn run(pending: Pending, mut conn: Link, timeout: Duration) {
    let Pending { mut rx, counts, lock_prefix } = pending;
    let mut subscribed: HashSet<String> = HashSet::new();
    let mut generation = conn.generation();
    let mut idle: HashMap<String, tokio::time::Instant> = HashMap::new();
    // While anything is subscribed, a PING a second keeps the connection
    // checked: the manager reconnects (and resubscribes) on a failure even if
    // the server stayed away longer than its reconnect attempts.
    let mut health = tokio::time::interval(Duration::from_secs(1));
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let req = tokio::select! {
            req = rx.recv() => match req {
                Some(req) => req,
                None => return,
            },
            _ = health.tick() => {
                let now = tokio::time::Instant::now();
                let due: Vec<String> =
                    idle.iter().filter(|(_, since)| now - **since >= IDLE_UNSUBSCRIBE).map(|(c, _)| c.clone()).collect();
                for channel in due {
                    idle.remove(&channel);
                    let key = channel.strip_prefix(&lock_prefix).unwrap_or_default();
                    let waiting = counts.lock().unwrap_or_else(|p| p.into_inner()).contains_key(key);
                    if waiting || !subscribed.remove(&channel) {
                        continue;
                    }
                    match tokio::time::timeout(timeout, conn.unsubscribe(&channel)).await {
                        Ok(Ok(())) => {}
                        _ => tracing::debug!(%channel, "unsubscribe failed; a stray message only costs a retry"),
                    }
                }
                follow_master(&mut conn, &mut generation, &mut subscribed, timeout).await;
                if !subscribed.is_empty() {
                    let cmd = redis::cmd("PING");
                    let ping = cmd.query_async::<Value>(&mut conn);
                    if !matches!(tokio::time::timeout(timeout, ping).await, Ok(Ok(_))) {
                        tracing::debug!("redis pub/sub connection check failed; it reconnects");
                    }
                }
                continue;
            }
        };
        match req {
            Request::Subscribe(channel, reply) => {
                follow_master(&mut conn, &mut generation, &mut subscribed, timeout).await;
                idle.remove(&channel);
                if subscribed.contains(&channel) {
                    let _ = reply.send(Ok(()));
                    continue;
                }
                let outcome = match tokio::time::timeout(timeout, conn.subscribe(&channel)).await {
                    Ok(r) => r,
                    Err(_) => Err(redis::RedisError::from((redis::ErrorKind::Io, "subscribe timed out"))),
                };
                if outcome.is_ok() {
                    subscribed.insert(channel);
                }
                let _ = reply.send(outcome);
            }
            Request::Unsubscribe(channel) => {
                // Lazily: a lock that is busy again within a second keeps its
                // subscription, so bursts of contention do not churn commands.
                idle.entry(channel).or_insert_with(tokio::time::Instant::now);
            }
        }
    }
}
