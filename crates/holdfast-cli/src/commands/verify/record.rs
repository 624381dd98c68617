//! The history `verify` records: one JSON object per line in
//! `history.jsonl`, each with the time it happened, `t`, in microseconds of
//! CLOCK_MONOTONIC since the run started (see [`clock`](super::clock)).

use serde::{Deserialize, Serialize};

use crate::cli::{FaultKind, Primitive};

/// Microseconds since the run started, on CLOCK_MONOTONIC.
pub type Micros = i64;

/// One thing that happened during a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Record {
    /// The run started (parent).
    Start {
        /// When.
        t: Micros,
        /// The store's name.
        store: String,
        /// The lease TTL, µs.
        ttl: Micros,
        /// How long the store keeps a dead holder's lease, µs, where that is
        /// longer than the TTL (etcd: whole seconds, at least its minimum); 0: the TTL.
        #[serde(default)]
        expiry: Micros,
        /// Lanes (worker slots).
        workers: u32,
        /// The faults asked for.
        faults: Vec<FaultKind>,
        /// With `--spawn`: whether the store keeps its locks over a restart
        /// (`None`: not restartable here, or not spawned).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        restart_keeps_state: Option<bool>,
        /// The primitive the workers exercise (histories from before
        /// `--primitive` are the mutex's).
        #[serde(default)]
        primitive: Primitive,
        /// The semaphore's permit count (0 for other primitives).
        #[serde(default)]
        permits: u32,
    },
    /// A worker process started in `lane` (parent).
    Spawn {
        /// When.
        t: Micros,
        /// Its lane.
        lane: u32,
        /// Its process id.
        pid: u32,
    },
    /// An acquire returned a grant (worker).
    Grant {
        /// When the acquire returned.
        t: Micros,
        /// The worker's lane.
        lane: u32,
        /// The worker's process id.
        pid: u32,
        /// The grant's fence.
        fence: u64,
        /// The local lease deadline then (for a leader, whose lease deadline
        /// the library does not show: the moment it last saw itself leading).
        deadline: Micros,
        /// What it holds (a mutex's, a writer's and a leader's grants: the key alone).
        #[serde(default, skip_serializing_if = "GrantHold::is_exclusive")]
        hold: GrantHold,
    },
    /// A holder of a shared grant (a reader, a semaphore's permits) checked
    /// that its lease is still held (worker). Shared holders write nothing to
    /// the fenced register; this stands in for a write's proof of belief.
    Holding {
        /// When it checked.
        t: Micros,
        /// Its lane.
        lane: u32,
        /// Its process id.
        pid: u32,
        /// The grant's fence.
        fence: u64,
        /// The local lease deadline then.
        deadline: Micros,
    },
    /// A write reached the fenced register and was decided (parent).
    Write {
        /// When the register decided.
        t: Micros,
        /// When the worker checked its lease and sent it.
        issued: Micros,
        /// The writer's lane.
        lane: u32,
        /// The writer's process id.
        pid: u32,
        /// The fence it carried.
        fence: u64,
        /// The writer's local lease deadline when it sent the write.
        deadline: Micros,
        /// Whether the register took it.
        accepted: bool,
        /// The highest fence the register had accepted before it.
        highest: u64,
    },
    /// The worker saw its lease lost: `lost()` fired or the lease check
    /// before a write failed (worker).
    Lost {
        /// When it saw it.
        t: Micros,
        /// Its lane.
        lane: u32,
        /// Its process id.
        pid: u32,
        /// The grant's fence.
        fence: u64,
        /// The local lease deadline.
        deadline: Micros,
    },
    /// The worker is about to release (worker): its belief ends here, so
    /// it is sent before the store is asked (a worker killed while its
    /// release is in flight has already said it let go).
    Release {
        /// When it started.
        t: Micros,
        /// Its lane.
        lane: u32,
        /// Its process id.
        pid: u32,
        /// The grant's fence.
        fence: u64,
        /// The local lease deadline when it started.
        deadline: Micros,
    },
    /// The release's outcome (worker).
    Released {
        /// When the store answered.
        t: Micros,
        /// Its lane.
        lane: u32,
        /// Its process id.
        pid: u32,
        /// The grant's fence.
        fence: u64,
        /// Whether the store confirmed the grant was still held.
        ok: bool,
    },
    /// A store call failed (worker).
    Error {
        /// When.
        t: Micros,
        /// Its lane.
        lane: u32,
        /// Its process id.
        pid: u32,
        /// The error.
        message: String,
    },
    /// A fault was injected (parent). A pause has a start (SIGSTOP) and an
    /// end (SIGCONT) record, so do server faults (`pid` 0; `lane` is the
    /// ensemble member for `leader`).
    Fault {
        /// When.
        t: Micros,
        /// Which fault.
        kind: FaultKind,
        /// The target's lane.
        lane: u32,
        /// The target's process id.
        pid: u32,
        /// `start` or `end` (`end` only for pauses).
        phase: Phase,
        /// Whether the target believed it held the lock when hit.
        holder: bool,
    },
    /// A worker process exited (parent).
    Exit {
        /// When the parent saw it.
        t: Micros,
        /// Its lane.
        lane: u32,
        /// Its process id.
        pid: u32,
        /// Its exit status, or the signal that ended it.
        status: String,
    },
    /// The run ended (parent): the workers were told to stop at `t`.
    End {
        /// When.
        t: Micros,
    },
}

/// What a grant holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrantHold {
    /// The key alone: a mutex, a writer, a leader.
    #[default]
    Exclusive,
    /// A read-write lock's read side, shared with other readers.
    Read,
    /// This many of a semaphore's permits.
    Permits(u32),
}

impl GrantHold {
    /// Whether the grant excludes every other.
    pub fn is_exclusive(&self) -> bool {
        *self == GrantHold::Exclusive
    }

    /// The property checker's name for it.
    pub fn hold(self) -> holdfast_verify::properties::Hold {
        use holdfast_verify::properties::Hold;
        match self {
            GrantHold::Exclusive => Hold::Exclusive,
            GrantHold::Read => Hold::Read,
            GrantHold::Permits(n) => Hold::Permits(n),
        }
    }
}

/// Which edge of a fault a record marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The fault began (SIGKILL, SIGSTOP).
    Start,
    /// The fault ended (SIGCONT).
    End,
}

impl Record {
    /// When it happened.
    pub fn t(&self) -> Micros {
        match self {
            Record::Start { t, .. }
            | Record::Spawn { t, .. }
            | Record::Grant { t, .. }
            | Record::Holding { t, .. }
            | Record::Write { t, .. }
            | Record::Lost { t, .. }
            | Record::Release { t, .. }
            | Record::Released { t, .. }
            | Record::Error { t, .. }
            | Record::Fault { t, .. }
            | Record::Exit { t, .. }
            | Record::End { t } => *t,
        }
    }
}

/// Parses `history.jsonl`.
pub fn parse(text: &str) -> Result<Vec<Record>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("history line {}: {e}", i + 1)))
        .collect()
}
