//! Which store tokens each acquisition through the chain used.
//!
//! An acquisition asks the active store under a token of its own for that
//! store. When the chain switches while it waits, the attempt on the old
//! store is released and the new store is asked under a fresh token: were
//! the chain to come back to the old store later with the same token, a
//! release of the old attempt delayed on the network could delete the new
//! grant. A retry on the same store (after an error, when the attempt may
//! have been applied) reuses that store's token, as on a single store, so
//! the store extends the grant it may already have made.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::vocabulary::key::{LockKey, OwnerToken};

/// One store attempt: the store's index in the chain and the token it was asked under.
pub(super) type Attempt = (usize, OwnerToken);

#[derive(Debug, Default)]
struct Entry {
    /// Every attempt sent for this acquisition, in order.
    sent: Vec<Attempt>,
    /// The attempt the client was granted.
    holding: Option<Attempt>,
    /// The longest TTL asked for: a store keeps an attempt's grant at most
    /// this long after its last request.
    ttl: Duration,
}

/// The store attempts of every acquisition in flight or held, by key and
/// client token.
#[derive(Debug, Default)]
pub(super) struct Holdings {
    entries: Mutex<HashMap<(LockKey, OwnerToken), Entry>>,
}

impl Holdings {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<(LockKey, OwnerToken), Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The token to ask store `store` under, recorded before it is sent, and
    /// whether it was sent before (so the store may hold a grant for it).
    pub(super) fn next(&self, key: &LockKey, client: OwnerToken, store: usize, ttl: Duration) -> (OwnerToken, bool) {
        let mut entries = self.entries();
        let entry = entries.entry((key.clone(), client)).or_default();
        entry.ttl = entry.ttl.max(ttl);
        match entry.sent.last() {
            Some(&(s, token)) if s == store => (token, true),
            _ => {
                let token = OwnerToken::random();
                entry.sent.push((store, token));
                (token, false)
            }
        }
    }

    /// The attempt `attempt` was granted to the client.
    pub(super) fn granted(&self, key: &LockKey, client: OwnerToken, attempt: Attempt) {
        if let Some(entry) = self.entries().get_mut(&(key.clone(), client)) {
            entry.holding = Some(attempt);
        }
    }

    /// The attempt that holds for the client, if granted.
    pub(super) fn holding(&self, key: &LockKey, client: OwnerToken) -> Option<Attempt> {
        self.entries().get(&(key.clone(), client)).and_then(|e| e.holding)
    }

    /// Forgets the acquisition, returning every attempt it sent and the
    /// longest TTL it asked for.
    pub(super) fn take(&self, key: &LockKey, client: OwnerToken) -> (Vec<Attempt>, Duration) {
        self.entries().remove(&(key.clone(), client)).map(|e| (e.sent, e.ttl)).unwrap_or_default()
    }
}
