//! The state of the share release model: the gate row (what it says and
//! which transaction holds its lock), each client's share row, where its
//! lease and its renewal are, and the exclusive acquirer; and the
//! wait-for graph read off them.

use std::fmt;

use crate::sql_session::client_name;

/// The key's lease row, the gate, as its latest version says (see
/// [`ShareReleaseState::gate`] for why the latest and not the committed
/// one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gate {
    /// The gate token, expired (`timestamptz 'epoch'`): no share holds the
    /// key, as far as an exclusive acquire can tell.
    Down,
    /// The gate token, unexpired: it covers the shares held (each share's
    /// expiry is "up" while it is held: time is not modelled).
    Up,
    /// The exclusive holder's lease.
    Exclusive,
    /// Released by the exclusive holder (`token = RELEASED`, expired): free
    /// to both kinds; a shared acquire makes it the gate again.
    Released,
}

/// One step of a release, in the order its variant runs them (see
/// [`ShareReleaseVariant::first_call`](super::ShareReleaseVariant::first_call)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseStep {
    /// The statement starts and takes its snapshot (the shares its shrink
    /// reads later are read in it).
    Snapshot,
    /// The release statement of today: deletes the share row and commits
    /// at once (waits while the client's renewal holds the row's lock).
    DeleteCommit,
    /// Deletes the share row, its lock held to the commit (waits while the
    /// client's renewal holds it). Until the commit every other transaction
    /// still sees the share held.
    Delete,
    /// `SELECT ... FROM <table> WHERE key = k FOR UPDATE`: the gate row's
    /// lock, held to the commit (waits while another transaction holds it).
    LockGate,
    /// The same with `SKIP LOCKED`: takes the lock if it is free; if not,
    /// commits the delete alone and leaves the shrink to a second call.
    TryGate,
    /// A new statement reads the key's held shares in a snapshot taken now,
    /// under the gate's lock: the committed ones, less the release's own
    /// row (deleted by its own transaction, so invisible to it).
    ReadFresh,
    /// The shares read in the snapshot the statement took at its start,
    /// less the release's own row.
    ReadInSnapshot,
    /// The gate's expiry set to the shares read: up if any, else down
    /// (`WHERE token = GATE`: an exclusive holder's row is not written).
    WriteGate,
    /// Commits: the delete becomes visible, and every lock is released.
    Commit,
}

/// A client's share row in `<table>_shares`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Row {
    /// No row.
    Absent,
    /// Inserted by the client's acquire, not committed yet: invisible to
    /// every other transaction.
    Inserted,
    /// Committed: a share held.
    Held,
    /// Deleted by the client's release, which holds its lock and has not
    /// committed: still held for every other transaction.
    Deleting,
}

/// A client's renewal transaction (on the renewal connection, beside its
/// release on the key's connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Renewal {
    /// None in flight.
    Idle,
    /// Its update waits for the share row's lock, which the client's
    /// release holds (it ends with nothing to do when the delete commits).
    Waiting,
    /// Updated the share row, whose lock it holds; the gate's lock next.
    Locked,
    /// Holds the gate's lock too and raised the gate; the commit next.
    Raised,
}

/// One step of a shared acquire (the shipped `<table>_share`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AcquireStep {
    /// `SELECT ... FOR UPDATE` of the gate row: its lock, held to the
    /// commit (waits while another transaction holds it).
    LockGate,
    /// Reads the gate (under its lock: its latest version) and the shares
    /// (which decide nothing for shares alone: they are read in the step
    /// too); refused if the exclusive acquirer holds the key, else inserts
    /// its share row and raises the gate (both uncommitted).
    Grant,
    /// Commits: its share held if granted, the gate's lock released.
    Commit,
}

/// Where the exclusive acquirer is. Each of its statements locks the gate
/// row and writes it at once (an `UPDATE`; after a wait, PostgreSQL
/// re-checks the row's latest version), then commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Exclusive {
    /// Wants the key.
    Idle,
    /// Its acquire holds the gate's lock and took the key if the gate was
    /// down or released (`granted`); the commit next.
    Acquiring {
        /// Whether it took the key.
        granted: bool,
    },
    /// Holds the key.
    Holding,
    /// Its release holds the gate's lock and wrote the row released; the
    /// commit next (it holds the key until then).
    Releasing,
}

/// Where one client's lease is. A client's acquire and release run on the
/// key's connection, one after the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Wants a share: its acquire's first statement locks the gate.
    Idle,
    /// In its acquire, which holds the gate's lock; `next` its next step.
    Acquiring {
        /// The step it takes next.
        next: AcquireStep,
    },
    /// Holds its share.
    Holding,
    /// Releasing; `next` its next step.
    Releasing {
        /// The step it takes next.
        next: ReleaseStep,
        /// The delete committed and the shrink runs as a call of its own.
        second_call: bool,
    },
}

/// One client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// Where its lease is.
    pub phase: Phase,
    /// Its share row.
    pub row: Row,
    /// Its renewal.
    pub renewal: Renewal,
    /// The snapshot its release's statement took at its start, until read:
    /// the clients whose share rows were held then (one bit each).
    pub snapshot: Option<u8>,
    /// Whether its release's read saw a share held, until written.
    pub seen: Option<bool>,
}

/// A transaction, as the wait-for graph names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Txn {
    /// Client `c`'s shared acquire.
    Acquire(u8),
    /// Client `c`'s release (either of its calls).
    Release(u8),
    /// Client `c`'s renewal.
    Renewal(u8),
    /// The exclusive acquirer's acquire or release.
    Exclusive,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShareReleaseState {
    /// The gate row's latest version. Only the holder of the gate's lock
    /// writes it, and nobody reads it without that lock (share acquires,
    /// the exclusive acquirer and renewals lock it first; the shrinks write
    /// it without reading it), so an uncommitted write is seen by no one
    /// before its commit, which releases the lock.
    pub gate: Gate,
    /// The transaction holding the gate row's lock.
    pub gate_lock: Option<Txn>,
    /// The exclusive acquirer.
    pub exclusive: Exclusive,
    /// The sharing clients, A first.
    pub clients: Vec<Client>,
}

impl ShareReleaseState {
    /// The share rows held, as a snapshot taken now shows them (one bit
    /// per client): committed and not deleted by a committed delete.
    pub fn held(&self) -> u8 {
        self.clients
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c.row, Row::Held | Row::Deleting))
            .fold(0, |bits, (i, _)| bits | 1 << i)
    }

    /// Whether the exclusive acquirer holds the key (committed, and until
    /// its release commits).
    pub fn exclusive_holds(&self) -> bool {
        matches!(self.exclusive, Exclusive::Holding | Exclusive::Releasing)
    }

    /// The transaction holding client `c`'s share row's lock.
    pub fn row_lock(&self, c: u8) -> Option<Txn> {
        let client = &self.clients[usize::from(c)];
        match (client.row, client.renewal) {
            (_, Renewal::Locked | Renewal::Raised) => Some(Txn::Renewal(c)),
            (Row::Inserted, _) => Some(Txn::Acquire(c)),
            (Row::Deleting, _) => Some(Txn::Release(c)),
            _ => None,
        }
    }

    /// The transaction that `t` waits for: the holder of the lock its next
    /// statement needs, if another holds it.
    pub fn waits_for(&self, t: Txn) -> Option<Txn> {
        let gate = self.gate_lock.filter(|holder| *holder != t);
        match t {
            Txn::Acquire(c) => (self.clients[usize::from(c)].phase == Phase::Idle).then_some(gate).flatten(),
            Txn::Release(c) => match self.clients[usize::from(c)].phase {
                Phase::Releasing { next: ReleaseStep::LockGate, .. } => gate,
                Phase::Releasing { next: ReleaseStep::Delete | ReleaseStep::DeleteCommit, .. } => {
                    self.row_lock(c).filter(|holder| *holder != t)
                }
                // A client that holds may send its release at any step; until
                // its first statement runs, the release holds no lock, so it
                // is in no cycle.
                _ => None,
            },
            Txn::Renewal(c) => match self.clients[usize::from(c)].renewal {
                Renewal::Waiting => self.row_lock(c),
                Renewal::Locked => gate,
                Renewal::Idle | Renewal::Raised => None,
            },
            Txn::Exclusive => matches!(self.exclusive, Exclusive::Idle | Exclusive::Holding).then_some(gate).flatten(),
        }
    }

    /// A cycle in the wait-for graph, if there is one: transactions each
    /// waiting for a lock the next one holds, the last for the first's.
    pub fn deadlock(&self) -> Option<Vec<Txn>> {
        let mut txns = vec![Txn::Exclusive];
        for c in 0..self.clients.len() as u8 {
            txns.extend([Txn::Acquire(c), Txn::Release(c), Txn::Renewal(c)]);
        }
        txns.iter().find_map(|&start| {
            let mut cycle = vec![start];
            let mut at = start;
            for _ in 0..txns.len() {
                at = self.waits_for(at)?;
                if at == start {
                    return Some(cycle);
                }
                cycle.push(at);
            }
            None
        })
    }

    /// Whether the gate covers the shares: up if any is held, or its lock
    /// held (a transaction between its write and its commit).
    pub fn gate_covers(&self) -> bool {
        self.gate_lock.is_some() || self.held() == 0 || self.gate == Gate::Up
    }
}

impl fmt::Display for Txn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Acquire(c) => write!(f, "{}'s acquire", client_name(*c)),
            Self::Release(c) => write!(f, "{}'s release", client_name(*c)),
            Self::Renewal(c) => write!(f, "{}'s renewal", client_name(*c)),
            Self::Exclusive => write!(f, "X"),
        }
    }
}

impl fmt::Display for AcquireStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::LockGate => "locks the gate row",
            Self::Grant => "reads the gate and the shares; inserts its share and raises the gate unless X holds",
            Self::Commit => "commits",
        })
    }
}

impl fmt::Display for ReleaseStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Snapshot => "takes its statement's snapshot",
            Self::DeleteCommit => "deletes its share row and commits",
            Self::Delete => "deletes its share row (its lock held)",
            Self::LockGate => "locks the gate row",
            Self::TryGate => "tries the gate row's lock (SKIP LOCKED)",
            Self::ReadFresh => "reads the shares in a fresh snapshot",
            Self::ReadInSnapshot => "reads the shares in its statement's snapshot",
            Self::WriteGate => "writes the gate",
            Self::Commit => "commits",
        })
    }
}

impl fmt::Display for ShareReleaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gate {:?}", self.gate)?;
        if let Some(holder) = self.gate_lock {
            write!(f, " (locked by {holder})")?;
        }
        write!(
            f,
            "; X {}",
            match self.exclusive {
                Exclusive::Idle => "idle",
                Exclusive::Acquiring { granted: true } => "took the key, commit next",
                Exclusive::Acquiring { granted: false } => "refused, commit next",
                Exclusive::Holding => "holds",
                Exclusive::Releasing => "released the key, commit next",
            }
        )?;
        for (i, c) in self.clients.iter().enumerate() {
            write!(f, "; {}: ", client_name(i as u8))?;
            match c.phase {
                Phase::Idle => write!(f, "idle")?,
                Phase::Acquiring { next } => write!(f, "acquiring, next: {next:?}")?,
                Phase::Holding => write!(f, "holds")?,
                Phase::Releasing { next, second_call } => {
                    write!(f, "releasing{}, next: {next:?}", if second_call { " (second call)" } else { "" })?
                }
            }
            write!(f, ", row {:?}", c.row)?;
            match c.renewal {
                Renewal::Idle => {}
                Renewal::Waiting => write!(f, ", renewal waits for the row")?,
                Renewal::Locked => write!(f, ", renewal holds the row")?,
                Renewal::Raised => write!(f, ", renewal holds the row and the gate")?,
            }
            if let Some(bits) = c.snapshot {
                let rows: String =
                    (0..self.clients.len() as u8).filter(|j| bits & 1 << j != 0).map(client_name).collect();
                write!(f, ", snapshot shows [{rows}]")?;
            }
            if let Some(seen) = c.seen {
                write!(f, ", read {}", if seen { "a share held" } else { "no share" })?;
            }
        }
        Ok(())
    }
}
