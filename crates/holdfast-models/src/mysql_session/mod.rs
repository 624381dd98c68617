//! Model 11: MySQL/MariaDB leases that live with their client's session row
//! (issue 33, item 4), under InnoDB's `READ COMMITTED`, against the variants
//! weighed.
//!
//! The layout is model 9's ([`sql_session`](crate::sql_session)) and model
//! 10's ([`pg_session`](crate::pg_session)): a lease row is held while its
//! session row is unexpired on the server clock; renewal extends that row
//! alone; a lapsed session is never extended again by design (a clock step
//! may make it look live); removals of another client's row are counted in
//! its session. What InnoDB's `READ COMMITTED` does to a statement, each a
//! step here where it matters:
//!
//! - a plain `SELECT` is a **consistent read** of a snapshot taken when the
//!   statement starts: nothing uncommitted, nothing committed later;
//! - a locking read (`SELECT .. FOR UPDATE`), an `UPDATE` and a `DELETE`
//!   read each row's **latest committed version** and lock it, **waiting**
//!   while another open transaction holds the lock (unlike PostgreSQL, no
//!   snapshot of the other tables: every row it locks is read latest);
//! - writes are seen at **commit**; row locks are held until commit or
//!   rollback; an autocommit statement commits at its end; a crashed
//!   client's open transaction rolls back. Lease row before session row
//!   everywhere, so no deadlock;
//! - `now()` (`UTC_TIMESTAMP(6)`) is the **statement's start**, which may
//!   come long before the statement gets its row lock: the renewal's and
//!   the extension's `now()` is the server clock at their send (the earliest
//!   start: the worst case for the expiry they write) or at the step that
//!   runs them (the latest); the takeover's count reads it at its step (the
//!   worst case for `expires_at <= now()`).
//!
//! The client counts its session from the **send** of the statement that
//! made or last extended it (a lower bound on the server's expiry in real
//! time, which a clock step back only moves later). The shipped statements:
//!
//! - **session choice**: with two thirds of the TTL left by its count, the
//!   grant uses the session as it is (lean path); with less, an autocommit
//!   `UPDATE .. SET expires_at = GREATEST(expires_at, now + ttl) WHERE id =
//!   S AND expires_at > now()` (0 rows: a new session); lapsed by its count,
//!   a new session (`INSERT`);
//! - **grant**: one autocommit `UPDATE` of the lease row, taking it only if
//!   released (or the client's own); a row of another session is left;
//! - **takeover**, after a consistent read showed the row's session lapsed:
//!   `SELECT .. FOR UPDATE` of the lease row (roll back if it is not the row
//!   seen), `UPDATE sess SET removed = removed + 1 WHERE id = S' AND
//!   expires_at <= now()` (waits for a renewal in flight, re-checks the lapse
//!   on the latest version), and on 1 row the lease row's `UPDATE`, COMMIT;
//! - **renewal**: a transaction `UPDATE sess SET expires_at =
//!   GREATEST(expires_at, now + ttl) WHERE id = S AND expires_at > now()`
//!   (`GREATEST`: an extension may write between its start and its write),
//!   `SELECT removed` of that locked row, COMMIT; a moved count then reads
//!   `SELECT token FROM leases WHERE session = S` after the commit;
//! - **release** of its own row; **forced release** (lock the lease row,
//!   count in its session, waiting for a renewal in flight, release).
//!
//! The fence is not modelled (per-key fences: model `mysql_fence`,
//! unchanged). One acquire and one renewal of each client are in flight at a
//! time. Steps that only lock and write one row whose outcome nothing else
//! can change meanwhile are one step each (see the README, Model 11).

mod state;

pub use state::{AcquireStep, Acquiring, Client, MySessionAction, MySessionState, Renewal, RenewalStep, SessionRow};

use state::ahead;

use stateright::{Model, Property};

use crate::sql_session::{GrantRow, View};

/// The designs the model compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MySessionVariant {
    /// Shipped: as described in the module documentation.
    Shipped,
    /// Rejected: the takeover trusts the consistent read that the session
    /// lapsed and counts with `UPDATE sess SET removed = removed + 1 WHERE
    /// id = S'` (it still waits for the row's lock, but does not re-check the
    /// expiry on the latest version).
    ConsistentReadTakeover,
    /// Rejected: the renewal reads `removed` by a consistent read before its
    /// `UPDATE` of the session row (in the transaction or before it), and
    /// goes by that count.
    CountBeforeRenew,
    /// Rejected: the client counts its session from the reply of the
    /// statement that made or extended it (an acquire's, or a renewal's
    /// commit), not from its send, so the count by which the lean path
    /// grants runs past the server's expiry.
    LeanFromReceipt,
    /// Rejected: the grant is one autocommit `UPDATE` that also takes a row
    /// whose session a non-locking subquery (`(SELECT expires_at FROM sess
    /// WHERE id = leases.session) <= now()`, a consistent read) shows
    /// lapsed, counting nothing.
    SubqueryTakeover,
    /// Rejected: the takeover re-checks the lapse on the session row's
    /// latest version under its lock (`SELECT expires_at .. FOR UPDATE`) but
    /// counts nothing (the session lapsed, so why count?).
    RecheckWithoutCount,
    /// Rejected (the proposal's renewal): `SET expires_at = now + ttl`
    /// without `GREATEST`: a renewal whose statement started before an
    /// acquire's extension and writes after it lowers the row below the
    /// extension's count.
    RenewWithoutGreatest,
    /// Weighed: the renewal's `UPDATE` has no `expires_at > now()`, so it
    /// extends a lapsed session too (the count is still read after it).
    RenewWithoutRecheck,
    /// Weighed: the acquire's extension sets `expires_at = now + ttl`
    /// without `GREATEST`, so after a clock step back it may lower the row.
    ExtendWithoutGreatest,
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
pub struct MySessionModel {
    /// Which design.
    pub variant: MySessionVariant,
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

impl MySessionModel {
    /// Two clients, one key, two grants each, TTL 2, time 3 to 6.
    pub fn new(variant: MySessionVariant) -> Self {
        MySessionModel { variant, clients: 2, keys: 1, grants: 2, ttl: 2, horizon: 6 }
    }

    /// An `INSERT` of a new session incarnation (send and run are one step:
    /// the new row is no one else's business until a lease row names it,
    /// and a later run only makes its expiry later than the client counts).
    fn new_session(&self, s: &mut MySessionState, c: u8) -> u8 {
        let ci = usize::from(c);
        let incarnation = s.clients[ci].incarnation + 1;
        s.sessions[ci][usize::from(incarnation - 1)] = Some(SessionRow { expires: s.clock + self.ttl, removed: 0 });
        s.clients[ci].incarnation = incarnation;
        s.clients[ci].known = s.real + self.ttl;
        incarnation
    }

    /// The client chooses its session from its own count and sends the
    /// first statement.
    fn acquire_start(&self, s: &mut MySessionState, c: u8, k: u8) {
        let ci = usize::from(c);
        let (known, current) = (s.clients[ci].known, s.clients[ci].incarnation);
        let fresh = self.variant == MySessionVariant::LeanFromReceipt;
        let a = if known > s.real && (known - s.real) * 3 >= self.ttl * 2 {
            Acquiring {
                key: k,
                step: AcquireStep::Granting,
                incarnation: current,
                until: known,
                fresh: false,
                lean: true,
            }
        } else if known > s.real {
            let step = AcquireStep::Extending { sent: s.real, now: s.clock };
            Acquiring { key: k, step, incarnation: current, until: 0, fresh: false, lean: false }
        } else {
            let incarnation = self.new_session(s, c);
            let until = s.real + self.ttl;
            Acquiring { key: k, step: AcquireStep::Granting, incarnation, until, fresh, lean: false }
        };
        s.clients[ci].acquiring = Some(a);
        s.clients[ci].grants += 1;
    }

    /// Whether the acquire's next statement waits for a row lock now.
    fn acquire_waits(s: &MySessionState, c: u8, a: &Acquiring) -> bool {
        match a.step {
            AcquireStep::Extending { .. } => s.session_locked(c, a.incarnation),
            AcquireStep::Granting | AcquireStep::Locking { .. } => s.lease_locked(a.key, Some(c)),
            AcquireStep::Reading => false,
            AcquireStep::Counting { seen } => s.session_locked(seen.client, seen.incarnation),
        }
    }

    /// The client holds `key` under `a`'s session (the grant committed).
    fn granted(s: &mut MySessionState, c: u8, a: &Acquiring) {
        let ki = usize::from(a.key);
        s.grants[ki] = Some(GrantRow { client: c, incarnation: a.incarnation });
        let until = ahead(a.until, s.real);
        s.clients[usize::from(c)].views[ki] = Some(View { incarnation: a.incarnation, until, revoked: false });
    }

    /// The acquire's next statement runs (it does not wait: see `actions`).
    fn acquire_step(&self, s: &mut MySessionState, c: u8, late: bool) {
        let ci = usize::from(c);
        let Some(mut a) = s.clients[ci].acquiring.take() else { return };
        let ki = usize::from(a.key);
        match a.step {
            AcquireStep::Extending { sent, now } => {
                let clock = if late { s.clock } else { now };
                let ttl = self.ttl;
                match s.session_mut(c, a.incarnation) {
                    Some(r) if r.expires > clock => {
                        r.expires = match self.variant {
                            MySessionVariant::ExtendWithoutGreatest => clock + ttl,
                            _ => r.expires.max(clock + ttl),
                        };
                        let client = &mut s.clients[ci];
                        client.known = ahead(client.known.max(sent + ttl), s.real);
                        a.until = ahead(sent + ttl, s.real);
                    }
                    // 0 rows: lapsed on the server; the client sends the
                    // INSERT of a new incarnation at once.
                    _ => {
                        a.incarnation = self.new_session(s, c);
                        a.until = s.real + ttl;
                    }
                }
                a.fresh = self.variant == MySessionVariant::LeanFromReceipt;
                a.step = AcquireStep::Granting;
                s.clients[ci].acquiring = Some(a);
            }
            AcquireStep::Granting => {
                if a.fresh {
                    // LeanFromReceipt: the reply came now, and the client
                    // counts the session from it.
                    a.until = s.real + self.ttl;
                    a.fresh = false;
                    if s.clients[ci].incarnation == a.incarnation {
                        s.clients[ci].known = a.until;
                    }
                }
                let row = s.grants[ki];
                let lapsed = row.is_some_and(|r| !s.live(r.client, r.incarnation));
                if row.is_none() || row == Some(GrantRow { client: c, incarnation: a.incarnation }) {
                    Self::granted(s, c, &a);
                } else if lapsed && self.variant == MySessionVariant::SubqueryTakeover {
                    // The subquery read the committed session row (not a
                    // renewal's uncommitted write, and without its lock).
                    Self::granted(s, c, &a);
                    s.took_over = true;
                } else {
                    // (`lean` only marks the lean grant for reachability.)
                    a.step = AcquireStep::Reading;
                    a.lean = false;
                    s.clients[ci].acquiring = Some(a);
                }
            }
            AcquireStep::Reading => {
                // A consistent read of the committed lease row and its
                // session; a row freed meanwhile ends the attempt (busy: the
                // client tries again with a new acquire).
                if let Some(seen) = s.grants[ki]
                    && !s.live(seen.client, seen.incarnation)
                {
                    a.step = AcquireStep::Locking { seen };
                    s.clients[ci].acquiring = Some(a);
                }
            }
            AcquireStep::Locking { seen } => {
                if s.grants[ki] == Some(seen) {
                    a.step = AcquireStep::Counting { seen };
                    s.clients[ci].acquiring = Some(a);
                } // else: not the row seen: ROLLBACK, busy.
            }
            AcquireStep::Counting { seen } => {
                let lapsed = !s.live(seen.client, seen.incarnation);
                if lapsed || self.variant == MySessionVariant::ConsistentReadTakeover {
                    if let Some(r) = s.session_mut(seen.client, seen.incarnation)
                        && self.variant != MySessionVariant::RecheckWithoutCount
                    {
                        r.removed += 1;
                    }
                    Self::granted(s, c, &a);
                    s.took_over = true;
                } // else: 0 rows, renewed meanwhile: ROLLBACK, busy.
            }
        }
    }

    fn renew_step(&self, s: &mut MySessionState, c: u8, late: bool) {
        let ci = usize::from(c);
        let Some(mut renewal) = s.clients[ci].renewal.take() else { return };
        let inc = renewal.incarnation;
        let keys = usize::from(self.keys);
        match renewal.step {
            RenewalStep::Sent if self.variant == MySessionVariant::CountBeforeRenew => {
                let removed = s.session(c, inc).map_or(0, |r| r.removed);
                renewal.step = RenewalStep::CountRead { removed };
                s.clients[ci].renewal = Some(renewal);
            }
            RenewalStep::Sent | RenewalStep::CountRead { .. } => {
                // The UPDATE locks the session row and re-checks it on its
                // latest version; the SELECT of `removed` reads that locked
                // row, so nothing can come between the two.
                let recheck = self.variant != MySessionVariant::RenewWithoutRecheck;
                let now = if late { s.clock } else { renewal.now };
                let Some(row) = s.session(c, inc).filter(|r| r.expires > now || !recheck) else {
                    // 0 rows: the session lapsed, every lease of it is lost.
                    s.settle(self.ttl, c, inc, renewal.sent, &vec![false; keys]);
                    if s.clients[ci].incarnation == inc {
                        s.clients[ci].known = 0;
                    }
                    return;
                };
                let removed = match renewal.step {
                    RenewalStep::CountRead { removed } => removed,
                    _ => row.removed,
                };
                // GREATEST: the statement's now() may be older than a later
                // statement's that wrote the row first (an acquire's
                // extension), whose count must stand.
                let expires = match self.variant {
                    MySessionVariant::RenewWithoutGreatest => now + self.ttl,
                    _ => row.expires.max(now + self.ttl),
                };
                renewal.step = RenewalStep::Written { expires, removed };
                renewal.now = 0; // read by nothing from now on
                s.clients[ci].renewal = Some(renewal);
            }
            RenewalStep::Written { expires, removed } => {
                if let Some(r) = s.session_mut(c, inc) {
                    r.expires = expires;
                }
                let client = &mut s.clients[ci];
                if client.incarnation == inc {
                    // LeanFromReceipt counts the session from the commit's
                    // reply (now); its leases still count from the send.
                    let from = if self.variant == MySessionVariant::LeanFromReceipt { s.real } else { renewal.sent };
                    client.known = ahead(client.known.max(from + self.ttl), s.real);
                }
                if removed == client.seen_removed[usize::from(inc - 1)] {
                    s.settle(self.ttl, c, inc, renewal.sent, &vec![true; keys]);
                } else {
                    renewal.step = RenewalStep::ReadingRows { removed };
                    s.clients[ci].renewal = Some(renewal);
                }
            }
            RenewalStep::ReadingRows { removed } => {
                s.clients[ci].seen_removed[usize::from(inc - 1)] = removed;
                let present = s.rows_of(c, inc);
                s.settle(self.ttl, c, inc, renewal.sent, &present);
            }
        }
    }
}

impl Model for MySessionModel {
    type State = MySessionState;
    type Action = MySessionAction;

    fn init_states(&self) -> Vec<MySessionState> {
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
        vec![MySessionState {
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

    fn actions(&self, s: &MySessionState, actions: &mut Vec<MySessionAction>) {
        for c in 0..self.clients {
            let client = &s.clients[usize::from(c)];
            if client.crashed {
                continue;
            }
            match &client.acquiring {
                Some(a) if !Self::acquire_waits(s, c, a) => {
                    actions.push(MySessionAction::Acquire(c));
                    if matches!(a.step, AcquireStep::Extending { now, .. } if now != s.clock) {
                        actions.push(MySessionAction::AcquireLate(c));
                    }
                }
                Some(_) => {}
                None if client.grants < self.grants => {
                    for k in 0..self.keys {
                        if client.views[usize::from(k)].is_none() {
                            actions.push(MySessionAction::AcquireStart(c, k));
                        }
                    }
                }
                None => {}
            }
            // Only a renewal locks a session row across steps (its own), so
            // a renewal never waits.
            if client.renewal.is_some() {
                actions.push(MySessionAction::Renew(c));
                if client.renewal.is_some_and(|r| r.now != s.clock && matches!(r.step, RenewalStep::Sent)) {
                    actions.push(MySessionAction::RenewLate(c));
                }
            } else {
                // Renewal is sent while a view of the incarnation lives
                // (after that, `lost()` has fired and the client only releases).
                let mut incarnations: Vec<u8> =
                    client.views.iter().flatten().filter(|v| v.until > s.real).map(|v| v.incarnation).collect();
                incarnations.sort_unstable();
                incarnations.dedup();
                actions.extend(incarnations.into_iter().map(|i| MySessionAction::SendRenewal(c, i)));
            }
            for k in 0..self.keys {
                if client.views[usize::from(k)].is_some() && !s.lease_locked(k, Some(c)) {
                    actions.push(MySessionAction::Release(c, k));
                }
            }
            actions.push(MySessionAction::Crash(c));
        }
        if !s.forced {
            for k in 0..self.keys {
                if let Some(row) = s.grants[usize::from(k)]
                    && !s.lease_locked(k, None)
                    && !s.session_locked(row.client, row.incarnation)
                {
                    actions.push(MySessionAction::ForceRelease(k));
                }
            }
        }
        if s.real < self.horizon {
            actions.push(MySessionAction::Tick);
        }
        if !s.stepped_back {
            for back in 1..=self.ttl.min(s.clock) {
                actions.push(MySessionAction::StepBack(back));
            }
        }
    }

    fn next_state(&self, s: &MySessionState, action: MySessionAction) -> Option<MySessionState> {
        let mut next = s.clone();
        match action {
            MySessionAction::AcquireStart(c, k) => self.acquire_start(&mut next, c, k),
            MySessionAction::Acquire(c) => self.acquire_step(&mut next, c, false),
            MySessionAction::AcquireLate(c) => self.acquire_step(&mut next, c, true),
            MySessionAction::SendRenewal(c, i) => {
                next.clients[usize::from(c)].renewal =
                    Some(Renewal { incarnation: i, sent: s.real, now: s.clock, step: RenewalStep::Sent });
            }
            MySessionAction::Renew(c) => self.renew_step(&mut next, c, false),
            MySessionAction::RenewLate(c) => self.renew_step(&mut next, c, true),
            MySessionAction::Release(c, k) => next.release(c, k),
            MySessionAction::ForceRelease(k) => next.force_release(k),
            MySessionAction::Crash(c) => {
                let client = &mut next.clients[usize::from(c)];
                client.views.iter_mut().for_each(|v| *v = None);
                client.renewal = None;
                client.acquiring = None;
                client.crashed = true;
            }
            MySessionAction::Tick => next.tick(self.ttl),
            MySessionAction::StepBack(n) => {
                next.clock -= n;
                next.stepped_back = true;
            }
        }
        next.normalize();
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(MUTUAL_EXCLUSION, |_, s: &MySessionState| !s.two_live_views()),
            Property::always(RENEWAL_TELLS_THE_TRUTH, |_, s: &MySessionState| !s.confirmed_a_gone_lease),
            Property::sometimes(TAKEOVER_HAPPENS, |_, s: &MySessionState| {
                s.took_over && s.clients.iter().any(|c| c.views.iter().flatten().any(|v| v.until > s.real))
            }),
            Property::sometimes(LEAN_ACQUIRE_HAPPENS, |_, s: &MySessionState| {
                s.clients.iter().any(|c| c.acquiring.is_some_and(|a| a.lean))
            }),
            Property::sometimes(ROWS_ARE_READ, |_, s: &MySessionState| {
                s.clients.iter().any(|c| c.renewal.is_some_and(|r| matches!(r.step, RenewalStep::ReadingRows { .. })))
            }),
        ]
    }
}
