//! Model 5: the Redis store's lock hash `H` through uncontended cycles, and
//! the cheaper layouts that issue 33 ("an uncontended Redis cycle as cheap
//! as the floor's") weighed against it.
//!
//! One Redis server runs each script atomically on its own clock. `acquire`
//! grants a lock whose holder's lease ended (`x` not after now) with the fence
//! `max(f + 1, now)` and a lease of `ttl`; `renew` moves the holder's `x`;
//! `release` by the holder sets `x` to 0 and `r` to its token. Every write
//! keeps `H` alive until at least `keep` past the lease's end, in steps of
//! half a keep (`write` in `common.lua`), and the server deletes `H` once its
//! clock reaches `e`. The clock may step back once, by up to `keep` (the
//! bound within which the docs promise fences "whatever the server clock
//! does"). Clients acquire, renew, release or let their lease run out in any
//! order; each makes at most `grants` acquisitions, each with a new token.
//!
//! The fair queue, shares and waiter marks are not here: the layouts
//! compared differ only in the fields above, and the scripts keep reading
//! `q`, `sx` and `w` as before (their models: `fair_handoff`, `downgrade`).
//! Old and new clients run the same steps on the same fields (the shipped
//! change is in how the scripts compute them), so one set of steps stands
//! for both versions.

mod state;

pub use state::{CycleState, Fence, LockHash, Phase, Token, client_name};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CycleVariant {
    /// Shipped (the layout as it was): a clock fence, `H` kept `keep` past
    /// every lease's end, renewal moves `e` too, release checks the clock.
    Shipped,
    /// Rejected: the fence from a per-lock counter (`f + 1`, no `TIME` for
    /// the fence). `H` still expires `keep` after the last lease, and the
    /// counter with it.
    CounterFence,
    /// Rejected: `H` lives as long as the lease (`PX ttl` carries the TTL,
    /// no keep period, no `e`).
    LeaseLongHash,
    /// Rejected: renewal moves `x` but skips `PEXPIREAT` (`e` stays).
    RenewWithoutExpiry,
    /// Rejected: release without `TIME`: the owner check alone (`o` is the
    /// token), like a compare-and-delete.
    ReleaseWithoutClock,
}

/// Name of the mutual-exclusion property.
pub const MUTUAL_EXCLUSION: &str = "no two clients hold live leases at once";
/// Name of the fence-order property.
pub const FENCES_INCREASE: &str = "each grant's fence is above every earlier grant's";
/// Name of the release-answer property.
pub const RELEASE_TELLS_THE_TRUTH: &str = "a release answers released only for a live lease";
/// Reachability: a grant after `H` expired (so the expiry is exercised).
pub const GRANT_AFTER_EXPIRY: &str = "a lock is granted again after its hash expired";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct CycleModel {
    /// Which design.
    pub variant: CycleVariant,
    /// Clients.
    pub clients: u8,
    /// Acquisitions per client.
    pub grants: u8,
    /// Lease TTL, in clock ticks.
    pub ttl: u8,
    /// The fence keep period (`fence_keep`), in clock ticks.
    pub keep: u8,
    /// Real time stops here (bounds the space).
    pub horizon: u8,
}

impl CycleModel {
    /// Two clients of two grants each, TTL 2, keep 2, from time 3 to 10.
    pub fn new(variant: CycleVariant) -> Self {
        CycleModel { variant, clients: 2, grants: 2, ttl: 2, keep: 2, horizon: 10 }
    }

    /// `H`'s expiry after a write whose lease ends at `lease_end` (`write`
    /// in `common.lua`): unchanged while it is at least `keep` past the
    /// lease end, else moved to `lease_end + keep + keep / 2`.
    fn kept_until(&self, e: u8, lease_end: u8) -> u8 {
        if self.variant == CycleVariant::LeaseLongHash {
            return lease_end;
        }
        if e < lease_end + self.keep { lease_end + self.keep + self.keep / 2 } else { e }
    }

    fn acquire(&self, s: &mut CycleState, c: u8) {
        let now = s.clock;
        let prior = s.hash.clone();
        if let Some(h) = &prior
            && h.o.is_some()
            && h.x > now
        {
            return; // busy: the client stays idle and may try again
        }
        let (f, e) = prior.as_ref().map_or(((0, 0), 0), |h| (h.f, h.e));
        let next = (f.0, f.1 + 1);
        let fence = match self.variant {
            CycleVariant::CounterFence => (0, f.1 + 1),
            _ if f >= (now, 0) => next,
            _ => (now, 0),
        };
        let token = (c, s.grants[c as usize]);
        let lease_end = now + self.ttl;
        let r = prior.and_then(|h| h.r);
        s.hash = Some(LockHash { o: Some(token), f: fence, x: lease_end, e: self.kept_until(e, lease_end), r });
        s.grants[c as usize] += 1;
        s.clients[c as usize] = Phase::Holding { token, fence, until: s.real + self.ttl };
        if s.top_fence.is_some_and(|top| fence <= top) {
            s.fence_went_back = true;
        }
        s.top_fence = Some(s.top_fence.map_or(fence, |top| top.max(fence)));
    }

    fn renew(&self, s: &mut CycleState, c: u8) {
        let Phase::Holding { token, fence, .. } = s.clients[c as usize] else { return };
        let now = s.clock;
        match s.hash.as_mut() {
            Some(h) if h.o == Some(token) && h.x > now => {
                h.x = now + self.ttl;
                if self.variant != CycleVariant::RenewWithoutExpiry {
                    h.e = self.kept_until(h.e, h.x);
                }
                s.clients[c as usize] = Phase::Holding { token, fence, until: s.real + self.ttl };
            }
            // Lost: the client stops counting itself the holder.
            _ => s.clients[c as usize] = Phase::Idle,
        }
    }

    fn release(&self, s: &mut CycleState, c: u8) {
        let Phase::Holding { token, .. } = s.clients[c as usize] else { return };
        let now = s.clock;
        if let Some(h) = s.hash.as_mut()
            && h.o == Some(token)
            && (h.x > now || self.variant == CycleVariant::ReleaseWithoutClock)
        {
            // Judged on the server's clock, as the store's answer is.
            if h.x <= now {
                s.released_a_dead_lease = true;
            }
            h.x = 0;
            h.r = Some(token);
        }
        s.clients[c as usize] = Phase::Idle;
    }

    /// The server deletes `H` once its clock reaches `e`.
    fn expire(s: &mut CycleState) {
        if s.hash.as_ref().is_some_and(|h| s.clock >= h.e) {
            s.hash = None;
            s.hash_expired = true;
        }
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CycleAction {
    /// A client runs `acquire`.
    Acquire(u8),
    /// A holder runs `renew`.
    Renew(u8),
    /// A holder runs `release`.
    Release(u8),
    /// A holder gives up its lease without a word (a crash): it runs out.
    Crash(u8),
    /// The server clock moves one tick forward.
    Tick,
    /// The server clock steps back by this many ticks (once).
    StepBack(u8),
}

impl fmt::Display for CycleAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Acquire(c) => write!(f, "{} acquires", client_name(*c)),
            Self::Renew(c) => write!(f, "{} renews", client_name(*c)),
            Self::Release(c) => write!(f, "{} releases", client_name(*c)),
            Self::Crash(c) => write!(f, "{} crashes", client_name(*c)),
            Self::Tick => write!(f, "the clock ticks"),
            Self::StepBack(n) => write!(f, "the clock steps back {n}"),
        }
    }
}

impl Model for CycleModel {
    type State = CycleState;
    type Action = CycleAction;

    fn init_states(&self) -> Vec<CycleState> {
        let n = self.clients as usize;
        vec![CycleState {
            real: 3,
            clock: 3,
            stepped_back: false,
            hash: None,
            clients: vec![Phase::Idle; n],
            grants: vec![0; n],
            top_fence: None,
            fence_went_back: false,
            released_a_dead_lease: false,
            hash_expired: false,
        }]
    }

    fn actions(&self, s: &CycleState, actions: &mut Vec<CycleAction>) {
        for c in 0..self.clients {
            match s.clients[c as usize] {
                Phase::Idle if s.grants[c as usize] < self.grants => actions.push(CycleAction::Acquire(c)),
                Phase::Idle => {}
                Phase::Holding { .. } => {
                    actions.extend([CycleAction::Renew(c), CycleAction::Release(c), CycleAction::Crash(c)])
                }
            }
        }
        if s.real < self.horizon {
            actions.push(CycleAction::Tick);
        }
        if !s.stepped_back {
            for back in 1..=self.keep.min(s.clock) {
                actions.push(CycleAction::StepBack(back));
            }
        }
    }

    fn next_state(&self, s: &CycleState, action: CycleAction) -> Option<CycleState> {
        let mut next = s.clone();
        match action {
            CycleAction::Acquire(c) => self.acquire(&mut next, c),
            CycleAction::Renew(c) => self.renew(&mut next, c),
            CycleAction::Release(c) => self.release(&mut next, c),
            CycleAction::Crash(c) => next.clients[c as usize] = Phase::Idle,
            CycleAction::Tick => {
                next.real += 1;
                next.clock += 1;
                // A crashed client is gone; a holder whose lease ran out on
                // the server clock stays "holding" until it renews or
                // releases and is told.
                Self::expire(&mut next);
            }
            CycleAction::StepBack(n) => {
                next.clock -= n;
                next.stepped_back = true;
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(MUTUAL_EXCLUSION, |_, s: &CycleState| !s.two_live_leases()),
            Property::always(FENCES_INCREASE, |_, s: &CycleState| !s.fence_went_back),
            Property::always(RELEASE_TELLS_THE_TRUTH, |_, s: &CycleState| !s.released_a_dead_lease),
            Property::sometimes(GRANT_AFTER_EXPIRY, |_, s: &CycleState| {
                s.hash_expired && s.hash.as_ref().is_some_and(|h| h.o.is_some())
            }),
        ]
    }
}
