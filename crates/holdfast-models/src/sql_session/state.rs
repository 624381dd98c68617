//! What the session model remembers: the host clock, the session and grant
//! tables, and each client's memory of its session and view of its leases.

use std::fmt;

/// A client's session row (`holdfast_sessions`): one per client (and TTL).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionRow {
    /// Which incarnation of the client's session the row is (the row's id:
    /// a lapsed session is never extended again; the client starts a new
    /// one under a new id).
    pub incarnation: u8,
    /// The end of the session on the host clock.
    pub expires: u8,
    /// How many of its leases others removed (a forced release, a takeover).
    pub removed: u8,
}

/// A grant row (`holdfast_grants`): the key's holder and the session it
/// lives with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GrantRow {
    /// The client that was granted the key.
    pub client: u8,
    /// The incarnation of that client's session the grant lives with.
    pub incarnation: u8,
}

/// What a client remembers of a lease it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct View {
    /// The session incarnation the grant was made in (the store's map from
    /// token to session).
    pub incarnation: u8,
    /// The end of the lease as the client counts it, in real time: `ttl`
    /// after its grant or last confirmed renewal.
    pub until: u8,
    /// Ghost: an operator removed this grant (the holder learns at its next
    /// renewal, on every store; until then it is not counted as a holder).
    pub revoked: bool,
}

/// What a client remembers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// The incarnation of its current session (0: none yet).
    pub incarnation: u8,
    /// The session row's `removed` count the client last accounted for.
    pub seen_removed: u8,
    /// Its view of each key (`None`: holds nothing).
    pub views: Vec<Option<View>>,
    /// Acquisitions made (bounded by the model's `grants`).
    pub grants: u8,
    /// Per key, the real time a renewal in flight was sent at.
    pub renewing: Vec<Option<u8>>,
}

/// The whole state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionState {
    /// Real time (abstract ticks), which the clients' own clocks follow.
    pub real: u8,
    /// The host clock the statements read: real time less a step back.
    pub clock: u8,
    /// Whether the clock has stepped back already (once at most).
    pub stepped_back: bool,
    /// Whether the one forced release of the run happened.
    pub forced: bool,
    /// Each client's session row, if it made one.
    pub sessions: Vec<Option<SessionRow>>,
    /// Each key's grant row.
    pub grants: Vec<Option<GrantRow>>,
    /// Each client's memory.
    pub clients: Vec<Client>,
    /// A key was taken over from a lapsed session (for reachability).
    pub took_over: bool,
    /// A renewal confirmed a lease whose grant row was no longer the holder's.
    pub confirmed_a_gone_lease: bool,
}

impl SessionState {
    /// Whether two clients count themselves the holder of one key at once.
    pub fn two_live_views(&self) -> bool {
        (0..self.grants.len()).any(|k| {
            let live = self.clients.iter().filter(|c| c.views[k].is_some_and(|v| v.until > self.real && !v.revoked));
            live.count() > 1
        })
    }
}

/// A client's name in traces: A, B, ...
pub fn client_name(c: u8) -> char {
    char::from(b'A' + c)
}

impl fmt::Display for SessionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "real {} clock {}", self.real, self.clock)?;
        for (c, s) in self.sessions.iter().enumerate() {
            if let Some(s) = s {
                let name = client_name(c as u8);
                write!(f, "; session {name}{} until {} removed {}", s.incarnation, s.expires, s.removed)?;
            }
        }
        for (k, g) in self.grants.iter().enumerate() {
            if let Some(g) = g {
                write!(f, "; K{k} row {}{}", client_name(g.client), g.incarnation)?;
            }
        }
        for (c, client) in self.clients.iter().enumerate() {
            for (k, v) in client.views.iter().enumerate() {
                if let Some(v) = v {
                    write!(f, "; {} holds K{k} until real {}", client_name(c as u8), v.until)?;
                }
            }
        }
        if self.confirmed_a_gone_lease {
            write!(f, " (a renewal confirmed a lease whose row was gone)")?;
        }
        Ok(())
    }
}
