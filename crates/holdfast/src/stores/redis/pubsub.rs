//! The one pub/sub connection of a client, shared by all its waiters.
//!
//! Non-fair waiters of a key share one subscription to the key's channel for as
//! long as any of them waits; a message wakes **one** of them
//! ([`LocalWakeups::wake_one`]). Fair waiters are woken through the client's
//! own channel, whose messages name the waiter's token; only that waiter wakes.
//!
//! In a Redis Cluster every channel carries its lock's hash tag, so that it
//! is subscribed on the master of the lock's slot, where the lock's scripts
//! publish ([`Naming`]); fair waiters then subscribe to a channel of their
//! client per lock.
//!
//! Subscribe and unsubscribe commands go through one task, in order, so an
//! unsubscribe of a key whose last waiter left can never overtake the
//! subscribe of a waiter that arrived after it. A channel is unsubscribed
//! lazily, once nobody waited on it for about a second.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::{PushInfo, PushKind, Value};
use tokio::sync::{Notify, mpsc, oneshot};

use super::link::Link;
use crate::backend::wait::{KeyWaiters, LocalWakeups};

enum Request {
    Subscribe(String, oneshot::Sender<redis::RedisResult<()>>),
    Unsubscribe(String),
}

/// How the channels of a store are named.
///
/// On one server: `prefix:w:K` for lock `K`, and `prefix:c:ID` for the
/// client `ID` (fair hand-offs of every lock). In a cluster, `PUBLISH` on
/// one node reaches subscribers of other nodes over the cluster bus, which
/// held back a message sent soon after another by ~40 ms (measured on Redis
/// 7.0: the second of two publishes 5 ms apart arrived 41 ms late on
/// another node, and on the same node within a few ms). So there each
/// channel carries the lock's hash tag, `prefix:w:{prefix:K}` and
/// `prefix:c:{prefix:K}:ID`: the cluster connection subscribes it on the
/// master of the lock's slot, the node whose scripts publish on it.
#[derive(Debug, Clone)]
pub(super) struct Naming {
    prefix: String,
    client_id: String,
    cluster: bool,
}

impl Naming {
    /// The naming of a store with key prefix `prefix`, for client `client_id`.
    pub(super) fn new(prefix: &str, client_id: &str, cluster: bool) -> Self {
        Naming { prefix: prefix.to_owned(), client_id: client_id.to_owned(), cluster }
    }

    /// The channel a release of `key` publishes on for non-fair waiters.
    pub(super) fn lock_channel(&self, key: &str) -> String {
        self.lock_channel_parts(key).concat()
    }

    /// [`lock_channel`](Self::lock_channel) in parts, to write into a
    /// command without building a string (every release sends it).
    pub(super) fn lock_channel_parts<'a>(&'a self, key: &'a str) -> [&'a str; 6] {
        let p = self.prefix.as_str();
        if self.cluster { [p, ":w:{", p, ":", key, "}"] } else { [p, ":w:", key, "", "", ""] }
    }

    /// The lock key of a lock channel.
    fn key_of<'a>(&self, channel: &'a str) -> Option<&'a str> {
        let rest = channel.strip_prefix(&self.prefix)?.strip_prefix(":w:")?;
        if !self.cluster {
            return Some(rest);
        }
        rest.strip_prefix('{')?.strip_prefix(&self.prefix)?.strip_prefix(':')?.strip_suffix('}')
    }

    /// What the release script puts before a queued waiter's client id to
    /// name its client's channel, for lock `key`.
    pub(super) fn client_prefix(&self, key: &str) -> String {
        self.client_prefix_parts(key).concat()
    }

    /// [`client_prefix`](Self::client_prefix) in parts, like
    /// [`lock_channel_parts`](Self::lock_channel_parts).
    pub(super) fn client_prefix_parts<'a>(&'a self, key: &'a str) -> [&'a str; 6] {
        let p = self.prefix.as_str();
        if self.cluster { [p, ":c:{", p, ":", key, "}:"] } else { [p, ":c:", "", "", "", ""] }
    }

    /// This client's channel for fair hand-offs of `key`.
    fn client_channel(&self, key: &str) -> String {
        format!("{}{}", self.client_prefix(key), self.client_id)
    }

    /// Whether `channel` is one of this client's hand-off channels.
    fn is_client_channel(&self, channel: &str) -> bool {
        if !self.cluster {
            return channel == self.client_channel("");
        }
        channel.strip_prefix(&self.prefix).is_some_and(|rest| rest.starts_with(":c:"))
            && channel.strip_suffix(&self.client_id).is_some_and(|rest| rest.ends_with(':'))
    }
}

/// Routes pub/sub messages to waiters and keeps the subscriptions.
#[derive(Debug)]
pub(super) struct Notifier {
    /// How channels are named.
    naming: Naming,
    /// Set once the client channel's subscription was confirmed; the
    /// connection manager resubscribes it after reconnects.
    client_subscribed: AtomicBool,
    wakeups: LocalWakeups,
    /// Fair waiters of this client by token (hex).
    fair: Mutex<HashMap<String, Arc<HandOff>>>,
    /// Waiters per lock channel.
    counts: Arc<Mutex<HashMap<String, usize>>>,
    requests: mpsc::UnboundedSender<Request>,
}

impl Notifier {
    /// Creates the notifier and the push handler to give the pub/sub connection.
    pub(super) fn new(
        naming: Naming,
    ) -> (Arc<Self>, impl Fn(PushInfo) -> Result<(), redis::aio::SendError> + Send + Sync + 'static, Pending) {
        let (tx, rx) = mpsc::unbounded_channel();
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let notifier = Arc::new(Notifier {
            naming,
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
        (notifier, handler, Pending { rx, counts })
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
                if self.naming.is_client_channel(&channel) {
                    // "TOKEN FENCE" from a hand-off to this client (its id
                    // ends in ".f"), "TOKEN" from an older holdfast's or
                    // when the lock is free: wake the waiter to claim.
                    let Some(payload) = payload else { return };
                    let (token, fence) = match payload.split_once(' ') {
                        Some((token, fence)) => (token, fence.parse::<u64>().ok()),
                        None => (payload.as_str(), None),
                    };
                    let fair = self.fair.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(w) = fair.get(token) {
                        w.handed(fence);
                    }
                } else if let Some(key) = self.naming.key_of(&channel) {
                    self.wakeups.wake_one(key);
                }
            }
            PushKind::Disconnection => {
                // Messages sent while disconnected are lost: every waiter tries again.
                tracing::debug!("redis pub/sub connection lost; waking all waiters");
                let keys: Vec<String> = {
                    let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
                    counts.keys().filter_map(|c| self.naming.key_of(c).map(str::to_owned)).collect()
                };
                for key in keys {
                    self.wakeups.wake_one(&key);
                }
                for w in self.fair.lock().unwrap_or_else(|p| p.into_inner()).values() {
                    w.handed(None);
                }
            }
            _ => {}
        }
    }

    /// How this client's channels are named.
    pub(super) fn naming(&self) -> &Naming {
        &self.naming
    }

    /// Whether waiters of this client already wait on `key` (its channel is
    /// subscribed, or being subscribed).
    pub(super) fn has_waiters(&self, key: &str) -> bool {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        // Called on every non-fair acquire: with nobody waiting (the
        // uncontended path) no channel name is built.
        !counts.is_empty() && counts.contains_key(&self.naming.lock_channel(key))
    }

    /// The wake-up handle of non-fair waiters of `key`.
    pub(super) fn key_wakeup(&self, key: &str) -> Arc<KeyWaiters> {
        self.wakeups.subscribe(key)
    }

    /// Makes sure this client is subscribed to the channel of `key` while the
    /// returned guard lives. Resolves once the server confirmed the
    /// subscription (or failed: then waiting falls back to polling).
    ///
    /// # Cancel safety
    ///
    /// As [`watch_channel`](Self::watch_channel).
    pub(super) async fn watch_key(self: &Arc<Self>, key: &str, timeout: Duration) -> KeyWatch {
        self.watch_channel(self.naming.lock_channel(key), timeout).await
    }

    /// Holds a subscription to `channel` (counted) while the guard lives.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the count is taken before the first await and given
    /// back by the guard's drop, so a dropped call leaves at most a
    /// subscription that the task lets go a second later.
    async fn watch_channel(self: &Arc<Self>, channel: String, timeout: Duration) -> KeyWatch {
        *self.counts.lock().unwrap_or_else(|p| p.into_inner()).entry(channel.clone()).or_insert(0) += 1;
        let watch = KeyWatch { notifier: self.clone(), channel: channel.clone() };
        self.subscribe(channel, timeout).await;
        watch
    }

    /// Registers a fair waiter of `key` by token; it is woken by a hand-off
    /// message naming it. Subscribes to the client's channel first if
    /// needed (in a cluster: the client's channel for `key`).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped call leaves no registration (the guard is
    /// dropped with it), at most a subscription.
    pub(super) async fn watch_token(self: &Arc<Self>, key: &str, token_hex: String, timeout: Duration) -> TokenWatch {
        let hand_off = Arc::new(HandOff::default());
        self.fair.lock().unwrap_or_else(|p| p.into_inner()).insert(token_hex.clone(), hand_off.clone());
        let mut watch = TokenWatch { notifier: self.clone(), token_hex, hand_off, _channel: None };
        if self.naming.cluster {
            watch._channel = Some(self.watch_channel(self.naming.client_channel(key), timeout).await);
        } else if !self.client_subscribed.load(Ordering::Acquire)
            && self.subscribe(self.naming.client_channel(key), timeout).await
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
    channel: String,
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        let mut counts = self.notifier.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = counts.get_mut(&self.channel) {
            *c -= 1;
            if *c == 0 {
                counts.remove(&self.channel);
                let _ = self.notifier.requests.send(Request::Unsubscribe(std::mem::take(&mut self.channel)));
            }
        }
    }
}

/// What the pub/sub connection tells one fair waiter: a wake-up, and the
/// fence of a hand-off message that named it with one.
#[derive(Debug, Default)]
pub(super) struct HandOff {
    notify: Notify,
    /// The highest fence of the hand-off messages since it was last taken
    /// (0: none; fences are never 0). The highest, so that a slow message
    /// of an earlier hand-off arriving after the latest one does not hide it.
    fence: AtomicU64,
}

impl HandOff {
    fn handed(&self, fence: Option<u64>) {
        if let Some(f) = fence.filter(|&f| f > 0) {
            self.fence.fetch_max(f, Ordering::AcqRel);
        }
        self.notify.notify_one();
    }
}

/// A fair waiter's registration.
pub(super) struct TokenWatch {
    notifier: Arc<Notifier>,
    token_hex: String,
    hand_off: Arc<HandOff>,
    /// In a cluster, the hold on the client's channel of the lock (kept
    /// for its drop, which lets the channel go).
    _channel: Option<KeyWatch>,
}

impl TokenWatch {
    /// The wake-up of this waiter.
    pub(super) fn notify(&self) -> &Notify {
        &self.hand_off.notify
    }

    /// The fence of a hand-off message received since the last call, if
    /// one named this waiter with its fence.
    pub(super) fn take_handed_fence(&self) -> Option<u64> {
        Some(self.hand_off.fence.swap(0, Ordering::AcqRel)).filter(|&f| f > 0)
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
    let Pending { mut rx, counts } = pending;
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
                    let waiting = counts.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&channel);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_round_trip_and_share_the_lock_slot_in_a_cluster() {
        use redis::cluster_routing::Slot;
        for cluster in [false, true] {
            let n = Naming::new("app", "00ff", cluster);
            for key in ["orders/42", "a}b", "x:c:y", ""] {
                assert_eq!(n.key_of(&n.lock_channel(key)), Some(key), "{key}");
                assert!(n.is_client_channel(&n.client_channel(key)), "{key}");
                assert!(!n.is_client_channel(&n.lock_channel(key)), "{key}");
                assert_eq!(n.key_of(&n.client_channel(key)), None, "{key}");
                if cluster {
                    let lock = format!("{{app:{key}}}");
                    assert_eq!(Slot::for_key(n.lock_channel(key)), Slot::for_key(&lock), "{key}");
                    assert_eq!(Slot::for_key(n.client_channel(key)), Slot::for_key(&lock), "{key}");
                }
            }
            assert!(!n.is_client_channel("app:c:{app:k}:11ff") || !cluster);
        }
        let plain = Naming::new("app", "00ff", false);
        assert_eq!(plain.lock_channel("k"), "app:w:k");
        assert_eq!(plain.client_prefix("k"), "app:c:");
        let cluster = Naming::new("app", "00ff", true);
        assert_eq!(cluster.lock_channel("k"), "app:w:{app:k}");
        assert_eq!(cluster.client_prefix("k"), "app:c:{app:k}:");
    }
}
