//! The state of the PostgreSQL share gate model: who holds the gate row's
//! lock, each client's share row, and each client's progress through its
//! acquire's steps.

use std::fmt;

use crate::sql_session::client_name;

/// One step of a shared acquire, in the order its variant runs them (see
/// [`ShareGateVariant::steps`](super::ShareGateVariant::steps)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AcquireStep {
    /// The statement starts and takes its snapshot (the shares read later
    /// in the same statement are read in it).
    Snapshot,
    /// `SELECT ... FROM <table> WHERE key = k FOR UPDATE`: the gate row's
    /// lock, held to the commit (waits while another transaction holds it).
    LockGate,
    /// A new statement reads the key's shares in a snapshot of its own,
    /// taken now.
    ReadFresh,
    /// The shares read in the snapshot the statement took at its start.
    ReadInSnapshot,
    /// Decides (admitted if the permits read, plus its own one, are within
    /// the limit) and, if admitted, inserts its share row (uncommitted).
    Insert,
    /// Commits: the share row becomes visible, the gate's lock is released.
    Commit,
}

/// A client's share row in `<table>_shares`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Row {
    /// No row.
    Absent,
    /// Inserted by the client's acquire, not committed yet: invisible to
    /// every other transaction's snapshot.
    Inserted,
    /// Committed: a permit held.
    Committed,
}

/// Where one client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Wants a permit: in its acquire, `next` its next step (its
    /// variant's first: it has not started, or was refused and tries
    /// again).
    Acquiring {
        /// The step it takes next.
        next: AcquireStep,
    },
    /// Holds a permit (its share row committed).
    Holding,
    /// Released (its row deleted); the gate's shrink is next.
    Released,
    /// Has had all its acquisitions.
    Done,
}

/// One client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// Where it is.
    pub phase: Phase,
    /// The snapshot its statement took at its start, if it took one and
    /// has not read in it yet: the clients whose share rows were committed
    /// then (one bit each).
    pub snapshot: Option<u8>,
    /// The permits held as its read saw them, once read.
    pub seen: Option<u8>,
    /// Its share row.
    pub row: Row,
    /// Acquisitions it has not been granted yet.
    pub left: u8,
}

/// The whole system: the gate's lock and the clients.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShareGateState {
    /// The client whose transaction holds the gate row's lock.
    pub gate: Option<u8>,
    /// The clients, A first.
    pub clients: Vec<Client>,
}

impl ShareGateState {
    /// The committed share rows (one bit per client): what a snapshot
    /// taken now shows (none of the clients has an uncommitted row of its
    /// own when it reads, so its own writes add nothing).
    pub fn committed(&self) -> u8 {
        self.clients.iter().enumerate().filter(|(_, c)| c.row == Row::Committed).fold(0, |bits, (i, _)| bits | 1 << i)
    }

    /// The permits held: committed share rows.
    pub fn held(&self) -> u32 {
        self.committed().count_ones()
    }

    /// How many clients have been granted at least once, of
    /// `acquisitions` each.
    pub fn ever_granted(&self, acquisitions: u8) -> usize {
        self.clients.iter().filter(|c| c.left < acquisitions).count()
    }
}

impl AcquireStep {
    /// A short name, for the state's display.
    pub fn label(self) -> &'static str {
        match self {
            Self::Snapshot => "snapshot",
            Self::LockGate => "lock gate",
            Self::ReadFresh => "read (fresh snapshot)",
            Self::ReadInSnapshot => "read (statement's snapshot)",
            Self::Insert => "decide",
            Self::Commit => "commit",
        }
    }
}

impl fmt::Display for AcquireStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Snapshot => "takes its statement's snapshot",
            Self::LockGate => "locks the gate row",
            Self::ReadFresh => "reads the shares in a fresh snapshot",
            Self::ReadInSnapshot => "reads the shares in its statement's snapshot",
            Self::Insert => "decides, and inserts its share if admitted",
            Self::Commit => "commits",
        })
    }
}

impl fmt::Display for ShareGateState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.gate {
            Some(c) => write!(f, "gate locked by {}", client_name(c))?,
            None => write!(f, "gate free")?,
        }
        write!(f, ", permits held {}", self.held())?;
        for (i, c) in self.clients.iter().enumerate() {
            write!(f, "; {}: ", client_name(i as u8))?;
            match c.phase {
                Phase::Acquiring { next } => write!(f, "next {}", next.label())?,
                Phase::Holding => write!(f, "holds")?,
                Phase::Released => write!(f, "released, shrink next")?,
                Phase::Done => write!(f, "done")?,
            }
            if let Some(bits) = c.snapshot {
                let rows: String =
                    (0..self.clients.len() as u8).filter(|j| bits & 1 << j != 0).map(client_name).collect();
                write!(f, ", snapshot shows [{rows}]")?;
            }
            if let Some(seen) = c.seen {
                write!(f, ", read {seen} held")?;
            }
            if c.row == Row::Inserted {
                write!(f, ", row inserted")?;
            }
        }
        Ok(())
    }
}
