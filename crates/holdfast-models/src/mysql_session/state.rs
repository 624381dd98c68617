//! What the MySQL session model remembers: the server clock, the committed
//! session and lease rows, the statements and transactions in flight (with
//! the row locks they hold), and each client's count of its session and
//! view of its leases.

use std::fmt;

pub use crate::sql_session::{GrantRow, View, client_name};

/// `t` if it is after `real`, else 0 (a count that passed: all alike).
pub(super) fn ahead(t: u8, real: u8) -> u8 {
    if t > real { t } else { 0 }
}

/// One session row (`<leases>_sess`): an incarnation of a client's session,
/// under an id of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionRow {
    /// The end of the session on the server clock (`expires_at`).
    pub expires: u8,
    /// How many of its leases others removed (a forced release, a takeover).
    pub removed: u8,
}

/// Where a client's acquire is. Each step is one statement reaching the
/// server; time passes and the clock may step between any two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AcquireStep {
    /// The session's extension (`UPDATE .. SET expires_at = GREATEST(..)
    /// WHERE id = S AND expires_at > now()`, autocommit) was sent at this
    /// real time and has not run.
    Extending {
        /// Real time of the send, from which the client counts.
        sent: u8,
        /// The server clock then: the statement's `now()` is its start,
        /// which may come long before it gets the row's lock (or the step
        /// that runs it reads the clock: the two ends of its start).
        now: u8,
    },
    /// The grant's autocommit `UPDATE` of the lease row is on its way (it
    /// locks the row, reading its latest version).
    Granting,
    /// The grant found the row held by another session: a plain `SELECT`
    /// (a consistent read of the lease row and its session) is on its way.
    Reading,
    /// The consistent read showed the row's session lapsed: the takeover
    /// transaction's `SELECT .. FOR UPDATE` of the lease row is on its way.
    Locking {
        /// The lease row the consistent read saw.
        seen: GrantRow,
    },
    /// The takeover holds the lease row's lock (the row was still `seen`);
    /// its count of the removal in `seen`'s session is on its way.
    Counting {
        /// The lease row, locked.
        seen: GrantRow,
    },
}

/// A client's acquire in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Acquiring {
    /// The key.
    pub key: u8,
    /// How far it got.
    pub step: AcquireStep,
    /// The session incarnation the grant will name (meaningless while
    /// `Extending`: the extension may fail and make a new one).
    pub incarnation: u8,
    /// The real time until which the client will count the lease (the
    /// session's count; 0 while `Extending`, or once it passed).
    pub until: u8,
    /// `LeanFromReceipt` only: this acquire made or extended the session,
    /// and the client counts it from the reply, which the next step is.
    pub fresh: bool,
    /// The lean path: the client's own count showed two thirds of the TTL
    /// left, so the grant names the session and touches nothing of it.
    pub lean: bool,
}

/// Where a client's renewal transaction is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RenewalStep {
    /// Sent; nothing has run.
    Sent,
    /// `CountBeforeRenew` only: a consistent read returned this `removed`
    /// before the session row's `UPDATE`.
    CountRead {
        /// The count read.
        removed: u8,
    },
    /// The `UPDATE` locked the session row, re-checked it unexpired on its
    /// latest version and wrote this expiry (not committed: others still
    /// read the old version, and a writer of the row waits); `removed` is
    /// the count the renewal goes by.
    Written {
        /// The expiry written.
        expires: u8,
        /// The count the renewal learned.
        removed: u8,
    },
    /// Committed with a moved count: a consistent read of `SELECT token
    /// FROM leases WHERE session = S` is on its way.
    ReadingRows {
        /// The count the renewal learned.
        removed: u8,
    },
}

/// A client's renewal in flight: one transaction for every lease of one
/// session incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Renewal {
    /// The incarnation renewed.
    pub incarnation: u8,
    /// Real time the client sent it at (it counts its leases from then).
    pub sent: u8,
    /// The server clock then: the `UPDATE`'s `now()` if it started at once
    /// (a start may come long before the row's lock); `RenewLate` takes the
    /// clock of the step that runs it instead (0 once it ran).
    pub now: u8,
    /// How far it got.
    pub step: RenewalStep,
}

/// What a client remembers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// The incarnation of its current session (0: none yet).
    pub incarnation: u8,
    /// The real time until which it knows its current session is live
    /// (counted from a send: a lower bound; 0 once it passed).
    pub known: u8,
    /// Per incarnation (index = incarnation - 1): the `removed` count the
    /// client accounted for (0 between steps: the state merging keeps the
    /// counts relative to it).
    pub seen_removed: Vec<u8>,
    /// Its view of each key (a lapsed view keeps `until` 0).
    pub views: Vec<Option<View>>,
    /// Acquisitions made or begun (bounded by the model's `grants`).
    pub grants: u8,
    /// The renewal in flight, if any.
    pub renewal: Option<Renewal>,
    /// The acquire in flight, if any.
    pub acquiring: Option<Acquiring>,
    /// Crashed: does nothing more.
    pub crashed: bool,
}

/// The whole state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MySessionState {
    /// Real time (abstract ticks), which the clients' own clocks follow.
    pub real: u8,
    /// The server clock the statements read: real time less a step back.
    pub clock: u8,
    /// Whether the clock has stepped back already (once at most).
    pub stepped_back: bool,
    /// Whether the one forced release of the run happened.
    pub forced: bool,
    /// Committed session rows: per client, per incarnation (index =
    /// incarnation - 1).
    pub sessions: Vec<Vec<Option<SessionRow>>>,
    /// Committed lease rows, per key (`None`: released).
    pub grants: Vec<Option<GrantRow>>,
    /// Each client's memory.
    pub clients: Vec<Client>,
    /// A key was taken over from a lapsed session (for reachability).
    pub took_over: bool,
    /// A renewal confirmed a lease whose lease row was no longer the holder's.
    pub confirmed_a_gone_lease: bool,
}

impl MySessionState {
    /// Whether two clients count themselves the holder of one key at once.
    pub fn two_live_views(&self) -> bool {
        (0..self.grants.len()).any(|k| {
            let live = self.clients.iter().filter(|c| c.views[k].is_some_and(|v| v.until > self.real && !v.revoked));
            live.count() > 1
        })
    }

    /// The committed row of `client`'s session `incarnation`, if any.
    pub fn session(&self, client: u8, incarnation: u8) -> Option<SessionRow> {
        let i = usize::from(incarnation.checked_sub(1)?);
        self.sessions[usize::from(client)].get(i).copied().flatten()
    }

    /// The committed row of `client`'s session `incarnation`, to write.
    pub fn session_mut(&mut self, client: u8, incarnation: u8) -> Option<&mut SessionRow> {
        let i = usize::from(incarnation.checked_sub(1)?);
        self.sessions[usize::from(client)].get_mut(i)?.as_mut()
    }

    /// Whether that session is unexpired on the server clock (committed).
    pub fn live(&self, client: u8, incarnation: u8) -> bool {
        self.session(client, incarnation).is_some_and(|r| r.expires > self.clock)
    }

    /// Per key, whether its committed lease row lives with that session.
    pub fn rows_of(&self, client: u8, incarnation: u8) -> Vec<bool> {
        self.grants.iter().map(|g| *g == Some(GrantRow { client, incarnation })).collect()
    }

    /// Whether an open transaction holds the lock of that session row: a
    /// renewal between its `UPDATE` and its commit.
    pub fn session_locked(&self, client: u8, incarnation: u8) -> bool {
        self.clients[usize::from(client)]
            .renewal
            .is_some_and(|r| r.incarnation == incarnation && matches!(r.step, RenewalStep::Written { .. }))
    }

    /// Whether an open transaction of a client other than `except` holds
    /// the lock of key `k`'s lease row: a takeover between its `FOR UPDATE`
    /// and its commit.
    pub fn lease_locked(&self, k: u8, except: Option<u8>) -> bool {
        self.clients.iter().enumerate().any(|(c, client)| {
            Some(c as u8) != except
                && client.acquiring.is_some_and(|a| a.key == k && matches!(a.step, AcquireStep::Counting { .. }))
        })
    }

    /// Confirms the client's leases of `incarnation` that `present` keeps,
    /// forgets the others, after a renewal sent at `sent`.
    pub(super) fn settle(&mut self, ttl: u8, c: u8, incarnation: u8, sent: u8, present: &[bool]) {
        let ci = usize::from(c);
        for (k, &kept) in present.iter().enumerate() {
            let Some(view) = self.clients[ci].views[k] else { continue };
            if view.incarnation != incarnation {
                continue;
            }
            if !kept {
                self.clients[ci].views[k] = None;
                continue;
            }
            if self.grants[k] != Some(GrantRow { client: c, incarnation }) {
                self.confirmed_a_gone_lease = true;
            }
            // A confirmed renewal makes the client a holder again whatever
            // happened to the row (`revoked` cleared): the bug the
            // properties catch.
            let until = ahead(view.until.max(sent + ttl), self.real);
            self.clients[ci].views[k] = Some(View { until, revoked: false, ..view });
        }
    }

    /// A client releases its own row (an `UPDATE .. WHERE token = ?`) and
    /// forgets its view.
    pub(super) fn release(&mut self, c: u8, k: u8) {
        let (ci, ki) = (usize::from(c), usize::from(k));
        let Some(view) = self.clients[ci].views[ki].take() else { return };
        if self.grants[ki] == Some(GrantRow { client: c, incarnation: view.incarnation }) {
            self.grants[ki] = None;
        }
    }

    /// An operator frees a key, counting the removal in its session and
    /// marking the holder's view revoked (a ghost: it learns at its next
    /// renewal).
    pub(super) fn force_release(&mut self, k: u8) {
        let ki = usize::from(k);
        if let Some(row) = self.grants[ki].take() {
            if let Some(v) = self.clients[usize::from(row.client)].views[ki].as_mut()
                && v.incarnation == row.incarnation
                && v.until > 0
            {
                v.revoked = true;
            }
            if let Some(r) = self.session_mut(row.client, row.incarnation) {
                r.removed += 1;
            }
        }
        self.forced = true;
    }

    /// A tick: real time and the server clock move on; counts that passed
    /// are all alike (0).
    pub(super) fn tick(&mut self, ttl: u8) {
        self.real += 1;
        self.clock += 1;
        let real = self.real;
        for client in &mut self.clients {
            client.known = ahead(client.known, real);
            for v in client.views.iter_mut().flatten() {
                if v.until <= real {
                    *v = View { until: 0, revoked: false, ..*v };
                }
            }
            if let Some(a) = client.acquiring.as_mut() {
                a.until = ahead(a.until, real);
                if let AcquireStep::Extending { sent, .. } = &mut a.step {
                    *sent = ahead(*sent + ttl, real).saturating_sub(ttl);
                }
            }
            if let Some(r) = client.renewal.as_mut() {
                r.sent = ahead(r.sent + ttl, real).saturating_sub(ttl);
            }
        }
    }

    /// Merges states no step can tell apart (each rule keeps every future
    /// comparison's outcome):
    ///
    /// - `removed` counts are kept relative to what their client accounted
    ///   for (renewals compare them for equality only, and others only add
    ///   to them), so `seen_removed` is 0;
    /// - the count of a session row that no renewal can read any more (not
    ///   the client's current one, or the client crashed; no view of it, no
    ///   renewal of it) is 0, and such a row that no lease row names and no
    ///   takeover in flight counts in is gone (nothing reads it again);
    /// - a crashed client's memory is empty.
    pub(super) fn normalize(&mut self) {
        let s = self;
        for c in 0..s.clients.len() {
            if s.clients[c].crashed {
                let client = &mut s.clients[c];
                client.known = 0;
                client.seen_removed.iter_mut().for_each(|n| *n = 0);
            }
            for i in 0..s.clients[c].seen_removed.len() {
                let inc = i as u8 + 1;
                let name = GrantRow { client: c as u8, incarnation: inc };
                let named = s.grants.contains(&Some(name))
                    || s.clients.iter().any(|other| {
                        other.acquiring.is_some_and(|a| {
                            matches!(a.step, AcquireStep::Locking { seen } | AcquireStep::Counting { seen } if seen == name)
                        })
                    });
                let client = &mut s.clients[c];
                let readable = !client.crashed
                    && (inc == client.incarnation
                        || client.renewal.is_some_and(|r| r.incarnation == inc)
                        || client.views.iter().flatten().any(|v| v.incarnation == inc));
                let offset = std::mem::take(&mut client.seen_removed[i]);
                if let Some(r) = client.renewal.as_mut().filter(|r| r.incarnation == inc) {
                    match &mut r.step {
                        RenewalStep::CountRead { removed }
                        | RenewalStep::Written { removed, .. }
                        | RenewalStep::ReadingRows { removed } => *removed -= offset,
                        RenewalStep::Sent => {}
                    }
                }
                let row = &mut s.sessions[c][i];
                if let Some(r) = row.as_mut() {
                    r.removed = if readable { r.removed - offset } else { 0 };
                }
                if !readable && !named {
                    *row = None;
                }
            }
        }
    }
}

fn row_name(g: GrantRow) -> String {
    format!("{}{}", client_name(g.client), g.incarnation)
}

impl fmt::Display for MySessionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "real {} clock {}", self.real, self.clock)?;
        for (c, incarnations) in self.sessions.iter().enumerate() {
            for (i, s) in incarnations.iter().enumerate() {
                if let Some(s) = s {
                    let name = client_name(c as u8);
                    write!(f, "; session {name}{} until {} removed {}", i + 1, s.expires, s.removed)?;
                }
            }
        }
        for (k, g) in self.grants.iter().enumerate() {
            if let Some(g) = g {
                write!(f, "; K{k} row {}", row_name(*g))?;
            }
        }
        for (c, client) in self.clients.iter().enumerate() {
            let name = client_name(c as u8);
            if client.known > 0 {
                write!(f, "; {name} counts {name}{} live until real {}", client.incarnation, client.known)?;
            }
            for (k, v) in client.views.iter().enumerate() {
                if let Some(v) = v {
                    let revoked = if v.revoked { " (freed by the operator)" } else { "" };
                    match v.until {
                        0 => write!(f, "; {name}'s view of K{k} lapsed")?,
                        until => write!(f, "; {name} holds K{k} until real {until}{revoked}")?,
                    }
                }
            }
            if let Some(a) = &client.acquiring {
                let step = match a.step {
                    AcquireStep::Extending { now, .. } => format!("extending {name}{} (now() = {now})", a.incarnation),
                    AcquireStep::Granting => format!("granting with {name}{}", a.incarnation),
                    AcquireStep::Reading => "reading the row".to_string(),
                    AcquireStep::Locking { seen } => format!("locking the row ({} seen lapsed)", row_name(seen)),
                    AcquireStep::Counting { seen } => format!("holds the row's lock, counting in {}", row_name(seen)),
                };
                write!(f, "; {name}'s acquire of K{} {step}", a.key)?;
            }
            if let Some(r) = &client.renewal {
                let step = match r.step {
                    RenewalStep::Sent => format!("sent (now() = {})", r.now),
                    RenewalStep::CountRead { removed } => format!("read removed {removed}"),
                    RenewalStep::Written { expires, removed } => {
                        format!("wrote until {expires} (not committed), removed {removed}")
                    }
                    RenewalStep::ReadingRows { removed } => format!("committed, removed {removed}: reading the rows"),
                };
                write!(f, "; {name}{}'s renewal {step}", r.incarnation)?;
            }
        }
        if self.confirmed_a_gone_lease {
            write!(f, " (a renewal confirmed a lease whose row was gone)")?;
        }
        Ok(())
    }
}

/// What may happen next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MySessionAction {
    /// A client's acquire of a key starts: it chooses its session by its own
    /// count and sends the first statement.
    AcquireStart(u8, u8),
    /// The acquire's next statement runs (enabled while it would not wait
    /// for a row lock).
    Acquire(u8),
    /// The acquire's extension runs, its `now()` read now (the statement
    /// started late) rather than at its send.
    AcquireLate(u8),
    /// A client sends the renewal of its session incarnation.
    SendRenewal(u8, u8),
    /// The renewal's next statement (or its commit) runs.
    Renew(u8),
    /// The renewal's `UPDATE` runs, its `now()` read now (the statement
    /// started late) rather than at its send.
    RenewLate(u8),
    /// A client releases its lease of a key (waits for the row's lock).
    Release(u8, u8),
    /// An operator frees a key whatever its holder (once per run; waits for
    /// the lease row's and its session row's locks).
    ForceRelease(u8),
    /// A client crashes: its open transactions roll back, it forgets its
    /// leases and does nothing more.
    Crash(u8),
    /// Real time and the server clock move one tick.
    Tick,
    /// The server clock steps back by this many ticks (once).
    StepBack(u8),
}

impl fmt::Display for MySessionAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AcquireStart(c, k) => write!(f, "{}'s acquire of K{k} chooses its session", client_name(*c)),
            Self::Acquire(c) => write!(f, "{}'s acquire: the next statement runs", client_name(*c)),
            Self::SendRenewal(c, i) => {
                write!(f, "{} sends the renewal of session {}{i}", client_name(*c), client_name(*c))
            }
            Self::Renew(c) => write!(f, "{}'s renewal: the next statement runs", client_name(*c)),
            Self::RenewLate(c) => write!(f, "{}'s renewal: its UPDATE runs, started late", client_name(*c)),
            Self::AcquireLate(c) => write!(f, "{}'s acquire: its extension runs, started late", client_name(*c)),
            Self::Release(c, k) => write!(f, "{} releases K{k}", client_name(*c)),
            Self::ForceRelease(k) => write!(f, "an operator frees K{k}"),
            Self::Crash(c) => write!(f, "{} crashes", client_name(*c)),
            Self::Tick => write!(f, "time passes"),
            Self::StepBack(n) => write!(f, "the server clock steps back {n}"),
        }
    }
}
