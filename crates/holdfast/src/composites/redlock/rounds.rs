//! Which member tokens each acquisition used.
//!
//! Every round of a RedLock acquisition asks the members with a token of its
//! own. A round that fails releases its grants, and that release may be
//! delayed on the network; were the next round to reuse the token, a late
//! release could delete the next round's grant on that member while the
//! client counted it in its majority. So rounds never share a token, and this
//! table remembers, per client token, every round token sent (released
//! together at the end) and the one that holds (renewed). With each round
//! token it keeps how many members (a prefix, in the members' order) may
//! have been asked with it, widened before each call is sent, so that the
//! release goes to those members only: a waiting round that got its
//! majority from the first members never asked the others.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::vocabulary::key::{LockKey, OwnerToken};

#[derive(Debug, Default)]
struct Entry {
    /// Every round token sent for this acquisition, in order, with the
    /// number of members (from the first) that may have been asked with it.
    sent: Vec<(OwnerToken, usize)>,
    /// The round token of the grant the client was given.
    holding: Option<OwnerToken>,
    /// The lease TTL asked for (a round's leases last at most this long
    /// after its last request).
    ttl: Duration,
}

/// The round tokens of every acquisition in flight or held, by key and
/// client token.
#[derive(Debug, Default)]
pub(super) struct Rounds {
    entries: Mutex<HashMap<(LockKey, OwnerToken), Entry>>,
}

impl Rounds {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<(LockKey, OwnerToken), Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The token of the next round: the holding one if the client retries an
    /// acquisition it was granted (its reply was lost), so the members extend
    /// that grant; a fresh one otherwise, recorded before it is sent.
    pub(super) fn next(&self, key: &LockKey, client: OwnerToken, ttl: Duration) -> OwnerToken {
        let mut entries = self.entries();
        let entry = entries.entry((key.clone(), client)).or_default();
        entry.ttl = entry.ttl.max(ttl);
        if let Some(holding) = entry.holding {
            return holding;
        }
        let round = OwnerToken::random();
        entry.sent.push((round, 0));
        round
    }

    /// The first `members` members are about to be asked with `round` (or
    /// were): its release must reach them. Only ever widens; called before
    /// the calls are sent, so a round dropped midway is released on every
    /// member it may have reached.
    pub(super) fn reach(&self, key: &LockKey, client: OwnerToken, round: OwnerToken, members: usize) {
        if let Some(entry) = self.entries().get_mut(&(key.clone(), client)) {
            if let Some(sent) = entry.sent.iter_mut().find(|(t, _)| *t == round) {
                sent.1 = sent.1.max(members);
            }
        }
    }

    /// Every member answered `round` "busy": it left nothing on any member
    /// (a refused try leaves nothing behind), so no release need name it.
    /// (A contended acquire's first round then costs no release round trip.)
    pub(super) fn left_nothing(&self, key: &LockKey, client: OwnerToken, round: OwnerToken) {
        if let Some(entry) = self.entries().get_mut(&(key.clone(), client)) {
            if entry.holding != Some(round) {
                entry.sent.retain(|(t, _)| *t != round);
            }
        }
    }

    /// `round` won: renewals go to it.
    pub(super) fn granted(&self, key: &LockKey, client: OwnerToken, round: OwnerToken) {
        if let Some(entry) = self.entries().get_mut(&(key.clone(), client)) {
            entry.holding = Some(round);
        }
    }

    /// The round token that holds for `client`, if it was granted.
    pub(super) fn holding(&self, key: &LockKey, client: OwnerToken) -> Option<OwnerToken> {
        self.entries().get(&(key.clone(), client)).and_then(|e| e.holding)
    }

    /// Forgets `client`'s acquisition and returns it: every round token it
    /// sent, the holding one, and the TTL.
    pub(super) fn take(&self, key: &LockKey, client: OwnerToken) -> Taken {
        let entry = self.entries().remove(&(key.clone(), client)).unwrap_or_default();
        Taken { sent: entry.sent, holding: entry.holding, ttl: entry.ttl }
    }

    /// Puts back what [`take`](Self::take) returned, for a release that
    /// must be retried.
    pub(super) fn restore(&self, key: &LockKey, client: OwnerToken, taken: Taken) {
        let mut entries = self.entries();
        let entry = entries.entry((key.clone(), client)).or_default();
        for (t, asked) in taken.sent {
            match entry.sent.iter_mut().find(|(s, _)| *s == t) {
                Some(sent) => sent.1 = sent.1.max(asked),
                None => entry.sent.push((t, asked)),
            }
        }
        entry.holding = entry.holding.or(taken.holding);
        entry.ttl = entry.ttl.max(taken.ttl);
    }
}

/// An acquisition taken out of the table, to release.
#[derive(Debug)]
pub(super) struct Taken {
    pub(super) sent: Vec<(OwnerToken, usize)>,
    pub(super) holding: Option<OwnerToken>,
    pub(super) ttl: Duration,
}

/// How many acquires of this lock wait for each key on the members in
/// order (see `acquire`: a new acquire queues behind them).
#[derive(Debug, Default)]
pub(super) struct Waiting {
    keys: Mutex<HashMap<LockKey, usize>>,
}

impl Waiting {
    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<LockKey, usize>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an acquire waits for `key`.
    pub(super) fn any(&self, key: &LockKey) -> bool {
        self.keys().contains_key(key)
    }

    /// Counts an acquire waiting for `key` until the guard is dropped
    /// (returned, or the acquire's future dropped).
    pub(super) fn enter<'a>(&'a self, key: &LockKey) -> Entered<'a> {
        *self.keys().entry(key.clone()).or_default() += 1;
        Entered { waiting: self, key: key.clone() }
    }
}

/// One waiting acquire, counted in [`Waiting`] while it lives.
pub(super) struct Entered<'a> {
    waiting: &'a Waiting,
    key: LockKey,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut keys = self.waiting.keys();
        if let Some(n) = keys.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                keys.remove(&self.key);
            }
        }
    }
}
