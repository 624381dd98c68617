//! What the downgrade model remembers: the store's leases and reservations,
//! each client's phase, and whether a writer got in between.

use std::fmt;

/// A client of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Client {
    /// The downgrader: holds the write lease at the start.
    H,
    /// A writer.
    W,
    /// A reader.
    R,
}

impl Client {
    /// The lease this client acquires (the downgrader's second one is a read).
    pub fn wants(self) -> Lease {
        if self == Client::W { Lease::Write } else { Lease::Read }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// A lease's mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lease {
    /// Shared with other readers.
    Read,
    /// Exclusive.
    Write,
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Has not asked yet.
    Idle,
    /// Refused; its reservation waits in the store.
    Waiting(Lease),
    /// Holds this lease.
    Holding(Lease),
    /// The downgrader between releasing its write lease and asking for its
    /// read lease (the rejected variant only).
    Between,
    /// Released; makes no more requests.
    Done,
}

/// The whole state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DowngradeState {
    /// Each client's phase, indexed by [`Client`].
    phases: [Phase; 3],
    /// Leases held in the store.
    held: Vec<(Client, Lease)>,
    /// Waiting requests' reservations: mode and place (older is smaller).
    reserved: Vec<(Client, Lease, u8)>,
    /// The next place handed out.
    next_place: u8,
    /// A writer was granted after the downgrader's write grant and before
    /// it released its read lease.
    pub writer_between: bool,
}

impl DowngradeState {
    /// `H` holds the write lease; nobody else has asked.
    pub fn initial() -> Self {
        DowngradeState {
            phases: [Phase::Holding(Lease::Write), Phase::Idle, Phase::Idle],
            held: vec![(Client::H, Lease::Write)],
            reserved: Vec::new(),
            next_place: 0,
            writer_between: false,
        }
    }

    /// `c`'s phase.
    pub fn phase(&self, c: Client) -> Phase {
        self.phases[c.index()]
    }

    pub(super) fn set_phase(&mut self, c: Client, phase: Phase) {
        self.phases[c.index()] = phase;
    }

    /// Whether a held write lease is the only lease held.
    pub fn writer_alone(&self) -> bool {
        !self.held.iter().any(|(_, l)| *l == Lease::Write) || self.held.len() == 1
    }

    /// One store step: the admission rule (see the module docs), then the
    /// grant, or a reservation that keeps its place.
    pub(super) fn attempt(&mut self, c: Client, lease: Lease) {
        let own = self.reserved.iter().find(|(r, _, _)| *r == c).map(|(_, _, place)| *place);
        let admitted = match lease {
            Lease::Write => self.held.is_empty(),
            Lease::Read => {
                let older_writer =
                    self.reserved.iter().any(|(r, l, p)| *r != c && *l == Lease::Write && own.is_none_or(|o| *p < o));
                !self.held.iter().any(|(_, l)| *l == Lease::Write) && !older_writer
            }
        };
        if !admitted {
            if own.is_none() {
                self.reserved.push((c, lease, self.next_place));
                self.next_place += 1;
            }
            self.set_phase(c, Phase::Waiting(lease));
            return;
        }
        self.reserved.retain(|(r, _, _)| *r != c);
        self.held.push((c, lease));
        self.set_phase(c, Phase::Holding(lease));
        let downgrading = !matches!(self.phase(Client::H), Phase::Done);
        if lease == Lease::Write && c != Client::H && downgrading {
            self.writer_between = true;
        }
    }

    /// The shipped downgrade: `c`'s write lease becomes a read lease in place.
    pub(super) fn shrink(&mut self, c: Client) {
        for (holder, lease) in self.held.iter_mut() {
            if *holder == c {
                *lease = Lease::Read;
            }
        }
        self.set_phase(c, Phase::Holding(Lease::Read));
    }

    /// Removes `c`'s lease.
    pub(super) fn release(&mut self, c: Client) {
        self.held.retain(|(holder, _)| *holder != c);
    }
}

impl fmt::Display for DowngradeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "H {:?}, W {:?}, R {:?}; held {:?}", self.phases[0], self.phases[1], self.phases[2], self.held)?;
        if !self.reserved.is_empty() {
            write!(f, ", waiting {:?}", self.reserved)?;
        }
        if self.writer_between {
            write!(f, " (a writer got in between)")?;
        }
        Ok(())
    }
}
