//! What the lock-hash model remembers: the server's clock and lock hash
//! `H`, each client's view of its lease, and what the properties check.

use std::fmt;

/// A fence: the server clock at the grant, then a count of grants above it
/// (`(t, n)` stands for `t * 1000 + n` microseconds: fewer than a thousand
/// grants of one lock per millisecond, which one Redis cannot run). Ordered
/// as that number.
pub type Fence = (u8, u8);

/// A token: the client and which of its grants (each acquisition draws a
/// new random token).
pub type Token = (u8, u8);

/// The lock hash `H` (`common.lua`'s layout comment): the fields the hot
/// paths use.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockHash {
    /// `o`: the token of the last grant.
    pub o: Option<Token>,
    /// `f`: the lock's last fence.
    pub f: Fence,
    /// `x`: the end of `o`'s lease on the server clock, 0 once released.
    pub x: u8,
    /// `e`: when `H` expires on the server clock (its `PEXPIREAT`).
    pub e: u8,
    /// `r`: the token of the last release.
    pub r: Option<Token>,
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Holds no lease; may acquire.
    Idle,
    /// Was granted `token` with `fence`, and counts itself the holder until
    /// `until` in real time: `ttl` after its grant or last renewal (a client
    /// counts its lease from its own clock, never the server's).
    Holding {
        /// The grant's token.
        token: Token,
        /// The grant's fence.
        fence: Fence,
        /// The end of the lease as the client counts it, in real time.
        until: u8,
    },
}

/// The whole state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CycleState {
    /// Real time (abstract ticks), which the clients' own clocks follow.
    pub real: u8,
    /// The server clock (milliseconds, abstract ticks): real time, less a
    /// step back.
    pub clock: u8,
    /// Whether the clock has stepped back already (once at most).
    pub stepped_back: bool,
    /// `H`, if it exists (a missing key is an expired or never made lock).
    pub hash: Option<LockHash>,
    /// Each client's phase.
    pub clients: Vec<Phase>,
    /// Grants each client has had (bounded by the model's `grants`).
    pub grants: Vec<u8>,
    /// The highest fence ever granted.
    pub top_fence: Option<Fence>,
    /// A grant's fence was not above every earlier one.
    pub fence_went_back: bool,
    /// A release answered "released" for a lease that had run out.
    pub released_a_dead_lease: bool,
    /// Whether `H` ever expired (for the reachability check).
    pub hash_expired: bool,
}

impl CycleState {
    /// Whether two clients count themselves the holder at once.
    pub fn two_live_leases(&self) -> bool {
        let live = self.clients.iter().filter(|p| matches!(p, Phase::Holding { until, .. } if *until > self.real));
        live.count() > 1
    }
}

fn token(t: Option<Token>) -> String {
    t.map_or_else(|| "-".to_owned(), |(c, g)| format!("{}{}", client_name(c), g))
}

/// A client's name in traces: A, B, ...
pub fn client_name(c: u8) -> char {
    char::from(b'A' + c)
}

impl fmt::Display for CycleState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "real {} clock {}", self.real, self.clock)?;
        match &self.hash {
            Some(h) => write!(f, "; H o={} f={}.{} x={} e={} r={}", token(h.o), h.f.0, h.f.1, h.x, h.e, token(h.r))?,
            None => write!(f, "; no H")?,
        }
        for (i, p) in self.clients.iter().enumerate() {
            if let Phase::Holding { token: t, fence, until } = p {
                let name = client_name(i as u8);
                write!(f, "; {name} holds {} fence {}.{} until real {until}", token(Some(*t)), fence.0, fence.1)?;
            }
        }
        if self.fence_went_back {
            write!(f, " (a fence went back)")?;
        }
        if self.released_a_dead_lease {
            write!(f, " (a dead lease was reported released)")?;
        }
        Ok(())
    }
}
