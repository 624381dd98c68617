//! Model 9: SQL leases that live with their client's session row (issue 33,
//! item 4), against the variants weighed.
//!
//! Each client keeps one session row (per TTL; one TTL here). A grant row
//! names the session incarnation it lives with, and a row is held while that
//! session row is unexpired on the host clock; renewal extends the session
//! row alone (one row per client and period, not one per lease). A lapsed
//! session is never extended again: the client's next grant starts a new
//! incarnation (a new id), and its leases of the old one are reported lost.
//! Others may remove a live session's row (a forced release) or take over a
//! row whose session lapsed; both count the removal in the session row's
//! `removed`, and a renewal that finds that count moved reads which of the
//! client's rows are gone. While it has not moved, a renewal confirms the
//! client's leases of the live incarnation without reading their rows.
//!
//! Each statement is one atomic step (SQLite runs one write transaction at a
//! time). A renewal is sent, then runs later: the client counts its lease
//! from when it sent it, the store from when the statement runs, and other
//! steps (a lapse, a takeover, a clock step) may come between. The host
//! clock may step back once, by up to the TTL. The fence counter is
//! unchanged by this layout (one counter row, never lowered) and is not
//! modelled.

mod state;

pub use state::{Client, GrantRow, SessionRow, SessionState, View, client_name};

use std::fmt;

use stateright::{Model, Property};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionVariant {
    /// Shipped: takeovers and forced releases count the removal in the
    /// session row; a moved count makes the renewal read every row of the
    /// session; grants remember their incarnation.
    Shipped,
    /// Rejected: a takeover of a lapsed session's row does not count it
    /// (the session cannot be extended any more, so why count?).
    TakeoverWithoutCount,
    /// Rejected: a forced release does not count the removal.
    ForceWithoutCount,
    /// Rejected: a renewal that finds the count moved reads the rows of the
    /// leases it renews only, and takes the count as seen.
    ReadListedOnly,
    /// Rejected: the store does not remember which incarnation a grant was
    /// made in, and confirms any lease of the client while its current
    /// session lives.
    NoIncarnation,
}

/// Name of the mutual-exclusion property.
pub const MUTUAL_EXCLUSION: &str = "no two clients hold live views of one key at once";
/// Name of the renewal property.
pub const RENEWAL_TELLS_THE_TRUTH: &str = "a renewal confirms only a lease whose grant row is the holder's";
/// Reachability: a key taken over from a lapsed session, then held.
pub const TAKEOVER_HAPPENS: &str = "a key is taken over from a lapsed session";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct SessionModel {
    /// Which design.
    pub variant: SessionVariant,
    /// Clients.
    pub clients: u8,
    /// Keys.
    pub keys: u8,
    /// Acquisitions per client.
    pub grants: u8,
    /// Lease (and session) TTL, in clock ticks.
    pub ttl: u8,
    /// Real time stops here (bounds the space).
    pub horizon: u8,
}

impl SessionModel {
    /// Two clients, two keys, two grants each, TTL 2, time 3 to 7.
    pub fn new(variant: SessionVariant) -> Self {
        SessionModel { variant, clients: 2, keys: 2, grants: 2, ttl: 2, horizon: 7 }
    }

    fn session_live(s: &SessionState, c: u8, incarnation: u8) -> bool {
        s.sessions[c as usize].is_some_and(|r| r.incarnation == incarnation && r.expires > s.clock)
    }

    /// Counts a removal of `row` in its session row (if that incarnation's
    /// row is still the client's).
    fn count_removal(s: &mut SessionState, row: GrantRow) {
        if let Some(r) = s.sessions[row.client as usize].as_mut()
            && r.incarnation == row.incarnation
        {
            r.removed += 1;
        }
    }

    fn acquire(&self, s: &mut SessionState, c: u8, k: u8) -> bool {
        let (ci, ki) = (c as usize, k as usize);
        if let Some(row) = s.grants[ki] {
            if Self::session_live(s, row.client, row.incarnation) {
                return false; // busy
            }
            if self.variant != SessionVariant::TakeoverWithoutCount {
                Self::count_removal(s, row);
            }
            s.took_over = true;
        }
        let now = s.clock;
        let current = s.clients[ci].incarnation;
        if Self::session_live(s, c, current) {
            let r = s.sessions[ci].as_mut().expect("live");
            r.expires = r.expires.max(now + self.ttl);
        } else {
            let incarnation = current + 1;
            s.sessions[ci] = Some(SessionRow { incarnation, expires: now + self.ttl, removed: 0 });
            s.clients[ci].incarnation = incarnation;
            s.clients[ci].seen_removed = 0;
        }
        let incarnation = s.clients[ci].incarnation;
        s.grants[ki] = Some(GrantRow { client: c, incarnation });
        s.clients[ci].views[ki] = Some(View { incarnation, until: s.real + self.ttl, revoked: false });
        s.clients[ci].grants += 1;
        true
    }

    fn renew(&self, s: &mut SessionState, c: u8, k: u8) {
        let (ci, ki) = (c as usize, k as usize);
        let Some(sent) = s.clients[ci].renewing[ki].take() else { return };
        let Some(view) = s.clients[ci].views[ki] else { return };
        let current = s.clients[ci].incarnation;
        if !Self::session_live(s, c, current) {
            s.clients[ci].views[ki] = None;
            return;
        }
        let now = s.clock;
        let row = s.sessions[ci].as_mut().expect("live");
        row.expires = row.expires.max(now + self.ttl);
        let removed = row.removed;
        let mine = GrantRow { client: c, incarnation: current };
        if removed != s.clients[ci].seen_removed {
            let keys: Vec<usize> = match self.variant {
                SessionVariant::ReadListedOnly => vec![ki],
                _ => (0..self.keys as usize).collect(),
            };
            for j in keys {
                if s.clients[ci].views[j].is_some_and(|v| v.incarnation == current) && s.grants[j] != Some(mine) {
                    s.clients[ci].views[j] = None;
                }
            }
            s.clients[ci].seen_removed = removed;
        }
        let confirmed = match self.variant {
            SessionVariant::NoIncarnation => s.clients[ci].views[ki].is_some(),
            _ => s.clients[ci].views[ki].is_some() && view.incarnation == current,
        };
        if confirmed && s.grants[ki] != Some(GrantRow { client: c, incarnation: view.incarnation }) {
            s.confirmed_a_gone_lease = true;
        }
        // A confirmed renewal makes the client a holder again, whatever
        // happened to the row (`revoked` is cleared): that is the bug the
        // property above catches.
        let until = view.until.max(sent + self.ttl);
        s.clients[ci].views[ki] = confirmed.then_some(View { until, revoked: false, ..view });
    }

    fn release(s: &mut SessionState, c: u8, k: u8) {
        let (ci, ki) = (c as usize, k as usize);
        let Some(view) = s.clients[ci].views[ki] else { return };
        if s.grants[ki] == Some(GrantRow { client: c, incarnation: view.incarnation }) {
            s.grants[ki] = None;
        }
        s.clients[ci].views[ki] = None;
        s.clients[ci].renewing[ki] = None;
    }

    fn force_release(&self, s: &mut SessionState, k: u8) {
        if let Some(row) = s.grants[k as usize].take() {
            if let Some(v) = s.clients[row.client as usize].views[k as usize].as_mut()
                && v.incarnation == row.incarnation
            {
                v.revoked = true;
            }
            if self.variant != SessionVariant::ForceWithoutCount {
                Self::count_removal(s, row);
            }
        }
        s.forced = true;
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionAction {
    /// A client acquires a key (one transaction; busy changes nothing).
    Acquire(u8, u8),
    /// A client sends the renewal of its lease of a key.
    SendRenewal(u8, u8),
    /// The renewal's statement runs on the session row, and its answer
    /// reaches the client.
    Renew(u8, u8),
    /// A client releases its lease of a key.
    Release(u8, u8),
    /// An operator frees a key whatever its holder (once per run).
    ForceRelease(u8),
    /// A client crashes: it forgets its leases and acquires no more.
    Crash(u8),
    /// Real time and the host clock move one tick.
    Tick,
    /// The host clock steps back by this many ticks (once).
    StepBack(u8),
}

impl fmt::Display for SessionAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Acquire(c, k) => write!(f, "{} acquires K{k}", client_name(*c)),
            Self::SendRenewal(c, k) => write!(f, "{} sends the renewal of K{k}", client_name(*c)),
            Self::Renew(c, k) => write!(f, "{}'s renewal of K{k} runs", client_name(*c)),
            Self::Release(c, k) => write!(f, "{} releases K{k}", client_name(*c)),
            Self::ForceRelease(k) => write!(f, "an operator frees K{k}"),
            Self::Crash(c) => write!(f, "{} crashes", client_name(*c)),
            Self::Tick => write!(f, "time passes"),
            Self::StepBack(n) => write!(f, "the host clock steps back {n}"),
        }
    }
}

impl Model for SessionModel {
    type State = SessionState;
    type Action = SessionAction;

    fn init_states(&self) -> Vec<SessionState> {
        let keys = self.keys as usize;
        let client =
            Client { incarnation: 0, seen_removed: 0, views: vec![None; keys], grants: 0, renewing: vec![None; keys] };
        vec![SessionState {
            real: 3,
            clock: 3,
            stepped_back: false,
            forced: false,
            sessions: vec![None; self.clients as usize],
            grants: vec![None; self.keys as usize],
            clients: vec![client; self.clients as usize],
            took_over: false,
            confirmed_a_gone_lease: false,
        }]
    }

    fn actions(&self, s: &SessionState, actions: &mut Vec<SessionAction>) {
        for c in 0..self.clients {
            let client = &s.clients[c as usize];
            for k in 0..self.keys {
                match client.views[k as usize] {
                    None if client.grants < self.grants => actions.push(SessionAction::Acquire(c, k)),
                    None => {}
                    Some(v) => {
                        // The client sends a renewal only while its view
                        // lives (after that, `lost()` has fired and it only
                        // releases), one at a time.
                        if client.renewing[k as usize].is_some() {
                            actions.push(SessionAction::Renew(c, k));
                        } else if v.until > s.real {
                            actions.push(SessionAction::SendRenewal(c, k));
                        }
                        actions.push(SessionAction::Release(c, k));
                    }
                }
            }
            if client.grants < self.grants {
                actions.push(SessionAction::Crash(c));
            }
        }
        if !s.forced {
            for k in 0..self.keys {
                if s.grants[k as usize].is_some() {
                    actions.push(SessionAction::ForceRelease(k));
                }
            }
        }
        if s.real < self.horizon {
            actions.push(SessionAction::Tick);
        }
        if !s.stepped_back {
            for back in 1..=self.ttl.min(s.clock) {
                actions.push(SessionAction::StepBack(back));
            }
        }
    }

    fn next_state(&self, s: &SessionState, action: SessionAction) -> Option<SessionState> {
        let mut next = s.clone();
        match action {
            SessionAction::Acquire(c, k) => {
                if !self.acquire(&mut next, c, k) {
                    return None;
                }
            }
            SessionAction::SendRenewal(c, k) => next.clients[c as usize].renewing[k as usize] = Some(s.real),
            SessionAction::Renew(c, k) => self.renew(&mut next, c, k),
            SessionAction::Release(c, k) => Self::release(&mut next, c, k),
            SessionAction::ForceRelease(k) => self.force_release(&mut next, k),
            SessionAction::Crash(c) => {
                let client = &mut next.clients[c as usize];
                client.views.iter_mut().for_each(|v| *v = None);
                client.renewing.iter_mut().for_each(|r| *r = None);
                client.grants = self.grants;
            }
            SessionAction::Tick => {
                next.real += 1;
                next.clock += 1;
            }
            SessionAction::StepBack(n) => {
                next.clock -= n;
                next.stepped_back = true;
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(MUTUAL_EXCLUSION, |_, s: &SessionState| !s.two_live_views()),
            Property::always(RENEWAL_TELLS_THE_TRUTH, |_, s: &SessionState| !s.confirmed_a_gone_lease),
            Property::sometimes(TAKEOVER_HAPPENS, |_, s: &SessionState| {
                s.took_over && s.clients.iter().any(|c| c.views.iter().flatten().any(|v| v.until > s.real))
            }),
        ]
    }
}
