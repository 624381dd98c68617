//! The state of the share wake-up model: the gate row (its committed
//! version, the version its lock holder wrote, and who holds its lock),
//! each share holder's release, and each waiter with the notification its
//! listener heard.

use std::fmt;

/// Who the gate row says holds the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    /// The gate token, unexpired: it covers a share held (time is not
    /// modelled: a share's expiry is "up" while it is held).
    Up,
    /// The gate token at the epoch: no share held, as far as a mutex
    /// acquire can tell.
    Down,
    /// Held by a waiter (the writer's grant or the mutex acquire's take):
    /// its token, unexpired, not a gate.
    Waiter(Kind),
    /// Released by a waiter that held it (`token = RELEASED`, expired).
    Released,
}

impl Holder {
    /// Whether a mutex acquire's snapshot shows the row live (`expires_at >
    /// clock_timestamp()` with a token other than its own).
    pub fn live(self) -> bool {
        matches!(self, Self::Up | Self::Waiter(_))
    }
}

/// One version of the gate row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gate {
    /// Its token and expiry.
    pub holder: Holder,
    /// Its `wanted` mark.
    pub wanted: bool,
}

/// The kind of a waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A reserving writer: `<table>_share` with `reserve = true`.
    Writer,
    /// A mutex acquire on the same key: the acquire statement with `w`.
    Exclusive,
}

/// Where one share holder's release is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Share {
    /// Holds its share; its release may start at any step.
    Held,
    /// `Fused`: its delete is done, uncommitted (its row's lock held: every
    /// other transaction still sees the share held); the gate's lock next.
    Deleted {
        /// A notification queued by this transaction so far.
        queued: bool,
    },
    /// `TwoStep`: the delete committed (every later snapshot sees it); the
    /// gate function's call next.
    DeleteCommitted {
        /// The delete's statement sent a notification.
        sent: bool,
    },
    /// Holds the gate's lock and wrote the gate; the commit next.
    Gated {
        /// A notification queued by this transaction.
        queued: bool,
        /// An earlier transaction of this release (`TwoStep`'s delete) sent one.
        sent: bool,
    },
    /// The release committed (both calls, in `TwoStep`).
    Done {
        /// Whether it sent any notification.
        sent: bool,
    },
    /// `TwoStep`: the client ended after its delete committed; the gate
    /// function's call never runs (the gate stays up until the share's
    /// expiry, which is not modelled).
    Stopped {
        /// Whether the delete's statement sent a notification.
        sent: bool,
    },
}

/// Where one waiter is. Its client listens before its first waiting attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Waiter {
    /// About to send a waiting attempt.
    Ready,
    /// As `Ready`: its last attempt's mark was refused by the re-check on
    /// the gate's latest version, which was down (a shrink committed since
    /// its snapshot), and it runs again at once.
    Again,
    /// The mutex acquire's statement took its snapshot: the gate as its
    /// committed version was.
    Snapped(Gate),
    /// The writer's function holds the gate's lock and wrote what it
    /// decided; the commit next.
    Locked {
        /// It took the key (else it reserved its place and marked the gate).
        granted: bool,
        /// Refused by shares whose delete it read uncommitted only.
        behind_deletes: bool,
    },
    /// Told "registered": sleeps until its listener hears a notification
    /// (expiry is not modelled: a waiter only its timer would wake is the
    /// defect looked for).
    Asleep,
    /// Holds the key.
    Holding,
    /// Released the key.
    Done,
}

impl Waiter {
    /// Whether it is still waiting (its listener keeps a notification it
    /// hears for its next sleep).
    pub fn waiting(self) -> bool {
        !matches!(self, Self::Holding | Self::Done)
    }
}

/// A transaction that can hold the gate's lock across a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Txn {
    /// Share holder `i`'s release (its gate part).
    Release(u8),
    /// The writer's attempt (its function).
    Writer,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShareWakeupState {
    /// The gate row's committed version: what a snapshot shows.
    pub gate: Gate,
    /// The version the holder of the gate's lock wrote, until its commit.
    pub pending: Option<Gate>,
    /// The transaction holding the gate's lock.
    pub lock: Option<Txn>,
    /// The share holders, H1 first.
    pub shares: Vec<Share>,
    /// The waiters, the writer first.
    pub waiters: Vec<Slot>,
}

/// One waiter and its client's listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Which waiter.
    pub kind: Kind,
    /// Where it is.
    pub at: Waiter,
    /// A notification its listener heard and it has not used.
    pub heard: bool,
}

impl ShareWakeupState {
    /// The gate row's latest version (what the holder of its lock sees).
    pub fn latest(&self) -> Gate {
        self.pending.unwrap_or(self.gate)
    }

    /// Delivers a committed notification: every waiting client's listener
    /// hears it (and keeps it for its waiter's next sleep).
    pub fn deliver(&mut self) {
        for slot in &mut self.waiters {
            slot.heard |= slot.at.waiting();
        }
    }

    /// Whether every release ended (no share row left, nothing in flight
    /// that could still notify).
    pub fn releases_done(&self) -> bool {
        self.shares.iter().all(|s| matches!(s, Share::Done { .. } | Share::Stopped { .. }))
    }

    /// A waiter asleep with nothing heard while what its admission reads is
    /// gone, every release ended: for W, every share (and X does not hold
    /// the key); for X, the gate's life (the gate down, or released).
    pub fn lost_wakeup(&self) -> Option<Kind> {
        let gone = |kind| match kind {
            Kind::Writer => self.gate.holder != Holder::Waiter(Kind::Exclusive),
            Kind::Exclusive => !self.gate.holder.live(),
        };
        let asleep = |w: &&Slot| w.at == Waiter::Asleep && !w.heard && gone(w.kind);
        self.waiters.iter().find(asleep).filter(|_| self.releases_done()).map(|w| w.kind)
    }

    /// Whether a share is held as every other transaction sees it: its row
    /// there, its delete not committed (`fused`: until the release commits).
    pub fn share_present(&self, i: usize, fused: bool) -> bool {
        match self.shares[i] {
            Share::Held => true,
            Share::Deleted { .. } | Share::Gated { .. } => fused,
            Share::DeleteCommitted { .. } | Share::Done { .. } | Share::Stopped { .. } => false,
        }
    }

    /// Whether a waiter holds the key (committed).
    pub fn waiter_holds(&self) -> bool {
        self.waiters.iter().any(|w| w.at == Waiter::Holding)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Writer => "W",
            Self::Exclusive => "X",
        })
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.holder {
            Holder::Up => write!(f, "up")?,
            Holder::Down => write!(f, "down")?,
            Holder::Waiter(w) => write!(f, "held by {w}")?,
            Holder::Released => write!(f, "released")?,
        }
        write!(f, "{}", if self.wanted { ", wanted" } else { "" })
    }
}

impl fmt::Display for ShareWakeupState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gate [{}]", self.gate)?;
        if let Some(pending) = self.pending {
            write!(f, " (uncommitted [{pending}])")?;
        }
        if let Some(holder) = self.lock {
            write!(
                f,
                " locked by {}",
                match holder {
                    Txn::Release(i) => format!("H{}'s release", i + 1),
                    Txn::Writer => "W".to_owned(),
                }
            )?;
        }
        for (i, share) in self.shares.iter().enumerate() {
            write!(f, "; H{}: ", i + 1)?;
            match share {
                Share::Held => write!(f, "holds")?,
                Share::Deleted { queued } => write!(f, "deleted (uncommitted{})", notify_text(*queued))?,
                Share::DeleteCommitted { sent } => write!(f, "delete committed{}", sent_text(*sent))?,
                Share::Gated { queued, sent } => {
                    write!(f, "gate written (uncommitted{}){}", notify_text(*queued), sent_text(*sent))?
                }
                Share::Done { sent } => write!(f, "released{}", sent_text(*sent))?,
                Share::Stopped { sent } => write!(f, "client ended before the gate call{}", sent_text(*sent))?,
            }
        }
        for w in &self.waiters {
            write!(f, "; {}: ", w.kind)?;
            match w.at {
                Waiter::Snapped(seen) => write!(f, "snapshot shows [{seen}]")?,
                Waiter::Locked { granted, .. } => {
                    write!(f, "{}, commit next", if granted { "took the key" } else { "reserved" })?
                }
                at => write!(f, "{at:?}")?,
            }
            write!(f, "{}", if w.heard { " (heard a NOTIFY)" } else { "" })?;
        }
        Ok(())
    }
}

fn notify_text(queued: bool) -> &'static str {
    if queued { ", NOTIFY queued" } else { "" }
}

fn sent_text(sent: bool) -> &'static str {
    if sent { ", notified" } else { "" }
}
