//! Waiting for a key: per-key wake-ups inside the process and a jittered
//! fallback poll, shared by the stores that do not queue waiters.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rand::Rng;
use tokio::sync::Notify;

use crate::backend::Grant;
use crate::error::Result;

/// The outcome of one acquire attempt made by a waiting loop.
#[derive(Debug)]
pub enum Attempt {
    /// The key was granted.
    Granted(Grant),
    /// The key is busy; `expires_in` is the holder's remaining lease if the
    /// store reported it, so that the next attempt need not come later.
    Busy {
        /// Time left on the holder's lease.
        expires_in: Option<Duration>,
    },
}

/// Bounds of the fallback poll that backs up store notifications.
///
/// A waiter retries after a random delay in `[min, max]`, or when the
/// holder's lease runs out if that comes first, so a missed notification costs
/// at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollBounds {
    /// Shortest delay between attempts.
    pub min: Duration,
    /// Longest delay between attempts.
    pub max: Duration,
}

impl PollBounds {
    /// The delay before the next attempt.
    pub fn next_delay(&self, expires_in: Option<Duration>) -> Duration {
        let jittered = if self.max > self.min { rand::rng().random_range(self.min..=self.max) } else { self.min };
        match expires_in {
            Some(left) => jittered.min(left + Duration::from_millis(1)),
            None => jittered,
        }
    }
}

/// Per-key wake-ups for waiters inside this process.
///
/// A release calls [`wake_one`](Self::wake_one): one waiter of that key is
/// woken, not all of them. A notification sent while no waiter is parked is
/// kept for the next one, and one sent to a waiter whose future is dropped is
/// passed on to another waiter (tokio's `Notify` semantics), so none is lost.
#[derive(Debug, Default)]
pub struct LocalWakeups {
    keys: Mutex<HashMap<String, Weak<Notify>>>,
}

impl LocalWakeups {
    /// The wake-up handle of `key`; keep it while waiting.
    pub fn subscribe(&self, key: &str) -> Arc<Notify> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = keys.get(key).and_then(Weak::upgrade) {
            return n;
        }
        // Prune entries of keys nobody waits on any more, amortised.
        if keys.len() >= 64 && keys.len().is_power_of_two() {
            keys.retain(|_, w| w.strong_count() > 0);
        }
        let n = Arc::new(Notify::new());
        keys.insert(key.to_owned(), Arc::downgrade(&n));
        n
    }

    /// Wakes one waiter of `key`, if any waits in this process.
    pub fn wake_one(&self, key: &str) {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = keys.get(key).and_then(Weak::upgrade) {
            n.notify_one();
        }
    }
}

/// Attempts until granted: after each busy attempt, waits for a wake-up on
/// `wakeup` or the fallback poll delay, whichever comes first.
///
/// The wake-up is armed **before** each attempt, so a release between a busy
/// attempt and the wait is never missed. Cancel-safe: dropping the future
/// between attempts leaves nothing behind; dropping it during an attempt is
/// the caller's to clean up (the client releases by token).
pub async fn until_granted<F, Fut>(wakeup: &Notify, poll: PollBounds, mut attempt: F) -> Result<Grant>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Attempt>>,
{
    loop {
        let notified = wakeup.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match attempt().await? {
            Attempt::Granted(grant) => return Ok(grant),
            Attempt::Busy { expires_in } => {
                let delay = poll.next_delay(expires_in);
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}
