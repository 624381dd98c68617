//! The local hand-over (issue 33, item 2), the part every store shares: a
//! release of a key that another task of this client waits for passes the
//! lease straight to that task in one store call, instead of a release, a
//! wake-up and the waiter's own acquire. The design, its bound and its
//! failure paths were model-checked first (holdfast-models' `handover` and
//! `share_handover`). A store supplies the call ([`HandOver`]); Redis hands
//! over mutexes and shares (`stores/redis/handover.rs`). A MySQL/MariaDB
//! encoding (model 16's `MysqlPass`) was built on this and withdrawn: its
//! permits ran 5-12% faster in one process and 14-22% slower across four
//! (docs/performance.md, 2026-12-03 (evening)).
//!
//! - A task that waits for a key leaves an **offer** here: its own token,
//!   TTL, label and mode, and the sending half of a oneshot. Which waiters
//!   offer is the store's choice (fair waiters and writers never do: they
//!   are served by their queue or their reservation).
//! - [`Backend::release`] of that key takes the oldest offer and makes the
//!   store's call ([`HandOver::hand_over`]). A share's call releases the
//!   releasing token's live share and admits the waiter by the rule of
//!   every shared acquire (or a narrower one), in one atomic step: it grants
//!   only what the waiter's own attempt would be granted then, so another
//!   client's reservation is never passed over and no bound is needed. A
//!   mutex's call carries a bound of hand-overs in a row, after which it
//!   releases as a plain release does. Handed, the grant goes to the waiter
//!   through the oneshot, counted from before the call was sent; released,
//!   the waiter waits on; untouched (the releasing token held nothing to
//!   hand), the releaser releases by the plain release.
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
//!   (its `spare`), else that attempt would be refused. When the offer
//!   comes back (not handed), the waiter asks at once and queues for the
//!   turn again. A mutex's waiter keeps its turn: the next one's attempt
//!   could only be refused.
//! - When the call fails without a reply, the releaser releases its own
//!   token first and only then tells the waiter ([`Handed::Unknown`]),
//!   which attempts with its own token at once: a hand-over applied
//!   meanwhile is found as a retry by the holder, and a late copy of the
//!   call, finding the released lease, hands nothing (the model's
//!   `TellBeforeRelease` and `NoLeaseCheck` show what goes wrong otherwise).
//!
//! Cancel safety: a waiter dropped at any point after its offer was taken
//! either had the grant delivered (its client's cleanup releases its token,
//! as for any acquire that raced a drop) or the releaser's send fails and
//! the releaser releases the waiter's token itself, after the hand-over
//! call's reply (so after the call was applied). A releaser dropped
//! mid-call settles on a task of its own, as a failed call does.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::backend::wait::{self, Attempt, KeyWaiters, PollBounds};
use crate::backend::{AcquireRequest, Backend, Grant, LeaseMode};
use crate::lease::release::Release;
use crate::lease::{Horizon, drift_margin};
use crate::vocabulary::error::Result;
use crate::vocabulary::key::{LockKey, OwnerToken};

/// A store that hands a released lease to a waiting task of its client.
pub(crate) trait HandOver: Backend + Clone + 'static {
    /// The offers of this client's waiting tasks.
    fn offers(&self) -> &Arc<Offers>;

    /// The fallback poll of a waiting acquire.
    fn poll(&self) -> PollBounds;

    /// One attempt of a waiting acquire of `req` (its mode's).
    fn attempt_while_waiting(&self, req: &AcquireRequest) -> impl Future<Output = Result<Attempt>> + Send;

    /// The store's release of `token`, without a hand-over.
    fn release_without_hand_over(&self, key: &LockKey, token: OwnerToken) -> impl Future<Output = Result<bool>> + Send;

    /// One hand-over call from `from` to `offer`'s token. A share's call
    /// notes what it found free ([`Offers::note_spare`]).
    fn hand_over(&self, key: &LockKey, from: OwnerToken, offer: &Offer) -> impl Future<Output = Result<Passed>> + Send;
}

/// What one hand-over call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Passed {
    /// The waiter's token holds the lease, with this fence.
    Handed(u64),
    /// Not handed; the releasing token's lease was released as a plain
    /// release does, waking the waiters a plain release wakes.
    Released,
    /// Nothing changed: the releasing token held nothing to hand.
    Untouched,
}

/// A waiting task's wait for its turn and its attempts, or nothing.
type Waiting<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Grant>> + Send + 'a>>;

/// What a releaser tells a waiter whose offer it took.
enum Handed {
    /// The store made the waiter's token the holder.
    Granted(Grant),
    /// Not handed; the lock was released as a plain release does: the
    /// waiter waits on.
    Released,
    /// Not known whether the store handed it (the call failed without a
    /// reply; the releaser's own release is confirmed since): the waiter
    /// attempts with its own token at once.
    Unknown,
}

/// One waiting task's offer.
pub(crate) struct Offer {
    id: u64,
    /// The waiter's own token.
    pub(crate) token: OwnerToken,
    /// The waiter's TTL.
    pub(crate) ttl: Duration,
    /// The waiter's owner label.
    pub(crate) label: String,
    /// The waiter's mode.
    pub(crate) mode: LeaseMode,
    tx: oneshot::Sender<Handed>,
    /// Told when a releaser takes the offer.
    taken: Option<oneshot::Sender<()>>,
}

/// The offers of a client's waiting tasks, per key, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Offers {
    keys: Mutex<HashMap<String, KeyOffers>>,
    next_id: AtomicU64,
}

/// One key's offers, and what the last share's hand-over found free.
#[derive(Debug, Default)]
struct KeyOffers {
    queue: VecDeque<Offer>,
    /// The weight a new request would have found free after the last
    /// share's hand-over of the key (0 until one said, or after one handed
    /// nothing).
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
    pub(crate) fn note_spare(&self, key: &str, spare: Option<i64>) {
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

/// A waiting acquire ([`wait::until_granted`]) that also takes a grant
/// handed over by a releasing task of `store`'s client.
///
/// # Cancel safety
///
/// As [`Backend::acquire`]: see the module docs for a drop after a
/// releaser took the offer.
pub(crate) async fn wait_or_take<S: HandOver>(store: &S, req: &AcquireRequest, wakeup: &KeyWaiters) -> Result<Grant> {
    let offers = store.offers();
    let mut offer = offers.offer(req, false);
    let poll = store.poll();
    let queue_for_turn =
        || -> Waiting<'_> { Box::pin(wait::until_granted(wakeup, req, poll, || store.attempt_while_waiting(req))) };
    let mut waited = queue_for_turn();
    // Whether this task holds or queues for the key's turn to ask. A share's
    // waiter whose offer a releaser took gives its turn up: the hand-over
    // decides its grant (an attempt of its own beside that call would only
    // find the same grant), and the next local waiter asks, so that free
    // permits are taken side by side rather than by one chain of
    // hand-overs after another (issue 33). Only while the last hand-over
    // left room for it: when every permit is taken (as across busy
    // processes) the next one's attempt would be refused, a request for
    // nothing. A mutex's waiter keeps it for that reason.
    let mut asking = true;
    let weight = match req.mode {
        LeaseMode::Shared { weight, .. } => Some(i64::from(weight)),
        _ => None,
    };
    // Whether the offer's "taken" is still to be heard (a oneshot is polled
    // until it completes, never after).
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
                offer = offers.offer(req, true);
                // A hand-over applied meanwhile is this token's: an attempt
                // finds it (as a retry by the holder). After a plain release
                // the store wakes the waiters that asked; one that gave its
                // turn up asks now, then queues for the turn again.
                listening = weight.is_some();
                let gave_up = !std::mem::replace(&mut asking, true);
                if gave_up {
                    waited = queue_for_turn();
                }
                if unknown || gave_up {
                    if let Attempt::Granted(grant) = store.attempt_while_waiting(req).await? {
                        return offer.own_grant(Ok(grant)).await;
                    }
                }
            }
            taken = &mut offer.taken, if listening => {
                listening = false;
                if taken.is_ok() && weight.is_some_and(|w| offers.fits_beside(req.key.as_str(), w)) {
                    waited = Box::pin(std::future::pending());
                    asking = false;
                }
            }
            outcome = &mut waited => return offer.own_grant(outcome).await,
        }
    }
}

/// [`Backend::release`] of `store`: a hand-over when a task of its client
/// waits for the key, else its plain release.
///
/// # Cancel safety
///
/// As [`Backend::release`]; a drop after an offer was taken settles on a
/// task of its own (module docs).
pub(crate) async fn release_or_hand_over<S: HandOver>(store: &S, key: &LockKey, token: OwnerToken) -> Result<bool> {
    let Some(offer) = store.offers().take(key.as_str()) else {
        return store.release_without_hand_over(key, token).await;
    };
    let mut taken = TakenOffer { store: store.clone(), key: key.clone(), from: token, offer: Some(offer) };
    taken.run().await
}

/// Releases `token` on a task of its own, retried while the store fails,
/// until its lease of `ttl` from now has surely run out.
fn release_in_background<S: HandOver>(store: &S, key: &LockKey, token: OwnerToken, ttl: Duration) {
    let release = Release {
        backend: Arc::new(store.clone()),
        key: key.clone(),
        token,
        horizon: Horizon::At(tokio::time::Instant::now() + ttl + 2 * drift_margin(ttl)),
        observed: None,
    };
    if release.spawn().is_none() {
        tracing::debug!("no runtime to release a handed grant in; its lease will expire");
    }
}

/// A releaser's hand-over, from the taken offer to the waiter's answer;
/// dropped before that, it settles on a task of its own.
struct TakenOffer<S: HandOver> {
    store: S,
    key: LockKey,
    from: OwnerToken,
    offer: Option<Offer>,
}

impl<S: HandOver> TakenOffer<S> {
    async fn run(&mut self) -> Result<bool> {
        let Some(offer) = self.offer.as_ref() else { return Ok(false) };
        let started = Instant::now();
        let outcome = self.store.hand_over(&self.key, self.from, offer).await;
        let Some(offer) = self.offer.take() else { return Ok(false) };
        match outcome {
            Ok(Passed::Handed(fence)) => {
                let grant = Grant::new(fence, started, offer.ttl);
                if offer.tx.send(Handed::Granted(grant)).is_err() {
                    // The waiter is gone; the call was applied before its
                    // reply, so this release comes after it (or hands on).
                    release_in_background(&self.store, &self.key, offer.token, offer.ttl);
                }
                Ok(true)
            }
            Ok(Passed::Released) => {
                let _ = offer.tx.send(Handed::Released);
                Ok(true)
            }
            Ok(Passed::Untouched) => {
                let released = self.store.release_without_hand_over(&self.key, self.from).await;
                let _ = offer.tx.send(Handed::Released);
                released
            }
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "hand-over call failed; releasing, then telling the waiter");
                Self::settle(&self.store, &self.key, self.from, offer).await
            }
        }
    }

    /// After a call whose outcome is unknown: the releaser's own release
    /// first, confirmed, then the waiter is told (or, gone, its token
    /// released). A late copy of the call then finds no lease to hand.
    /// Returns the own release's error; without that confirmation the
    /// waiter is told nothing (its offer is dropped, which it reads as
    /// "not known" and attempts), and the client retries the release.
    async fn settle(store: &S, key: &LockKey, from: OwnerToken, offer: Offer) -> Result<bool> {
        let released = store.release_without_hand_over(key, from).await?;
        if offer.tx.send(Handed::Unknown).is_err() {
            release_in_background(store, key, offer.token, offer.ttl);
        }
        Ok(released)
    }
}

impl<S: HandOver> Drop for TakenOffer<S> {
    fn drop(&mut self) {
        let Some(offer) = self.offer.take() else { return };
        let (store, key, from) = (self.store.clone(), self.key.clone(), self.from);
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        handle.spawn(async move {
            if let Err(e) = Self::settle(&store, &key, from, offer).await {
                tracing::debug!(key = %key, error = %e, "could not settle a dropped hand-over; leases run out");
            }
        });
    }
}
