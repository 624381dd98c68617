//! The calls RedLock makes to its members: one round of tries on all of them
//! at once, a round that waits on them in order, the fence write-back, and
//! releases. Every call to a member is bounded, and every round uses a token
//! of its own (see [`super::rounds`]).

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::time::{Instant, timeout};

use crate::backend::{AcquireRequest, Backend, Grant};
use crate::lease::Horizon;
use crate::lease::drift_margin;
use crate::lease::release::Release;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

/// One member's grant in a round.
#[derive(Debug)]
pub(super) struct Vote {
    pub(super) member: usize,
    pub(super) grant: Grant,
}

impl Vote {
    /// When this member lets the grant go without a renewal.
    fn ends(&self) -> std::time::Instant {
        self.grant.attempt_started + self.grant.valid_for
    }
}

/// The members and how long one call to a member may take.
#[derive(Debug)]
pub(super) struct Members {
    pub(super) stores: Vec<Arc<dyn Backend>>,
    pub(super) call_timeout: Duration,
}

/// The votes of a round of tries, and the first error a member returned.
pub(super) struct Tally {
    pub(super) votes: Vec<Vote>,
    pub(super) failed: usize,
    pub(super) error: Option<Error>,
}

impl Tally {
    fn count(&mut self, member: usize, out: Result<Option<Grant>>) {
        match out {
            Ok(Some(grant)) => self.votes.push(Vote { member, grant }),
            Ok(None) => {}
            Err(e) => {
                self.failed += 1;
                self.error.get_or_insert(e);
            }
        }
    }
}

/// How long the earliest of `held` stays usable (drift margin off), if at
/// all: no member may be waited on past it.
fn valid_left(held: &[Vote], ttl: Duration) -> Option<Duration> {
    let ends = held.iter().map(Vote::ends).min()?;
    let usable = Instant::from_std(ends.checked_sub(drift_margin(ttl))?);
    let left = usable.saturating_duration_since(Instant::now());
    (!left.is_zero()).then_some(left)
}

/// The floor for the members asked after `grant` in the same round: at
/// least its fence, so that a member whose counter stands lower answers that
/// same fence and needs no write-back (a member that issued a lower fence
/// than an earlier member of its round cost one more round trip; with
/// Redis's local hand-over the first member's fence comes from its clock and
/// the next member's from its kept fence, so almost every contended round
/// did). Any floor is safe (see [`super::floors`]); none past the lowest cap.
fn raised_floor(floor: u64, grant: &Grant) -> u64 {
    if grant.fence <= super::floors::MAX_FLOOR { floor.max(grant.fence) } else { floor }
}

fn timed_out(store: &'static str, what: &str, after: Duration) -> Error {
    Error::backend(store, true, format!("RedLock member: no reply to {what} within {after:?}"))
}

impl Members {
    pub(super) fn majority(&self) -> usize {
        self.stores.len() / 2 + 1
    }

    /// Bounds one member call; a call that runs out is a retryable error
    /// (it may still be applied: its round's token is released later).
    async fn call<T>(
        &self,
        member: usize,
        what: &str,
        call: impl Future<Output = Result<T>>,
        limit: Duration,
    ) -> Result<T> {
        match timeout(limit, call).await {
            Ok(out) => out,
            Err(_) => Err(timed_out(self.stores[member].name(), what, limit)),
        }
    }

    /// One try on every member at once, with `req` (a round's token).
    pub(super) async fn try_all(&self, req: &AcquireRequest) -> Tally {
        let calls = self.stores.iter().enumerate().map(|(i, store)| async move {
            (i, self.call(i, "acquire", store.try_acquire(req), self.call_timeout).await)
        });
        let mut tally = Tally { votes: Vec::new(), failed: 0, error: None };
        for (member, out) in join_all(calls).await {
            tally.count(member, out);
        }
        tally
    }

    /// Waits on the members in their order (the same in every client, so
    /// that two waiters never hold each other's next member) until a
    /// majority granted. Each wait is woken by that member's own
    /// notification and lasts no longer than the earliest grant so far stays
    /// valid; a member that fails is passed over. Returns the grants had,
    /// fewer than a majority if no majority could be had in time.
    ///
    /// `ask` is told, before each call, how many members (a prefix in
    /// order) the round has asked so far, so that its release names no
    /// other. Each member after a grant is asked with that grant's fence as
    /// its floor (see [`raised_floor`]).
    pub(super) async fn wait_in_order(&self, req: &AcquireRequest, ask: &(dyn Fn(usize) + Sync)) -> Vec<Vote> {
        let majority = self.majority();
        let mut held: Vec<Vote> = Vec::new();
        let mut req = req.clone();
        for member in 0..self.stores.len() {
            if held.len() >= majority || self.stores.len() - member < majority - held.len() {
                break;
            }
            let limit = if held.is_empty() {
                // Nothing held yet: wait as long as a lease lasts, then start over.
                req.ttl
            } else {
                match valid_left(&held, req.ttl) {
                    Some(left) => left,
                    None => break,
                }
            };
            let store = &self.stores[member];
            ask(member + 1);
            if let Ok(grant) = self.call(member, "acquire", store.acquire(&req), limit).await {
                req.fence_floor = raised_floor(req.fence_floor, &grant);
                held.push(Vote { member, grant });
            }
        }
        held
    }

    /// A try after a split vote (the members that answered each granted
    /// someone, no one a majority): the members in their order, the same in
    /// every client, like a waiter's. The first member that answers must
    /// grant, or this try stops there (its holder is the one that can
    /// win); each later member is waited on (woken by its notification, the
    /// rival's first round being on its way out) for at most `limit` and
    /// while the grants so far stay valid. Two clients never hold each
    /// other's next member, so one of them gets a majority. Returns the
    /// grants had.
    /// `ask` and the floors as in [`wait_in_order`](Self::wait_in_order).
    pub(super) async fn try_in_order(
        &self,
        req: &AcquireRequest,
        limit: Duration,
        ask: &(dyn Fn(usize) + Sync),
    ) -> Vec<Vote> {
        let majority = self.majority();
        let mut held: Vec<Vote> = Vec::new();
        let mut req = req.clone();
        for member in 0..self.stores.len() {
            if held.len() >= majority || self.stores.len() - member < majority - held.len() {
                break;
            }
            let store = &self.stores[member];
            if held.is_empty() {
                ask(member + 1);
                match self.call(member, "acquire", store.try_acquire(&req), self.call_timeout).await {
                    Ok(Some(grant)) => {
                        req.fence_floor = raised_floor(req.fence_floor, &grant);
                        held.push(Vote { member, grant });
                    }
                    Ok(None) => break,
                    // Down: the next member is the first that answers.
                    Err(_) => {}
                }
                continue;
            }
            let Some(left) = valid_left(&held, req.ttl) else { break };
            ask(member + 1);
            if let Ok(grant) = self.call(member, "acquire", store.acquire(&req), left.min(limit)).await {
                req.fence_floor = raised_floor(req.fence_floor, &grant);
                held.push(Vote { member, grant });
            }
        }
        held
    }

    /// Completes a round that has a majority: the fence is the highest any
    /// granting member issued; it is written back, with max, to every
    /// granting member that issued a lower one, and the grant counts only if
    /// a majority holds it after the write-back with validity left, drift
    /// included. (The model in `crates/holdfast-models` shows each weaker
    /// order breaking the fence: no write-back, an overwriting one, or
    /// validity checked before it.)
    pub(super) async fn complete(&self, req: &AcquireRequest, votes: Vec<Vote>) -> Option<Grant> {
        let fence = votes.iter().map(|v| v.grant.fence).max()?;
        let raises = votes.iter().map(|v| async move {
            if v.grant.fence >= fence {
                // Its counter already stands at the fence: read from its
                // answer, whatever floor was sent (a client that skipped the
                // write-back because it believed its floor above the counters
                // lets fences go back: model variant `ClientTrustsFloor`).
                return true;
            }
            let raise = self.stores[v.member].raise_fence(&req.key, req.token, fence);
            matches!(self.call(v.member, "raise_fence", raise, self.call_timeout).await, Ok(true))
        });
        let acked: Vec<&Vote> =
            votes.iter().zip(join_all(raises).await).filter(|(_, ok)| *ok).map(|(v, _)| v).collect();
        let majority = self.majority();
        if acked.len() < majority {
            return None;
        }
        // The lease holds while a majority of members hold it: until the
        // majority-th latest end among them.
        let mut ends: Vec<std::time::Instant> = acked.iter().map(|v| v.ends()).collect();
        ends.sort_unstable_by(|a, b| b.cmp(a));
        let ends = ends[majority - 1];
        let started = acked.iter().map(|v| v.grant.attempt_started).min()?;
        let valid_for = ends.saturating_duration_since(started);
        let usable_until = Instant::from_std(ends).checked_sub(drift_margin(valid_for))?;
        (Instant::now() < usable_until).then(|| Grant::new(fence, started, valid_for))
    }

    /// Releases every round token on every member at once. The lock is
    /// free once fewer than a majority can still hold it: then the release
    /// succeeds, and a member that failed is released again in the
    /// background until its lease (`ttl`) has surely run out. Otherwise the
    /// first error (the caller retries the whole release: it is idempotent
    /// on the members that succeeded).
    ///
    /// Each round token goes only to the members its round asked (a prefix
    /// of the members, in order; see [`super::rounds`]): a member never asked
    /// with a token cannot hold it.
    pub(super) async fn release_all(
        &self,
        key: &LockKey,
        rounds: &[(OwnerToken, usize)],
        ttl: Duration,
    ) -> Result<bool> {
        let calls = rounds.iter().flat_map(|&(token, asked)| {
            self.stores.iter().enumerate().take(asked).map(move |(i, store)| async move {
                (i, token, self.call(i, "release", store.release(key, token), self.call_timeout).await)
            })
        });
        let mut released = false;
        let mut failed: Vec<(usize, OwnerToken, Error)> = Vec::new();
        for (member, token, out) in join_all(calls).await {
            match out {
                Ok(r) => released |= r,
                Err(e) => failed.push((member, token, e)),
            }
        }
        let mut failed_members: Vec<usize> = failed.iter().map(|(m, _, _)| *m).collect();
        failed_members.dedup();
        if failed_members.len() >= self.majority() {
            return Err(failed.swap_remove(0).2);
        }
        let horizon = Horizon::At(Instant::now() + ttl + 2 * drift_margin(ttl));
        for (member, token, _) in failed {
            let backend = self.stores[member].clone();
            let _ = Release { backend, key: key.clone(), token, horizon: horizon.clone(), observed: None }.spawn();
        }
        Ok(released)
    }
}
