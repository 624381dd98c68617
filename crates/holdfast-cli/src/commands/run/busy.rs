//! Who holds a busy lock: the one-line busy message names the holder (label,
//! fence, TTL left), and on a terminal a waiting line says who is ahead.
//!
//! Both read the key's status from the store, which is an extra call made
//! only when the lock was busy; a status that cannot be read within
//! [`STATUS_TIMEOUT`] is left out rather than delaying the exit.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use holdfast::{Client, LockStatus};

use crate::duration;
use crate::exit::Failure;

/// The longest wait for a busy key's status before reporting without it.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a wait goes on before the waiting line appears (a short wait shows nothing).
const FIRST_LOOK: Duration = Duration::from_millis(500);
/// How often the waiting line is refreshed.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// `held by deploy@alice (fence 42, 27.3s left)`, or for shared leases
/// `held by 2 shared holders: a (fence 4), b (fence 5)`; `None` when the
/// status shows nobody (the holder just let go) or could not be read.
pub(crate) fn holder_of(st: &LockStatus) -> Option<String> {
    let one = |h: &holdfast::backend::HolderInfo| match h.ttl_left {
        Some(left) => format!("{} (fence {}, {} left)", h.label, h.fence, duration::show(left)),
        None => format!("{} (fence {})", h.label, h.fence),
    };
    let mut text = if let Some(h) = &st.holder {
        format!("held by {}", one(h))
    } else if !st.shared.is_empty() {
        let all: Vec<String> = st.shared.iter().map(one).collect();
        format!("held by {} shared holder(s): {}", all.len(), all.join(", "))
    } else {
        return None;
    };
    if let Some(n) = st.waiters.filter(|n| *n > 0) {
        text.push_str(&format!("; {n} waiting"));
    }
    Some(text)
}

/// The key's holder as [`holder_of`] words it, read from the store.
async fn look(client: &Client, key: &str) -> Option<String> {
    match tokio::time::timeout(STATUS_TIMEOUT, client.status(key)).await {
        Ok(Ok(st)) => holder_of(&st),
        _ => None,
    }
}

/// The busy failure: `lock "x" is busy: held by ... (waited 1.0s)`, with
/// `code` (75, or `--busy-exit`); `quiet` leaves the message empty.
pub(crate) async fn failure(client: &Client, key: &str, waited: Option<Duration>, code: u8, quiet: bool) -> Failure {
    if quiet {
        return Failure::new(code, String::new());
    }
    let mut msg = format!("lock {key:?} is busy");
    if let Some(holder) = look(client, key).await {
        msg.push_str(": ");
        msg.push_str(&holder);
    }
    if let Some(w) = waited {
        msg.push_str(&format!(" (waited {})", duration::show(w)));
    }
    Failure::new(code, msg)
}

/// While awaited, shows on a terminal (stderr) one line saying who holds
/// `key`, rewritten in place when that changes; never resolves. Off the
/// terminal (cron, a pipe) it shows nothing. [`Waiting::clear`] wipes the line.
pub(crate) struct Waiting {
    shown: bool,
    on_terminal: bool,
}

impl Waiting {
    /// Shows the line only when stderr is a terminal and `quiet` is off.
    pub(crate) fn new(quiet: bool) -> Self {
        Waiting { shown: false, on_terminal: !quiet && std::io::stderr().is_terminal() }
    }

    /// Keeps the line up to date until dropped (cancel-safe: it only reads
    /// the store and writes to stderr).
    pub(crate) async fn show(&mut self, client: &Client, key: &str) {
        if !self.on_terminal {
            return std::future::pending().await;
        }
        tokio::time::sleep(FIRST_LOOK).await;
        let mut last = None;
        loop {
            let now = look(client, key).await;
            if now != last {
                let text = now.as_deref().unwrap_or("the holder is letting go");
                // \r and "erase to end of line": one line, rewritten in place.
                let _ = write!(std::io::stderr(), "\r\x1b[Kholdfast: waiting for lock {key:?}: {text}");
                self.shown = true;
                last = now;
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// Wipes the waiting line, if one was shown, so what follows starts on a clean line.
    pub(crate) fn clear(&mut self) {
        if self.shown {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
            self.shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast::backend::HolderInfo;

    fn holder(label: &str, fence: u64, left_ms: Option<u64>) -> HolderInfo {
        HolderInfo { label: label.into(), fence, ttl_left: left_ms.map(Duration::from_millis), weight: 1 }
    }

    #[test]
    fn names_the_holder_its_fence_and_ttl_left() {
        let key = holdfast::LockKey::new("x").unwrap();
        let mut st = LockStatus::free(&key);
        assert_eq!(holder_of(&st), None);
        st.holder = Some(holder("deploy@alice", 42, Some(27_300)));
        st.waiters = Some(2);
        assert_eq!(holder_of(&st).unwrap(), "held by deploy@alice (fence 42, 27.3s left); 2 waiting");
        st.holder = None;
        st.waiters = None;
        st.shared = vec![holder("a", 4, None), holder("b", 5, Some(900))];
        assert_eq!(holder_of(&st).unwrap(), "held by 2 shared holder(s): a (fence 4), b (fence 5, 900ms left)");
    }
}
