//! What the MySQL per-key fence model remembers: the namespace counter, the
//! key's lease row, the key's share rows, each client's budget, and what the
//! properties check.

use std::fmt;

/// The token kind of the key's lease row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Token {
    /// An exclusive holder: the client.
    Holder(u8),
    /// The gate of shares: held shares keep the key.
    Gate,
    /// The released marker (the row a release leaves, expired at once).
    Released,
}

/// The key's lease row (the latest committed version: every statement of
/// the model reads it under its lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseRow {
    /// Who the row names.
    pub token: Token,
    /// The key's last fence.
    pub fence: u8,
    /// Whether the lease is unexpired (for the gate: a share is live).
    pub live: bool,
}

/// A held share of the key (a row of the shares table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Share {
    /// The share's fence.
    pub fence: u8,
    /// Whether the share is unexpired.
    pub live: bool,
}

/// The whole state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FenceState {
    /// The namespace's fence counter (`{ns}_fence` id 0).
    pub counter: u8,
    /// The key's lease row, if it exists.
    pub row: Option<LeaseRow>,
    /// Each client's share of the key, if it holds one.
    pub shares: Vec<Option<Share>>,
    /// Grants (attempts, for old clients) each client has had.
    pub grants: Vec<u8>,
    /// Fence raises made so far.
    pub raises: u8,
    /// The highest fence granted for the key, or floor it was raised to.
    pub top_fence: u8,
    /// A grant's fence was not above every earlier grant's (and floor's).
    pub fence_went_back: bool,
    /// A grant was made while a conflicting lease of the key was live.
    pub granted_over_live: bool,
    /// The sweep deleted the row at least once (for reachability).
    pub swept: bool,
    /// A grant followed a sweep (for reachability).
    pub granted_after_sweep: bool,
    /// An exclusive grant took over the released marker (for reachability).
    pub granted_over_marker: bool,
    /// A share was granted over a row whose fence is above the counter (for
    /// reachability).
    pub share_over_raised_row: bool,
}

impl FenceState {
    /// The empty namespace: counter 0, no row, no share.
    pub fn empty(clients: usize) -> Self {
        FenceState {
            counter: 0,
            row: None,
            shares: vec![None; clients],
            grants: vec![0; clients],
            raises: 0,
            top_fence: 0,
            fence_went_back: false,
            granted_over_live: false,
            swept: false,
            granted_after_sweep: false,
            granted_over_marker: false,
            share_over_raised_row: false,
        }
    }

    /// The client holding the row as a live exclusive lease, if any.
    pub fn live_holder(&self) -> Option<u8> {
        match self.row {
            Some(LeaseRow { token: Token::Holder(c), live: true, .. }) => Some(c),
            _ => None,
        }
    }

    /// Whether `c` holds the row (live or expired).
    pub fn holds_row(&self, c: u8) -> bool {
        self.row.is_some_and(|r| r.token == Token::Holder(c))
    }

    /// Whether a share other than `except`'s is live.
    pub fn live_share_besides(&self, except: Option<u8>) -> bool {
        self.shares.iter().enumerate().any(|(i, s)| Some(i as u8) != except && s.is_some_and(|s| s.live))
    }

    /// Whether `c` holds nothing of the key (so it may acquire).
    pub fn idle(&self, c: u8) -> bool {
        !self.holds_row(c) && self.shares[c as usize].is_none()
    }

    /// Whether a live exclusive lease and a live share coexist.
    pub fn conflict(&self) -> bool {
        self.live_holder().is_some() && self.live_share_besides(None)
    }

    /// The gate's liveness follows its shares: live while one is.
    pub fn refresh_gate(&mut self) {
        let live = self.live_share_besides(None);
        if let Some(r) = self.row.as_mut()
            && r.token == Token::Gate
        {
            r.live = live;
        }
    }
}

/// A client's name in traces: A, B, ...
pub fn client_name(c: u8) -> char {
    char::from(b'A' + c)
}

impl fmt::Display for FenceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "counter {}; ", self.counter)?;
        match self.row {
            None => write!(f, "no row")?,
            Some(r) => {
                match r.token {
                    Token::Holder(c) => write!(f, "row {}", client_name(c))?,
                    Token::Gate => write!(f, "row GATE")?,
                    Token::Released => write!(f, "row released")?,
                }
                write!(f, " fence {} {}", r.fence, if r.live { "live" } else { "free" })?;
            }
        }
        for (i, s) in self.shares.iter().enumerate() {
            if let Some(s) = s {
                let expired = if s.live { "" } else { " (expired)" };
                write!(f, "; {} holds a share fence {}{expired}", client_name(i as u8), s.fence)?;
            }
        }
        write!(f, "; top fence {}", self.top_fence)?;
        if self.fence_went_back {
            write!(f, " (a fence went back)")?;
        }
        if self.granted_over_live || self.conflict() {
            write!(f, " (granted over a live lease)")?;
        }
        Ok(())
    }
}
