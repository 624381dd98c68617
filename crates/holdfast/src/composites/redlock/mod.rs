//! RedLock: one lock over a majority of N independent stores, with fences.
//!
//! [`RedLock`] is a [`Backend`] built over other backends (its *members*),
//! so every primitive and guarantee of the client works over it: owned
//! guards, renewal, `lost()`, cancel cleanup, the waiting policy. Members are
//! usually N Redis servers (`redlock://h1:p1,h2:p2,h3:p3`), but any stores
//! whose fences come from a counter qualify (SQLite, Redis, PostgreSQL,
//! MySQL; see [`Capabilities::fence_floor`]), mixed as you like.
//!
//! # How a grant is made
//!
//! 1. One round asks every member at once, each call bounded by a short
//!    timeout (`call_timeout_ms`, 250 ms), with a token of the round's own
//!    and a fence floor (below): the first round of a waiting `acquire` as
//!    of a `try_acquire`, so an uncontended acquire is one round trip.
//! 2. With a majority granted, the fence is the highest fence any granting
//!    member issued, written back (raised with max, never overwritten) to
//!    every granting member that issued a lower one. The grant counts only if
//!    a majority acknowledged and the lease, counted from before the first
//!    request and less the drift margin, is still valid after the write-back.
//! 3. Otherwise the round releases what it got everywhere, and a waiting
//!    acquire starts a round that waits on the members one after another in
//!    their order, each wait woken by that member's own notification
//!    (pub/sub, NOTIFY, ...) and bounded by the validity left. Every waiter
//!    takes members in the same order, so two waiters never hold each
//!    other's next member: split votes resolve without a stall. A round that
//!    still fails releases everything and the next one starts after a
//!    jittered delay.
//!
//! # The fence floor: no write-back when the members agree
//!
//! Each round carries a floor
//! ([`AcquireRequest::fence_floor`](crate::backend::AcquireRequest::fence_floor)):
//! one above the highest fence this lock saw for the key (never from the
//! client's clock; see `floors.rs`). A member grants `max(its next fence,
//! floor)` (a Redis member with a kept fence: `max(kept + 1, floor)`),
//! so when the floor is above every granting member's counter they all
//! answer the same fence and step 2 writes nothing back. Whether to write
//! back is read from each member's answer, never from the floor the client
//! sent: a stale floor (another client granted since, a member's counter
//! ran ahead) leaves the answers apart, and the members below the highest
//! are written back as before. Any floor is safe; a stale one costs a
//! write-back, a high one a gap in the fences.
//!
//! # Why the first round of a waiting acquire asks every member at once
//!
//! It used to ask the first member alone, and the others only if that one
//! granted (waiters queue on the first member). Two things are kept:
//!
//! - **A round that does not count never holds a majority.** The first
//!   round counts any majority it gets, as `try_acquire`'s does; a round
//!   without a majority holds a minority, which `status` and an election's
//!   observer never take for a holder (they need a majority naming one
//!   fence). Counting only a majority that includes the first member (so
//!   as not to pass a waiter that holds it) would break this: a majority of
//!   the others, held but not counted, all answering the floor's fence,
//!   would show a holder that never held. (A counted round can still fail
//!   its validity check after a majority answered alike: only when the
//!   round took nearly a whole TTL, as for `try_acquire`.)
//! - **Split votes resolve without a stall.** Rivals that each got a
//!   minority in their first round release it and wait in the members'
//!   order (step 3), as before.
//!
//! Within one lock (one process), an acquire that finds another acquire of
//! the key waiting on the members in order skips the round on every member
//! and queues behind it, so a process's waiters take turns (conformance
//! `s1_hot_key_every_waiter_acquires`: per task 4..22 without this).
//! What is given up: across processes, a waiter that holds the first member
//! and waits on the next one in order can be passed by another process's
//! round that gets all the others at once (the process that just released,
//! typically). It is passed only while that round wins its race at the
//! member the waiter waits on, which the waiter's notification makes even;
//! the waiter's own round stays valid meanwhile, and it gets the key once it
//! wins one race.
//!
//! The lease counts as held while a majority holds it; renewals go to every
//! member and succeed with a majority; a release goes to every member.
//!
//! # Members down at start
//!
//! [`open_url`](RedLock::open_url) (and `redlock://` in
//! [`Client::connect`](crate::Client::connect)) builds the lock while
//! members are down: a member that cannot be reached is a
//! deferred ([`connect_or_defer`](crate::stores::connect_or_defer)) store, connected in the background
//! with backoff, that counts as a failed vote until it answers (so a
//! majority of the others grants meanwhile). With every member down the lock
//! still builds, as a Redisson or Curator client does, and every call fails
//! with a retryable store error naming the member until a majority answers.
//! A malformed URL fails at once. For members built in code, connect them
//! with [`connect_or_defer`](crate::stores::connect_or_defer).
//!
//! # `try_acquire` under contention
//!
//! A try asks every member at once. When rivals split the vote (each got
//! some members, none a majority: likely with a member down, where two live
//! members split two ways), each that got any lets go and tries once more
//! in the members' order, like a waiter: the first member that answers
//! must grant, the later ones are waited on briefly (at most four call
//! timeouts each) while a rival's first round is released. So one of them
//! wins; an uncontended try stays one round.
//!
//! # Guarantees and where they end
//!
//! - **Exclusion** holds while at most a minority of members is lost or
//!   partitioned, and while every member's clock runs within the drift margin
//!   (1% + 1 ms) of the client's.
//! - **Fences** increase strictly in grant order as long as a majority keeps
//!   its data: majorities intersect, and the member in the intersection
//!   raised its counter to the earlier fence before that grant counted.
//! - **Does not hold**: a member that restarts without its data while a
//!   lease is valid can let a second majority form (two holders) and issue
//!   lower fences; run members with persistence (Redis `appendfsync always`)
//!   or keep a restarted member out for a TTL plus the drift margin (the
//!   delayed restart the RedLock algorithm asks for). After such a delayed
//!   restart exclusion holds, but fences increase only while a majority
//!   keeps its counters. A member clock that jumps forward expires leases
//!   early, as on a single store.
//!
//! Every guarantee above is checked by a model (`crates/holdfast-models`,
//! the shipped design over a complete exploration), by seeded fault runs on
//! simulated members (`tests/sim`), and against real Redis servers
//! (`tests/redlock`).

mod config;
mod floors;
mod quorum;
mod rounds;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use rand::Rng;

pub use config::DEFAULT_CALL_TIMEOUT;

use crate::backend::wait::PollBounds;
use crate::backend::{AcquireRequest, Backend, Grant, HolderInfo, LockStatus, RenewRequest};
use crate::vocabulary::capability::{Capabilities, FenceDurability};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};
use floors::Floors;
use quorum::{Members, Vote};
use rounds::{Rounds, Waiting};

/// Delays between failed rounds of a waiting acquire: doubling, jittered.
const ROUND_DELAYS: PollBounds = PollBounds { min: Duration::from_millis(5), max: Duration::from_millis(200) };

/// How many call timeouts a `try_acquire` that split the vote waits, at
/// most, on each member after the first of its second try: a rival's first
/// round is released within about one call.
const SPLIT_WAIT_CALLS: u32 = 4;

/// A lock over a majority of independent stores. See the [module docs](self).
#[derive(Debug)]
pub struct RedLock {
    members: Members,
    rounds: Rounds,
    floors: Floors,
    waiting: Waiting,
}

impl RedLock {
    /// A RedLock over `members`, in this order, which must be the same in
    /// every client of the lock (waiters take members in it). Every member
    /// must be able to raise its fences ([`Capabilities::fence_floor`]) and
    /// must not keep grants on a session.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] without members; [`Error::Unsupported`] for a
    /// member that cannot take part (etcd, ZooKeeper).
    pub fn new(members: Vec<Arc<dyn Backend>>) -> Result<Self> {
        if members.is_empty() {
            return Err(Error::invalid(
                "redlock",
                "a RedLock needs at least one member store (three or more to survive a failure)",
            ));
        }
        for m in &members {
            let caps = m.capabilities();
            if !caps.fence_floor || caps.session_bound {
                return Err(Error::Unsupported {
                    store: m.name(),
                    what: "RedLock membership (its fences are log positions that cannot be raised)",
                });
            }
        }
        Ok(RedLock {
            members: Members { stores: members, call_timeout: DEFAULT_CALL_TIMEOUT },
            rounds: Rounds::default(),
            floors: Floors::default(),
            waiting: Waiting::default(),
        })
    }

    /// Bounds each call to a member (default [`DEFAULT_CALL_TIMEOUT`]): a
    /// member slower than this counts as failed for the round. Keep it well
    /// under the TTL.
    pub fn with_call_timeout(mut self, call_timeout: Duration) -> Self {
        self.members.call_timeout = call_timeout;
        self
    }

    /// How many members must grant: more than half.
    pub fn majority(&self) -> usize {
        self.members.majority()
    }

    /// [`open_url`](Self::open_url), its members opened with `connect`.
    #[cfg(feature = "redlock")]
    pub(crate) async fn open_url_with(url: &str, connect: crate::backend::ConnectFn) -> Result<Self> {
        config::open_url(url, connect).await
    }

    /// The next round of `req`'s acquisition: under a round token of its
    /// own (see [`rounds`]) and with the key's fence floor (see [`floors`];
    /// a floor the caller set is not RedLock's to honour, since it does not
    /// declare [`Capabilities::fence_floor`]).
    fn round_request(&self, req: &AcquireRequest) -> AcquireRequest {
        let mut r = req.clone();
        r.token = self.rounds.next(&req.key, req.token, req.ttl);
        r.fence_floor = self.floors.next(&req.key);
        r
    }

    /// Remembers the fences `votes` issued, for the next round's floor.
    fn saw(&self, key: &LockKey, votes: &[Vote]) {
        if let Some(fence) = votes.iter().map(|v| v.grant.fence).max() {
            self.floors.saw(key, fence);
        }
    }

    /// Completes a round that got a majority (see [`Members::complete`]).
    async fn complete(&self, round: &AcquireRequest, votes: Vec<Vote>) -> Option<Grant> {
        self.saw(&round.key, &votes);
        self.members.complete(round, votes).await
    }

    /// One round of tries on every member at once: the grant, the number of
    /// members that granted if it did not count (busy), or the error of a
    /// majority of members failing. Any majority counts, so a round that
    /// does not count never holds one (module docs).
    async fn try_round(&self, client: OwnerToken, round: &AcquireRequest) -> Result<std::result::Result<Grant, usize>> {
        self.rounds.reach(&round.key, client, round.token, self.members.stores.len());
        let tally = self.members.try_all(round).await;
        let majority = self.majority();
        let votes = tally.votes.len();
        self.saw(&round.key, &tally.votes);
        if votes == 0 && tally.failed == 0 {
            self.rounds.left_nothing(&round.key, client, round.token);
        }
        if votes >= majority {
            return Ok(self.complete(round, tally.votes).await.ok_or(votes));
        }
        if self.members.stores.len() - tally.failed < majority {
            // Too many members failed for a majority: a store error, not "busy".
            return Err(tally.error.unwrap_or_else(|| Error::backend("redlock", true, "members failed")));
        }
        Ok(Err(votes))
    }

    /// Releases every round of `client`'s acquisition on every member; on
    /// failure keeps them for the retry.
    async fn release_rounds(&self, key: &LockKey, client: OwnerToken) -> Result<bool> {
        let taken = self.rounds.take(key, client);
        if taken.sent.is_empty() {
            return Ok(false);
        }
        // Dropped before the members answered (the caller's future was
        // dropped), the rounds go back, so that the release sent again finds
        // them and releases them.
        let mut in_flight = RestoreIfDropped { rounds: &self.rounds, key, client, taken: Some(taken) };
        let outcome = match &in_flight.taken {
            Some(taken) => self.members.release_all(key, &taken.sent, taken.ttl).await,
            None => Ok(false),
        };
        let Some(taken) = in_flight.taken.take() else { return outcome };
        if outcome.is_err() {
            self.rounds.restore(key, client, taken);
        }
        outcome
    }
}

#[async_trait]
impl Backend for RedLock {
    fn name(&self) -> &'static str {
        "redlock"
    }

    fn capabilities(&self) -> Capabilities {
        let all: Vec<Capabilities> = self.members.stores.iter().map(|m| m.capabilities()).collect();
        let mut caps = Capabilities::minimal();
        caps.store_notification = all.iter().all(|c| c.store_notification);
        caps.fence_durability = FenceDurability::weakest(all.iter().map(|c| c.fence_durability));
        caps.renew_slice = all.iter().filter_map(|c| c.renew_slice).min().or(Some(256));
        caps
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        let round = self.round_request(req);
        let votes = match self.try_round(req.token, &round).await? {
            Ok(grant) => {
                self.rounds.granted(&req.key, req.token, round.token);
                return Ok(Some(grant));
            }
            Err(votes) => votes,
        };
        // Busy: let go of what the round got. A release that fails here is
        // retried by the client's cleanup only on errors, so report it as one.
        self.release_rounds(&req.key, req.token).await?;
        if votes == 0 {
            return Ok(None);
        }
        // A split vote: rivals asked every member at once and each got some
        // (with a member down, two live members split two ways: nobody won
        // in most contended tries). One more try, in the members' order,
        // settles it, as waiting rounds do; the uncontended case keeps its
        // single round.
        let round = self.round_request(req);
        let ask = |n| self.rounds.reach(&req.key, req.token, round.token, n);
        let held = self.members.try_in_order(&round, self.members.call_timeout * SPLIT_WAIT_CALLS, &ask).await;
        self.saw(&req.key, &held);
        if held.len() >= self.majority() {
            if let Some(grant) = self.complete(&round, held).await {
                self.rounds.granted(&req.key, req.token, round.token);
                return Ok(Some(grant));
            }
        }
        self.release_rounds(&req.key, req.token).await?;
        Ok(None)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        let mut delay = ROUND_DELAYS.min;
        // While another acquire of this lock waits for the key on the
        // members in order, a first round on every member at once could take
        // the others past it (conformance `s1_hot_key_every_waiter_acquires`:
        // per task 4..22): queue behind it instead, this time. Later rounds
        // start with a try as usual, so members that fail are still reported.
        let mut try_first = !self.waiting.any(&req.key);
        loop {
            if std::mem::replace(&mut try_first, true) {
                let round = self.round_request(req);
                match self.try_round(req.token, &round).await {
                    Ok(Ok(grant)) => {
                        self.rounds.granted(&req.key, req.token, round.token);
                        return Ok(grant);
                    }
                    // Busy: let go of this round everywhere, then wait on
                    // the members in order under a fresh round token (a late
                    // release of this round cannot touch the next one).
                    Ok(Err(_)) => {
                        let _ = self.release_rounds(&req.key, req.token).await;
                    }
                    Err(e) => {
                        let _ = self.release_rounds(&req.key, req.token).await;
                        return Err(e);
                    }
                }
            }
            {
                let _waiting = self.waiting.enter(&req.key);
                let round = self.round_request(req);
                let ask = |n| self.rounds.reach(&req.key, req.token, round.token, n);
                let held = self.members.wait_in_order(&round, &ask).await;
                self.saw(&req.key, &held);
                if held.len() >= self.majority() {
                    if let Some(grant) = self.complete(&round, held).await {
                        self.rounds.granted(&req.key, req.token, round.token);
                        return Ok(grant);
                    }
                }
            }
            // A failed round: release it everywhere, then start the next
            // after a jittered delay (so that rivals do not retry in step).
            let _ = self.release_rounds(&req.key, req.token).await;
            let jittered = delay.mul_f64(crate::vocabulary::entropy::with_rng(|rng| rng.random_range(0.5..1.0)));
            tokio::time::sleep(jittered).await;
            delay = (delay * 2).min(ROUND_DELAYS.max);
        }
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        self.release_rounds(key, token).await
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        // Each lease under its holding round's token; none: not held.
        let rounds: Vec<Option<OwnerToken>> = leases.iter().map(|l| self.rounds.holding(&l.key, l.token)).collect();
        let asked: Vec<RenewRequest> = leases
            .iter()
            .zip(&rounds)
            .filter_map(|(l, r)| r.map(|token| RenewRequest { key: l.key.clone(), token, ttl: l.ttl }))
            .collect();
        let mut held = vec![0usize; asked.len()];
        let mut failed = 0;
        let mut error = None;
        if !asked.is_empty() {
            let calls =
                self.members.stores.iter().map(|m| tokio::time::timeout(self.members.call_timeout, m.renew(&asked)));
            for out in join_all(calls).await {
                match out {
                    Ok(Ok(per_lease)) => {
                        for (count, ok) in held.iter_mut().zip(per_lease) {
                            *count += usize::from(ok);
                        }
                    }
                    Ok(Err(e)) => {
                        failed += 1;
                        error.get_or_insert(e);
                    }
                    Err(_) => failed += 1,
                }
            }
        }
        let majority = self.majority();
        let mut counts = held.into_iter();
        let mut out = Vec::with_capacity(leases.len());
        for round in &rounds {
            let count = if round.is_some() { counts.next().unwrap_or(0) } else { 0 };
            if round.is_some() && count < majority && count + failed >= majority {
                // The members that failed may still hold it: not known lost.
                return Err(error.unwrap_or_else(|| Error::backend("redlock", true, "renewal: members did not answer")));
            }
            out.push(count >= majority);
        }
        Ok(out)
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        let calls = self.members.stores.iter().map(|m| tokio::time::timeout(self.members.call_timeout, m.status(key)));
        let answers: Vec<LockStatus> = join_all(calls).await.into_iter().filter_map(|r| r.ok()?.ok()).collect();
        let majority = self.majority();
        if answers.len() < majority {
            return Err(Error::backend("redlock", true, "status: fewer than a majority of members answered"));
        }
        // A holder is one a majority of members name with the same fence:
        // a grant's fence is settled once the acquire wrote the highest
        // fence its members issued back to the others. Before that (the
        // acquire in flight) the members' fences differ and the key shows
        // no holder: reporting the highest of them showed an observer one
        // leadership under two terms, the first one never a real grant
        // (conformance `redlock::c16_election_safety`, seen in CI).
        let mut holder: Option<HolderInfo> = None;
        for candidate in answers.iter().filter_map(|a| a.holder.as_ref()) {
            let naming: Vec<&HolderInfo> = answers
                .iter()
                .filter_map(|a| a.holder.as_ref())
                .filter(|h| h.label == candidate.label && h.fence == candidate.fence)
                .collect();
            if naming.len() >= majority {
                let ttl_left = naming.iter().filter_map(|h| h.ttl_left).min();
                holder = Some(HolderInfo { ttl_left, ..candidate.clone() });
                break;
            }
        }
        Ok(LockStatus { holder, ..LockStatus::free(key) })
    }
}

/// The rounds of a release in flight, put back if it is dropped before the
/// members answered.
struct RestoreIfDropped<'a> {
    rounds: &'a Rounds,
    key: &'a LockKey,
    client: OwnerToken,
    taken: Option<rounds::Taken>,
}

impl Drop for RestoreIfDropped<'_> {
    fn drop(&mut self) {
        if let Some(taken) = self.taken.take() {
            self.rounds.restore(self.key, self.client, taken);
        }
    }
}
