//! The local hand-over (issue 33, item 2): a release of a key that another
//! task of this client waits for passes the lock straight to that task, in
//! one store call (`hand_over.lua`), instead of a release, a notification
//! and the waiter's own acquire. The design, its bound and its failure
//! paths were model-checked first (holdfast-models' `handover`).
//!
//! - A task that waits for a key (non-fair, exclusive: a mutex's
//!   `acquire`; or a share: a permit, a read lease) leaves an **offer**
//!   here: its own token, TTL, label and mode, and the sending half of a
//!   oneshot. Fair waiters are served by the fair queue's own hand-off,
//!   writers by their reservations: they leave no offer.
//! - A share is handed by `share_hand_over.lua` (model `share_handover`):
//!   if the releasing token holds a live share, the store releases it and
//!   admits the waiter by the rule of every shared acquire, in the same
//!   call. It grants only what the waiter's own attempt would be granted
//!   then, so another client's reservation is never passed over and no
//!   bound is needed; not admitted, the call is the share's release (the
//!   lock's channel told) and the waiter waits on. The failure paths below
//!   are the mutex's.
//! - [`Backend::release`](crate::backend::Backend::release) of that key
//!   takes the oldest offer and runs the hand-over: if the releasing token
//!   holds an unexpired lease, no fair waiter is queued and fewer than
//!   [`HAND_OVER_BOUND`] hand-overs in a row led to it, the store makes the
//!   waiter's own token the holder with the next fence and the waiter's TTL
//!   (server clock), and the grant goes to the waiter through the oneshot,
//!   counted from before the call was sent. After the bound the script
//!   releases as a plain release does and wakes the lock's channel, so a
//!   waiter of another client can be granted: one client never keeps a key
//!   from other clients for more than the bound's hand-overs in a row.
//! - While a releaser holds its offer, the waiter does not return a grant
//!   of its own attempts before the hand-over's outcome is known (the same
//!   token either way; a releaser told "gone" releases that token). That
//!   holds for every attempt, also one made after a taken offer came back
//!   and was queued again (`OfferGuard::own_grant`).
//! - A share's waiter whose offer is taken gives up its turn to ask (the
//!   one local waiter of a key that asks the store, [`wait::until_granted`]):
//!   its own attempt could only find the handed grant, and the next local
//!   waiter asks meanwhile, so free permits are taken side by side; only
//!   while the last hand-over of the key found room for one more request
//!   (its reply's `spare`), else that attempt would be refused. When the
//!   offer comes back (not handed), the waiter asks at once and queues for
//!   the turn again. In the model (`share_handover`) a waiting task may
//!   attempt at any time or not at all, so the two rules only narrow what
//!   it explores; the first is its rule for a taken offer. A mutex's waiter
//!   keeps its turn: the next one's attempt could only be refused.
//! - When the call fails without a reply, the releaser releases its own
//!   token first and only then tells the waiter ([`Handed::Unknown`]),
//!   which attempts with its own token at once: a hand-over applied meanwhile is found as a retry by the
//!   holder, and a late copy of the call, finding the released lease, hands
//!   nothing (the model's `TellBeforeRelease` and `NoLeaseCheck` show what
//!   goes wrong otherwise).
//!
//! Cancel safety: a waiter dropped at any point after its offer was taken
//! either had the grant delivered (its client's cleanup releases its token,
//! as for any acquire that raced a drop) or the releaser's send fails and
//! the releaser releases the waiter's token itself, after the hand-over
//! call's reply (so after the call was applied). A releaser dropped
//! mid-call settles on a task of its own, as a failed call does.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::keys::{H, key_parts, lock_keys};
use super::{RedisBackend, ms};
use crate::backend::wait::{self, Attempt, KeyWaiters};
use crate::backend::{AcquireRequest, Grant, LeaseMode, admission};
use crate::lease::release::Release;
use crate::lease::{Horizon, drift_margin};
use crate::vocabulary::error::Result;
use crate::vocabulary::key::{LockKey, OwnerToken};

/// Hand-overs in a row (within one client) after which a release is a
/// plain release that wakes every client's waiters. Eight keeps the cost
/// of that release (a notification and a new acquire) to about a ninth of
/// the grants under contention, and another client's waiter behind at most
/// eight grants of this one.
pub(super) const HAND_OVER_BOUND: u32 = 8;

/// A waiting task's wait for its turn and its attempts, or nothing.
type Waiting<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Grant>> + Send + 'a>>;

/// What a releaser tells a waiter whose offer it took.
pub(super) enum Handed {
    /// The store made the waiter's token the holder.
    Granted(Grant),
    /// Not handed; the lock was released as a plain release does (the lock's
    /// channel wakes the waiters of every client): the waiter waits on.
    Released,
    /// Not known whether the store handed it (the call failed without a
    /// reply; the releaser's own release is confirmed since): the waiter
    /// attempts with its own token at once.
    Unknown,
}

/// One waiting task's offer.
struct Offer {
    id: u64,
    token: OwnerToken,
    ttl: Duration,
    label: String,
    /// Exclusive (`hand_over.lua`) or shared (`share_hand_over.lua`).
    mode: LeaseMode,
    tx: oneshot::Sender<Handed>,
    /// Told when a releaser takes the offer.
    taken: Option<oneshot::Sender<()>>,
}

/// The offers of this client's waiting tasks, per key, oldest first.
#[derive(Debug, Default)]
pub(super) struct Offers {
    keys: Mutex<HashMap<String, KeyOffers>>,
    next_id: AtomicU64,
}

/// One key's offers, and what the last share's hand-over found free.
#[derive(Debug, Default)]
struct KeyOffers {
    queue: VecDeque<Offer>,
    /// The weight a new request would have found free after the last
    /// share's hand-over of the key (`share_hand_over.lua`'s `spare`; 0 until
    /// one said, or after one handed nothing).
    spare: i64,
}

impl std::fmt::Debug for Offer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offer").field("id", &self.id).finish_non_exhaustive()
    }
}

impl Offers {
    /// Leaves an offer for `req`; `first`: ahead of the others (a waiter
    /// whose taken offer came back keeps its place).
    fn offer(self: &Arc<Self>, req: &AcquireRequest, first: bool) -> OfferGuard {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let (taken_tx, taken) = oneshot::channel();
        let offer = Offer {
            id,
            token: req.token,
            ttl: req.ttl,
            label: req.label.clone(),
            mode: req.mode,
            tx,
            taken: Some(taken_tx),
        };
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let queue = &mut keys.entry(req.key.as_str().to_owned()).or_default().queue;
        if first {
            queue.push_front(offer)
        } else {
            queue.push_back(offer)
        }
        OfferGuard { offers: self.clone(), key: req.key.as_str().to_owned(), id, rx, taken }
    }

    /// Takes the oldest offer for `key`, if a task waits for it.
    fn take(&self, key: &str) -> Option<Offer> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let entry = keys.get_mut(key)?;
        let mut offer = entry.queue.pop_front();
        if entry.queue.is_empty() {
            keys.remove(key);
        }
        if let Some(taken) = offer.as_mut().and_then(|o| o.taken.take()) {
            let _ = taken.send(());
        }
        offer
    }

    /// Notes what a share's hand-over of `key` found free (`None`: it
    /// handed nothing, or said nothing).
    fn note_spare(&self, key: &str, spare: Option<i64>) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = keys.get_mut(key) {
            entry.spare = spare.unwrap_or(0);
        }
    }

    /// Whether a request of `weight` for `key` would have been granted
    /// beside the last share's hand-over.
    fn fits_beside(&self, key: &str, weight: i64) -> bool {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(key).is_some_and(|entry| entry.spare >= weight)
    }

    /// Removes offer `id` of `key`; false if a releaser took it.
    fn withdraw(&self, key: &str, id: u64) -> bool {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = keys.get_mut(key) else { return false };
        let Some(at) = entry.queue.iter().position(|o| o.id == id) else { return false };
        entry.queue.remove(at);
        if entry.queue.is_empty() {
            keys.remove(key);
        }
        true
    }
}

/// A waiter's offer: withdrawn when dropped, unless a releaser took it.
struct OfferGuard {
    offers: Arc<Offers>,
    key: String,
    id: u64,
    rx: oneshot::Receiver<Handed>,
    taken: oneshot::Receiver<()>,
}

impl OfferGuard {
    /// Withdraws the offer; false if a releaser took it (its outcome then
    /// comes on `rx`).
    fn withdraw(&self) -> bool {
        self.offers.withdraw(&self.key, self.id)
    }

    /// The outcome of this task's own attempts: returned once the offer is
    /// withdrawn, or once the releaser that took it has told its outcome
    /// (either grant is this token's; the handed one is counted from the
    /// earlier send). Returned before that, a releaser told "gone" would
    /// release the token that this task holds.
    async fn own_grant(&mut self, outcome: Result<Grant>) -> Result<Grant> {
        if self.withdraw() {
            return outcome;
        }
        match (&mut self.rx).await {
            Ok(Handed::Granted(grant)) => Ok(grant),
            _ => outcome,
        }
    }
}

impl Drop for OfferGuard {
    fn drop(&mut self) {
        self.withdraw();
    }
}

impl RedisBackend {
    /// A non-fair exclusive or a shared wait ([`wait::until_granted`]) that
    /// also takes a grant handed over by a releasing task of this client.
    ///
    /// # Cancel safety
    ///
    /// As [`Backend::acquire`](crate::backend::Backend::acquire): see the module docs for a drop after a
    /// releaser took the offer.
    pub(super) async fn wait_or_take(&self, req: &AcquireRequest, wakeup: &KeyWaiters) -> Result<Grant> {
        let mut offer = self.inner.offers.offer(req, false);
        let poll = self.inner.config.poll;
        let queue_for_turn =
            || -> Waiting<'_> { Box::pin(wait::until_granted(wakeup, req, poll, || self.attempt_waiting(req))) };
        let mut waited = queue_for_turn();
        // Whether this task holds or queues for the key's turn to ask. A
        // share's waiter whose offer a releaser took gives its turn up: the
        // hand-over decides its grant (an attempt of its own beside that
        // call would only find the same grant), and the next local waiter
        // asks, so that free permits are taken side by side rather than by
        // one chain of hand-overs after another (issue 33). Only while the
        // last hand-over left room for it: when every permit is taken (as
        // across busy processes) the next one's attempt would be refused,
        // a request for nothing. A mutex's waiter keeps it for that reason.
        let mut asking = true;
        let weight = match req.mode {
            LeaseMode::Shared { weight, .. } => Some(i64::from(weight)),
            _ => None,
        };
        // Whether the offer's "taken" is still to be heard (a oneshot is
        // polled until it completes, never after).
        let mut listening = weight.is_some();
        loop {
            tokio::select! {
                // In the order written: a handed grant first.
                biased;
                handed = &mut offer.rx => {
                    let unknown = match handed {
                        Ok(Handed::Granted(grant)) => return Ok(grant),
                        Ok(Handed::Released) => false,
                        // A releaser dropped mid-call, or whose own release
                        // failed, tells nothing.
                        Ok(Handed::Unknown) | Err(_) => true,
                    };
                    // Keeps its place among this client's offers.
                    offer = self.inner.offers.offer(req, true);
                    // A hand-over applied meanwhile is this token's: an
                    // attempt finds it (as a retry by the holder). After a
                    // plain release the lock's channel wakes the waiters that
                    // asked (so marked the lock); one that gave its turn up
                    // asks now, then queues for the turn again.
                    listening = weight.is_some();
                    let gave_up = !std::mem::replace(&mut asking, true);
                    if gave_up {
                        waited = queue_for_turn();
                    }
                    if unknown || gave_up {
                        if let Attempt::Granted(grant) = self.attempt_waiting(req).await? {
                            return offer.own_grant(Ok(grant)).await;
                        }
                    }
                }
                taken = &mut offer.taken, if listening => {
                    listening = false;
                    if taken.is_ok() && weight.is_some_and(|w| self.inner.offers.fits_beside(req.key.as_str(), w)) {
                        waited = Box::pin(std::future::pending());
                        asking = false;
                    }
                }
                outcome = &mut waited => return offer.own_grant(outcome).await,
            }
        }
    }

    /// One attempt of a waiting acquire, exclusive or shared.
    async fn attempt_waiting(&self, req: &AcquireRequest) -> Result<Attempt> {
        if req.mode == LeaseMode::Exclusive {
            self.attempt(req, true).await
        } else {
            self.attempt_shared(req, true).await
        }
    }

    /// [`Backend::release`]: a hand-over when a task of this client waits
    /// for the key, else the plain release.
    pub(super) async fn release_or_hand_over(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        let Some(offer) = self.inner.offers.take(key.as_str()) else {
            return self.release_plain(key, token).await;
        };
        let mut taken = TakenOffer { backend: self.clone(), key: key.clone(), from: token, offer: Some(offer) };
        taken.run().await
    }

    /// One hand-over call: `(1, fence)` handed, `(0, 1)` released (the
    /// bound, or a share not admitted), `(0, 0)` nothing changed; and a
    /// share's hand-over notes what it found free.
    async fn hand_over_call(&self, key: &LockKey, from: OwnerToken, offer: &Offer) -> Result<(i64, i64)> {
        let config = &self.inner.config;
        let mut inv = if offer.mode == LeaseMode::Exclusive {
            let mut inv = self.inner.scripts.hand_over.call(1);
            inv.key_parts(&key_parts(&config.prefix, key, H));
            inv.arg(&from.hex_digits()[..]).arg(&offer.token.hex_digits()[..]).arg(ms(offer.ttl)).arg(&offer.label);
            inv.arg(ms(config.fence_keep)).arg(HAND_OVER_BOUND);
            inv
        } else {
            let [h, _, _, s] = lock_keys(&config.prefix, key);
            let (_, weight, limit) = admission::encode(offer.mode);
            let mut inv = self.inner.scripts.share_hand_over.call(2);
            inv.key(h).key(s);
            inv.arg(&from.hex_digits()[..]).arg(&offer.token.hex_digits()[..]).arg(ms(offer.ttl)).arg(&offer.label);
            inv.arg(weight).arg(limit).arg(ms(config.fence_keep));
            inv
        };
        inv.arg_parts(&self.inner.notifier.naming().lock_channel_parts(key.as_str()));
        let generation = self.track(&self.inner.conn, &mut inv);
        let reply: Vec<i64> = self.invoke(&inv).await?;
        let outcome = (reply.first().copied().unwrap_or(0), reply.get(1).copied().unwrap_or(0));
        if offer.mode != LeaseMode::Exclusive {
            self.inner.offers.note_spare(key.as_str(), reply.get(2).copied());
        }
        if outcome.0 == 1 {
            // replicas=N (replicas.rs): an unconfirmed grant is released.
            self.confirm_grant(key, offer.token, generation, inv.client_id()).await?;
        }
        Ok(outcome)
    }

    /// Releases `token` on a task of its own, retried while the store
    /// fails, until its lease of `ttl` from now has surely run out.
    fn release_in_background(&self, key: &LockKey, token: OwnerToken, ttl: Duration) {
        let release = Release {
            backend: Arc::new(self.clone()),
            key: key.clone(),
            token,
            horizon: Horizon::At(tokio::time::Instant::now() + ttl + 2 * drift_margin(ttl)),
            observed: None,
        };
        if release.spawn().is_none() {
            tracing::debug!("no runtime to release a handed grant in; its lease will expire");
        }
    }
}

/// A releaser's hand-over, from the taken offer to the waiter's answer;
/// dropped before that, it settles on a task of its own.
struct TakenOffer {
    backend: RedisBackend,
    key: LockKey,
    from: OwnerToken,
    offer: Option<Offer>,
}

impl TakenOffer {
    async fn run(&mut self) -> Result<bool> {
        let Some(offer) = self.offer.as_ref() else { return Ok(false) };
        let started = Instant::now();
        let outcome = self.backend.hand_over_call(&self.key, self.from, offer).await;
        let Some(offer) = self.offer.take() else { return Ok(false) };
        match outcome {
            Ok((1, fence)) => {
                let grant = Grant::new(fence.max(0) as u64, started, offer.ttl);
                if offer.tx.send(Handed::Granted(grant)).is_err() {
                    // The waiter is gone; the call was applied before its
                    // reply, so this release comes after it (or hands on).
                    self.backend.release_in_background(&self.key, offer.token, offer.ttl);
                }
                Ok(true)
            }
            Ok((0, 1)) => {
                let _ = offer.tx.send(Handed::Released);
                Ok(true)
            }
            Ok(_) => {
                let released = self.backend.release_plain(&self.key, self.from).await;
                let _ = offer.tx.send(Handed::Released);
                released
            }
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "hand-over call failed; releasing, then telling the waiter");
                Self::settle(&self.backend, &self.key, self.from, offer).await
            }
        }
    }

    /// After a call whose outcome is unknown: the releaser's own release
    /// first, confirmed, then the waiter is told (or, gone, its token
    /// released). A late copy of the call then finds no lease to hand.
    /// Returns the own release's error; without that confirmation the
    /// waiter is told nothing (its offer is dropped, which it reads as
    /// "not known" and attempts), and the client retries the release.
    async fn settle(backend: &RedisBackend, key: &LockKey, from: OwnerToken, offer: Offer) -> Result<bool> {
        let released = backend.release_plain(key, from).await?;
        if offer.tx.send(Handed::Unknown).is_err() {
            backend.release_in_background(key, offer.token, offer.ttl);
        }
        Ok(released)
    }
}

impl Drop for TakenOffer {
    fn drop(&mut self) {
        let Some(offer) = self.offer.take() else { return };
        let (backend, key, from) = (self.backend.clone(), self.key.clone(), self.from);
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        handle.spawn(async move {
            if let Err(e) = Self::settle(&backend, &key, from, offer).await {
                tracing::debug!(key = %key, error = %e, "could not settle a dropped hand-over; leases run out");
            }
        });
    }
}
