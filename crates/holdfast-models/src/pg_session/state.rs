//! What the PostgreSQL session model remembers: the server clock, the
//! committed session and lease rows, the statements in flight with what
//! their snapshots saw, and each client's view of its leases.

use std::fmt;

pub use crate::sql_session::{GrantRow, View, client_name};

/// One session row (`<table>_sessions`): an incarnation of a client's
/// session, under an id of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionRow {
    /// The end of the session on the server clock.
    pub expires: u8,
    /// How many of its leases others removed (a forced release, a takeover).
    pub removed: u8,
}

/// Where a client's renewal statement is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RenewalStep {
    /// Sent; the statement has not started.
    Sent,
    /// The statement started: its snapshot saw these keys held by the
    /// session (used only by the variant that reads them from it).
    Started {
        /// The keys whose rows the snapshot showed with the session.
        snapshot_rows: Vec<bool>,
    },
    /// The `UPDATE` locked the session row, re-checked it on its latest
    /// version and wrote this (not committed: others still read the old
    /// version, and a writer of the row waits).
    Written {
        /// The snapshot's rows, as in `Started`.
        snapshot_rows: Vec<bool>,
        /// The session row as written (`None`: the re-check failed).
        row: Option<SessionRow>,
    },
    /// Committed with a moved `removed` count: a second statement reads
    /// which rows of the session are left (a snapshot taken now).
    ReadingRows {
        /// The count the renewal returned.
        removed: u8,
    },
}

/// A client's renewal in flight: one statement for all its leases of one
/// session incarnation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Renewal {
    /// The incarnation renewed.
    pub incarnation: u8,
    /// Real time the client sent it at (it counts its leases from then).
    pub sent: u8,
    /// How far the statement got.
    pub step: RenewalStep,
}

/// A client's acquire statement after its snapshot, before its writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Acquiring {
    /// The key.
    pub key: u8,
    /// The key's lease row in the snapshot.
    pub row: Option<GrantRow>,
    /// Whether the snapshot showed that row's session unexpired.
    pub holder_live: bool,
    /// The client's current session row in the snapshot (`None` on the
    /// lean path, which does not read it).
    pub own: Option<SessionRow>,
    /// The lean path: the client's own count says its current session has
    /// two thirds of the TTL left, so the statement names it and reads or
    /// writes nothing of it.
    pub lean: bool,
    /// Real time and server clock when the snapshot was taken.
    pub real: u8,
    /// The server clock then.
    pub clock: u8,
}

/// What a client remembers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// The incarnation of its current session (0: none yet).
    pub incarnation: u8,
    /// Real time until which the client knows its current session is
    /// unexpired: counted from the send of the statement that last made or
    /// extended it (a lower bound: the server set the expiry later than
    /// that, on a clock that is never ahead of real time).
    pub known: u8,
    /// Per incarnation (index = incarnation - 1): the `removed` count the
    /// client accounted for.
    pub seen_removed: Vec<u8>,
    /// Its view of each key.
    pub views: Vec<Option<View>>,
    /// Acquisitions made or begun (bounded by the model's `grants`).
    pub grants: u8,
    /// The renewal in flight, if any.
    pub renewal: Option<Renewal>,
    /// The acquire statement in flight, if any.
    pub acquiring: Option<Acquiring>,
    /// Crashed: does nothing more.
    pub crashed: bool,
}

/// The whole state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PgSessionState {
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
    /// Committed lease rows, per key.
    pub grants: Vec<Option<GrantRow>>,
    /// Each client's memory.
    pub clients: Vec<Client>,
    /// A key was taken over from a lapsed session (for reachability).
    pub took_over: bool,
    /// A renewal confirmed a lease whose lease row was no longer the holder's.
    pub confirmed_a_gone_lease: bool,
}

impl PgSessionState {
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

    /// Whether a renewal in flight holds the lock of that session row.
    pub fn locked(&self, client: u8, incarnation: u8) -> bool {
        self.clients[usize::from(client)]
            .renewal
            .as_ref()
            .is_some_and(|r| r.incarnation == incarnation && matches!(r.step, RenewalStep::Written { .. }))
    }
}

impl fmt::Display for PgSessionState {
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
                write!(f, "; K{k} row {}{}", client_name(g.client), g.incarnation)?;
            }
        }
        for (c, client) in self.clients.iter().enumerate() {
            let name = client_name(c as u8);
            for (k, v) in client.views.iter().enumerate() {
                if let Some(v) = v {
                    let revoked = if v.revoked { " (freed by the operator)" } else { "" };
                    write!(f, "; {name} holds K{k} until real {}{revoked}", v.until)?;
                }
            }
            if let Some(r) = &client.renewal {
                let step = match &r.step {
                    RenewalStep::Sent => "sent".to_string(),
                    RenewalStep::Started { .. } => "started".to_string(),
                    RenewalStep::Written { row: Some(row), .. } => {
                        format!("wrote until {} (not committed)", row.expires)
                    }
                    RenewalStep::Written { row: None, .. } => "found the session lapsed".to_string(),
                    RenewalStep::ReadingRows { .. } => "reading the session's rows".to_string(),
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
