//! Model 10: PostgreSQL leases that live with their client's session row
//! (issue 33, item 4), under `READ COMMITTED`, against the variants weighed.
//!
//! The layout is model 9's ([`sql_session`](crate::sql_session)): a lease
//! row names the session incarnation it lives with and is held while that
//! session row is unexpired on the server clock; renewal extends the session
//! row alone; a lapsed session is never extended again; whoever removes
//! another client's row counts it in the row's session (`removed`), and a
//! renewal that finds the count moved reads which rows of the session are
//! left. Model 9 took each statement as one atomic step (SQLite runs one
//! writer at a time). PostgreSQL does not, and this model adds what its
//! `READ COMMITTED` does to one statement:
//!
//! - a statement reads a **snapshot** taken when it starts: it does not see
//!   what commits after that, nor anything uncommitted;
//! - an `UPDATE` of a row that another transaction has written and not
//!   committed **waits** for that transaction, then **re-checks its `WHERE`
//!   on the row's latest version** (and skips the row if it no longer
//!   matches); the other tables the statement reads stay at its snapshot;
//! - a write becomes visible at **commit**, and its row lock is held until
//!   then.
//!
//! So a statement here is several steps: an acquire takes its snapshot
//! (the key's row, its holder's session, the client's own session), then
//! writes and commits (waiting while a row it writes is locked); a renewal
//! starts, writes the session row (holding its lock), and commits later;
//! time may pass and the clock may step back between any two steps.
//!
//! The shipped statements:
//!
//! - **acquire**: busy if the snapshot shows the key's row held by an
//!   unexpired session. A row whose session lapsed is taken over only by
//!   an `UPDATE <sessions> SET removed = removed + 1 WHERE id = <its
//!   session> AND expires_at <= now()`, which waits for a renewal of that
//!   session in flight and re-checks the expiry on its latest version; and
//!   the lease row's `UPDATE` re-checks that the row is still the one the
//!   snapshot saw. The client's own session, read from the snapshot, is
//!   used as it is while two thirds of the TTL are left (no write: grants of
//!   one client do not queue on its session row), extended under its lock
//!   (re-checked unexpired) below that, and replaced by a new incarnation
//!   when lapsed;
//! - **renewal**: `UPDATE <sessions> SET expires_at = now() + ttl WHERE id =
//!   <session> AND expires_at > now() RETURNING removed`; a moved count sends
//!   a second statement that reads the session's rows (a new snapshot);
//! - **release** of its own row, and a **forced release** (which counts the
//!   removal, waiting for the session row's lock).
//!
//! The fence is not modelled (per-key fences: model `pg_fence`, unchanged).
//! One acquire and one renewal of each client are in flight at a time.

mod state;

pub use state::{Acquiring, Client, PgSessionState, Renewal, RenewalStep, SessionRow};

use std::fmt;

use stateright::{Model, Property};

use crate::sql_session::{GrantRow, View, client_name};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PgSessionVariant {
    /// Shipped: as described in the module documentation.
    Shipped,
    /// Rejected: the takeover trusts its snapshot that the holder's session
    /// lapsed, and counts the removal with `SET removed = removed + 1 WHERE
    /// id = ..` (it still waits for the row's lock, but does not re-check the
    /// expiry on the latest version).
    SnapshotTakeover,
    /// Rejected: the renewal returns the session's rows from its own
    /// snapshot with the count (one statement, no second read): the count
    /// comes from the row's latest version, the rows from before it.
    RowsFromRenewalSnapshot,
    /// Rejected: the client counts its session's life from the renewal's
    /// reply (its commit) rather than its send, so its own count, by which
    /// a lean acquire grants without reading the session row, runs past the
    /// server's expiry.
    LeanCountedFromReply,
}

/// Name of the mutual-exclusion property.
pub const MUTUAL_EXCLUSION: &str = "no two clients hold live views of one key at once";
/// Name of the renewal property.
pub const RENEWAL_TELLS_THE_TRUTH: &str = "a renewal confirms only a lease whose grant row is the holder's";
/// Reachability: a key taken over from a lapsed session, then held.
pub const TAKEOVER_HAPPENS: &str = "a key is taken over from a lapsed session";
/// Reachability: an acquire took the lean path (its client's own count
/// showed two thirds of the TTL left on its session).
pub const LEAN_ACQUIRE_HAPPENS: &str = "an acquire grants on the client's own count of its session";
/// Reachability: a renewal found the count moved and read the rows.
pub const ROWS_ARE_READ: &str = "a renewal finds the removed count moved and reads the rows";

/// The model and its configuration.
#[derive(Clone, Debug)]
pub struct PgSessionModel {
    /// Which design.
    pub variant: PgSessionVariant,
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

impl PgSessionModel {
    /// Two clients, one key, two grants each, TTL 2, time 3 to 6.
    pub fn new(variant: PgSessionVariant) -> Self {
        PgSessionModel { variant, clients: 2, keys: 1, grants: 2, ttl: 2, horizon: 6 }
    }

    fn session_mut(s: &mut PgSessionState, c: u8, incarnation: u8) -> Option<&mut SessionRow> {
        let i = usize::from(incarnation.checked_sub(1)?);
        s.sessions[usize::from(c)].get_mut(i)?.as_mut()
    }

    fn live(row: Option<SessionRow>, clock: u8) -> bool {
        row.is_some_and(|r| r.expires > clock)
    }

    /// The acquire's snapshot.
    fn acquire_start(&self, s: &mut PgSessionState, c: u8, k: u8) {
        let row = s.grants[usize::from(k)];
        let holder_live = row.is_some_and(|r| Self::live(s.session(r.client, r.incarnation), s.clock));
        let client = &s.clients[usize::from(c)];
        let lean = client.incarnation > 0 && client.known > s.real && (client.known - s.real) * 3 >= self.ttl * 2;
        let own = if lean { None } else { s.session(c, client.incarnation) };
        let client = &mut s.clients[usize::from(c)];
        client.acquiring = Some(Acquiring { key: k, row, holder_live, own, lean, real: s.real, clock: s.clock });
        client.grants += 1;
    }

    /// Whether the acquire's writes would wait for a row lock now.
    fn acquire_waits(&self, s: &PgSessionState, c: u8, a: &Acquiring) -> bool {
        let takeover_waits = a.row.is_some_and(|r| !a.holder_live && s.locked(r.client, r.incarnation));
        let extends = a.own.is_some_and(|o| o.expires > a.clock && (o.expires - a.clock) * 3 < self.ttl * 2);
        takeover_waits || (extends && s.locked(c, s.clients[usize::from(c)].incarnation))
    }

    /// The acquire's writes and commit.
    fn acquire_write(&self, s: &mut PgSessionState, c: u8) {
        let ci = usize::from(c);
        let Some(a) = s.clients[ci].acquiring.take() else { return };
        let ki = usize::from(a.key);
        if a.holder_live || s.grants[ki] != a.row {
            // Busy, or the row changed since the snapshot (the client runs
            // the statement again later).
            return;
        }
        if let Some(holder) = a.row {
            let latest = s.session(holder.client, holder.incarnation);
            if self.variant == PgSessionVariant::Shipped && Self::live(latest, s.clock) {
                return; // renewed since the snapshot: not taken over
            }
            if let Some(r) = Self::session_mut(s, holder.client, holder.incarnation) {
                r.removed += 1;
            }
            s.took_over = true;
        }
        let current = s.clients[ci].incarnation;
        let clock = s.clock;
        let bound = match a.own {
            _ if a.lean => Some((current, s.clients[ci].known)),
            Some(o) if o.expires > a.clock && (o.expires - a.clock) * 3 >= self.ttl * 2 => {
                Some((current, a.real + (o.expires - a.clock)))
            }
            Some(o) if o.expires > a.clock => match Self::session_mut(s, c, current) {
                Some(r) if r.expires > clock => {
                    r.expires = r.expires.max(clock + self.ttl);
                    s.clients[ci].known = a.real + self.ttl;
                    Some((current, a.real + self.ttl))
                }
                _ => None,
            },
            _ => None,
        };
        let (incarnation, until) = bound.unwrap_or_else(|| {
            let incarnation = current + 1;
            s.sessions[ci][usize::from(incarnation - 1)] = Some(SessionRow { expires: clock + self.ttl, removed: 0 });
            s.clients[ci].incarnation = incarnation;
            s.clients[ci].known = a.real + self.ttl;
            (incarnation, a.real + self.ttl)
        });
        s.grants[ki] = Some(GrantRow { client: c, incarnation });
        s.clients[ci].views[ki] = Some(View { incarnation, until, revoked: false });
    }

    /// Confirms the client's leases of `incarnation` that `present` keeps,
    /// forgets the others, after a renewal sent at `sent`.
    fn settle(&self, s: &mut PgSessionState, c: u8, incarnation: u8, sent: u8, present: &[bool]) {
        let ci = usize::from(c);
        for (k, &kept) in present.iter().enumerate().take(usize::from(self.keys)) {
            let Some(view) = s.clients[ci].views[k] else { continue };
            if view.incarnation != incarnation {
                continue;
            }
            if !kept {
                s.clients[ci].views[k] = None;
                continue;
            }
            if s.grants[k] != Some(GrantRow { client: c, incarnation }) {
                s.confirmed_a_gone_lease = true;
            }
            // A confirmed renewal makes the client a holder again whatever
            // happened to the row (`revoked` cleared): the bug the
            // properties catch.
            let until = view.until.max(sent + self.ttl);
            s.clients[ci].views[k] = Some(View { until, revoked: false, ..view });
        }
    }

    fn rows_of(s: &PgSessionState, c: u8, incarnation: u8) -> Vec<bool> {
        s.grants.iter().map(|g| *g == Some(GrantRow { client: c, incarnation })).collect()
    }

    fn renew_step(&self, s: &mut PgSessionState, c: u8) {
        let ci = usize::from(c);
        let Some(renewal) = s.clients[ci].renewal.clone() else { return };
        let inc = renewal.incarnation;
        match renewal.step {
            RenewalStep::Sent if self.variant == PgSessionVariant::RowsFromRenewalSnapshot => {
                let snapshot_rows = Self::rows_of(s, c, inc);
                s.clients[ci].renewal = Some(Renewal { step: RenewalStep::Started { snapshot_rows }, ..renewal });
            }
            RenewalStep::Sent | RenewalStep::Started { .. } => {
                let snapshot_rows = match renewal.step {
                    RenewalStep::Started { snapshot_rows } => snapshot_rows,
                    _ => Vec::new(),
                };
                let clock = s.clock;
                let ttl = self.ttl;
                let row = s
                    .session(c, inc)
                    .filter(|r| r.expires > clock)
                    .map(|r| SessionRow { expires: r.expires.max(clock + ttl), ..r });
                s.clients[ci].renewal = Some(Renewal { step: RenewalStep::Written { snapshot_rows, row }, ..renewal });
            }
            RenewalStep::Written { snapshot_rows, row } => {
                s.clients[ci].renewal = None;
                let Some(row) = row else {
                    // The session lapsed: every lease of it is lost.
                    self.settle(s, c, inc, renewal.sent, &vec![false; usize::from(self.keys)]);
                    return;
                };
                if let Some(r) = Self::session_mut(s, c, inc) {
                    *r = row;
                }
                if s.clients[ci].incarnation == inc {
                    let from =
                        if self.variant == PgSessionVariant::LeanCountedFromReply { s.real } else { renewal.sent };
                    s.clients[ci].known = s.clients[ci].known.max(from + self.ttl);
                }
                let seen = &mut s.clients[ci].seen_removed[usize::from(inc - 1)];
                if row.removed == *seen {
                    self.settle(s, c, inc, renewal.sent, &vec![true; usize::from(self.keys)]);
                } else if self.variant == PgSessionVariant::RowsFromRenewalSnapshot {
                    *seen = row.removed;
                    self.settle(s, c, inc, renewal.sent, &snapshot_rows);
                } else {
                    let step = RenewalStep::ReadingRows { removed: row.removed };
                    s.clients[ci].renewal = Some(Renewal { step, ..renewal });
                }
            }
            RenewalStep::ReadingRows { removed } => {
                s.clients[ci].renewal = None;
                s.clients[ci].seen_removed[usize::from(inc - 1)] = removed;
                let present = Self::rows_of(s, c, inc);
                self.settle(s, c, inc, renewal.sent, &present);
            }
        }
    }

    fn release(s: &mut PgSessionState, c: u8, k: u8) {
        let (ci, ki) = (usize::from(c), usize::from(k));
        let Some(view) = s.clients[ci].views[ki].take() else { return };
        if s.grants[ki] == Some(GrantRow { client: c, incarnation: view.incarnation }) {
            s.grants[ki] = None;
        }
    }

    fn force_release(s: &mut PgSessionState, k: u8) {
        let ki = usize::from(k);
        if let Some(row) = s.grants[ki].take() {
            if let Some(v) = s.clients[usize::from(row.client)].views[ki].as_mut()
                && v.incarnation == row.incarnation
            {
                v.revoked = true;
            }
            if let Some(r) = Self::session_mut(s, row.client, row.incarnation) {
                r.removed += 1;
            }
        }
        s.forced = true;
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PgSessionAction {
    /// A client's acquire statement of a key starts (its snapshot).
    AcquireStart(u8, u8),
    /// The acquire statement writes and commits (waits while a row it
    /// writes is locked).
    AcquireWrite(u8),
    /// A client sends the renewal of its session incarnation.
    SendRenewal(u8, u8),
    /// The renewal statement takes its next step.
    Renew(u8),
    /// A client releases its lease of a key.
    Release(u8, u8),
    /// An operator frees a key whatever its holder (once per run).
    ForceRelease(u8),
    /// A client crashes: its uncommitted statements roll back, it forgets
    /// its leases and does nothing more.
    Crash(u8),
    /// Real time and the server clock move one tick.
    Tick,
    /// The server clock steps back by this many ticks (once).
    StepBack(u8),
}

impl fmt::Display for PgSessionAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AcquireStart(c, k) => write!(f, "{}'s acquire of K{k} takes its snapshot", client_name(*c)),
            Self::AcquireWrite(c) => write!(f, "{}'s acquire writes and commits", client_name(*c)),
            Self::SendRenewal(c, i) => {
                write!(f, "{} sends the renewal of session {}{i}", client_name(*c), client_name(*c))
            }
            Self::Renew(c) => write!(f, "{}'s renewal takes its next step", client_name(*c)),
            Self::Release(c, k) => write!(f, "{} releases K{k}", client_name(*c)),
            Self::ForceRelease(k) => write!(f, "an operator frees K{k}"),
            Self::Crash(c) => write!(f, "{} crashes", client_name(*c)),
            Self::Tick => write!(f, "time passes"),
            Self::StepBack(n) => write!(f, "the server clock steps back {n}"),
        }
    }
}

impl Model for PgSessionModel {
    type State = PgSessionState;
    type Action = PgSessionAction;

    fn init_states(&self) -> Vec<PgSessionState> {
        let keys = usize::from(self.keys);
        let grants = usize::from(self.grants);
        let client = Client {
            incarnation: 0,
            known: 0,
            seen_removed: vec![0; grants],
            views: vec![None; keys],
            grants: 0,
            renewal: None,
            acquiring: None,
            crashed: false,
        };
        vec![PgSessionState {
            real: 3,
            clock: 3,
            stepped_back: false,
            forced: false,
            sessions: vec![vec![None; grants]; usize::from(self.clients)],
            grants: vec![None; keys],
            clients: vec![client; usize::from(self.clients)],
            took_over: false,
            confirmed_a_gone_lease: false,
        }]
    }

    fn actions(&self, s: &PgSessionState, actions: &mut Vec<PgSessionAction>) {
        for c in 0..self.clients {
            let client = &s.clients[usize::from(c)];
            if client.crashed {
                continue;
            }
            match &client.acquiring {
                Some(a) if !self.acquire_waits(s, c, a) => actions.push(PgSessionAction::AcquireWrite(c)),
                Some(_) => {}
                None if client.grants < self.grants => {
                    for k in 0..self.keys {
                        if client.views[usize::from(k)].is_none() {
                            actions.push(PgSessionAction::AcquireStart(c, k));
                        }
                    }
                }
                None => {}
            }
            if client.renewal.is_some() {
                actions.push(PgSessionAction::Renew(c));
            } else {
                // Renewal is sent while a view of the incarnation lives
                // (after that, `lost()` has fired and the client only releases).
                let mut incarnations: Vec<u8> =
                    client.views.iter().flatten().filter(|v| v.until > s.real).map(|v| v.incarnation).collect();
                incarnations.sort_unstable();
                incarnations.dedup();
                actions.extend(incarnations.into_iter().map(|i| PgSessionAction::SendRenewal(c, i)));
            }
            for k in 0..self.keys {
                if client.views[usize::from(k)].is_some() {
                    actions.push(PgSessionAction::Release(c, k));
                }
            }
            actions.push(PgSessionAction::Crash(c));
        }
        if !s.forced {
            for k in 0..self.keys {
                if let Some(row) = s.grants[usize::from(k)]
                    && !s.locked(row.client, row.incarnation)
                {
                    actions.push(PgSessionAction::ForceRelease(k));
                }
            }
        }
        if s.real < self.horizon {
            actions.push(PgSessionAction::Tick);
        }
        if !s.stepped_back {
            for back in 1..=self.ttl.min(s.clock) {
                actions.push(PgSessionAction::StepBack(back));
            }
        }
    }

    fn next_state(&self, s: &PgSessionState, action: PgSessionAction) -> Option<PgSessionState> {
        let mut next = s.clone();
        match action {
            PgSessionAction::AcquireStart(c, k) => self.acquire_start(&mut next, c, k),
            PgSessionAction::AcquireWrite(c) => self.acquire_write(&mut next, c),
            PgSessionAction::SendRenewal(c, i) => {
                next.clients[usize::from(c)].renewal =
                    Some(Renewal { incarnation: i, sent: s.real, step: RenewalStep::Sent });
            }
            PgSessionAction::Renew(c) => self.renew_step(&mut next, c),
            PgSessionAction::Release(c, k) => Self::release(&mut next, c, k),
            PgSessionAction::ForceRelease(k) => Self::force_release(&mut next, k),
            PgSessionAction::Crash(c) => {
                let client = &mut next.clients[usize::from(c)];
                client.views.iter_mut().for_each(|v| *v = None);
                client.renewal = None;
                client.acquiring = None;
                client.crashed = true;
            }
            PgSessionAction::Tick => {
                next.real += 1;
                next.clock += 1;
            }
            PgSessionAction::StepBack(n) => {
                next.clock -= n;
                next.stepped_back = true;
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(MUTUAL_EXCLUSION, |_, s: &PgSessionState| !s.two_live_views()),
            Property::always(RENEWAL_TELLS_THE_TRUTH, |_, s: &PgSessionState| !s.confirmed_a_gone_lease),
            Property::sometimes(TAKEOVER_HAPPENS, |_, s: &PgSessionState| {
                s.took_over && s.clients.iter().any(|c| c.views.iter().flatten().any(|v| v.until > s.real))
            }),
            Property::sometimes(LEAN_ACQUIRE_HAPPENS, |_, s: &PgSessionState| {
                s.clients.iter().any(|c| c.acquiring.is_some_and(|a| a.lean && !a.holder_live))
            }),
            Property::sometimes(ROWS_ARE_READ, |_, s: &PgSessionState| {
                s.clients
                    .iter()
                    .any(|c| c.renewal.as_ref().is_some_and(|r| matches!(r.step, RenewalStep::ReadingRows { .. })))
            }),
        ]
    }
}
