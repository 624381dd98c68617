//! What the per-key fence model remembers: the namespace counter, the key's
//! lease row, each client's statement in flight and view of its lease, and
//! what the properties check.

use std::fmt;

/// Who a lease row names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    /// An exclusive holder: the client and which of its grants.
    Exclusive(u8, u8),
    /// The gate of shares (token `GATE`).
    Gate,
    /// The released marker (an empty token, expired at the release).
    Released,
}

/// The key's lease row (the latest committed version).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseRow {
    /// Who the row names.
    pub holder: Holder,
    /// The key's last fence.
    pub fence: u8,
    /// Whether the lease is unexpired (for the gate: a share is live).
    pub live: bool,
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Holds nothing, runs nothing.
    Idle,
    /// Its acquire statement took its snapshot, which saw this row (or none);
    /// the writes are still to run.
    Snapped(Option<LeaseRow>),
    /// Was granted this fence; `live` while its lease has not run out.
    Holding {
        /// The grant's fence.
        fence: u8,
        /// Whether the lease is still unexpired.
        live: bool,
        /// A shared grant.
        shared: bool,
    },
}

/// The whole state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FenceState {
    /// The namespace's fence counter (the new layout's, or the only one).
    pub counter: u8,
    /// The key's lease row, if it exists.
    pub row: Option<LeaseRow>,
    /// Each client's phase.
    pub clients: Vec<Phase>,
    /// Grants (or attempts, for old clients) each client has had.
    pub grants: Vec<u8>,
    /// The highest fence ever granted.
    pub top_fence: u8,
    /// A grant's fence was not above every earlier grant's.
    pub fence_went_back: bool,
    /// An exclusive grant was made while another lease of the key was live.
    pub granted_over_live: bool,
    /// The sweep deleted the row at least once (for reachability).
    pub swept: bool,
    /// A grant followed a sweep (for reachability).
    pub granted_after_sweep: bool,
    /// An acquire statement was told to run again (for reachability).
    pub retried: bool,
}

impl FenceState {
    /// Live holders: exclusive ones, and shared ones.
    pub fn live_holders(&self) -> (usize, usize) {
        let mut n = (0, 0);
        for p in &self.clients {
            if let Phase::Holding { live: true, shared, .. } = p {
                if *shared { n.1 += 1 } else { n.0 += 1 }
            }
        }
        n
    }

    /// Whether two live leases conflict (two exclusive, or one beside shares).
    pub fn two_live_leases(&self) -> bool {
        let (x, s) = self.live_holders();
        x > 1 || (x == 1 && s > 0)
    }
}

/// A client's name in traces: A, B, ...
pub fn client_name(c: u8) -> char {
    char::from(b'A' + c)
}

fn row_text(row: Option<LeaseRow>) -> String {
    match row {
        None => "no row".to_owned(),
        Some(r) => {
            let who = match r.holder {
                Holder::Exclusive(c, g) => format!("{}{g}", client_name(c)),
                Holder::Gate => "GATE".to_owned(),
                Holder::Released => "released".to_owned(),
            };
            format!("row {who} fence {} {}", r.fence, if r.live { "live" } else { "free" })
        }
    }
}

impl fmt::Display for FenceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "counter {}; {}", self.counter, row_text(self.row))?;
        for (i, p) in self.clients.iter().enumerate() {
            let name = client_name(i as u8);
            match p {
                Phase::Idle => {}
                Phase::Snapped(seen) => write!(f, "; {name}'s snapshot saw {}", row_text(*seen))?,
                Phase::Holding { fence, live, shared } => write!(
                    f,
                    "; {name} holds {} fence {fence}{}",
                    if *shared { "a share" } else { "the lock" },
                    if *live { "" } else { " (expired)" }
                )?,
            }
        }
        if self.fence_went_back {
            write!(f, " (a fence went back)")?;
        }
        if self.granted_over_live {
            write!(f, " (granted over a live lease)")?;
        }
        Ok(())
    }
}
