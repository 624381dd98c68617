//! The share hand-over model's transitions: the store's grant, release and
//! hand-over (`share_acquire.lua`, `share_release.lua`, `share_hand_over.lua`
//! as the server runs them), a task's attempt, and what the releaser and the
//! waiter do with the hand-over's reply.

use super::state::{Admission, Entry, Flight, Outcome, ShareHandOverState, Stage, Task, Token};
use super::{B0, ShareHandOverModel, ShareHandOverVariant};

impl ShareHandOverModel {
    /// A new permit for `token`: the next fence (or `keep`), a fresh lease.
    pub(super) fn grant(&self, s: &mut ShareHandOverState, token: Token, keep: Option<u8>) -> u8 {
        let fence = keep.unwrap_or(s.store.f + 1);
        if s.top_fence > 0 && fence <= s.top_fence {
            s.fence_went_back = true;
        }
        s.top_fence = s.top_fence.max(fence);
        s.store.f = s.store.f.max(fence);
        s.store.put(Entry { token, held: true, ord: fence, x: s.now + self.ttl });
        fence
    }

    /// A retry of a token that holds a permit: the same fence, a fresh lease.
    pub(super) fn regrant(&self, s: &mut ShareHandOverState, token: Token, fence: u8) {
        s.store.put(Entry { token, held: true, ord: fence, x: s.now + self.ttl });
    }

    /// An owner-checked release of `token`: its permit or reservation goes;
    /// a permit's release is recorded as the key's last (`r`).
    pub(super) fn store_release(s: &mut ShareHandOverState, token: Token) {
        if let Some(e) = s.store.remove(token) {
            if e.held {
                s.store.r = Some(token);
            }
            // release.lua tells the channel after any share's or
            // reservation's removal.
            s.woken = true;
        }
    }

    pub(super) fn attempt(&self, s: &mut ShareHandOverState, t: u8) {
        let Task::Waiting { token, taken, own } = s.tasks[usize::from(t)] else { return };
        if t == B0 {
            s.woken = false;
        }
        let fence = match s.store.admission(token, self.limit) {
            Admission::Held(fence) => {
                self.regrant(s, token, fence);
                fence
            }
            Admission::Grant => {
                let fence = self.grant(s, token, None);
                if t != B0 {
                    s.store.restamp();
                }
                fence
            }
            Admission::Refuse(place) => {
                if t != B0 && self.variant == ShareHandOverVariant::StampClearedByNewClients {
                    s.store.stamp = None;
                }
                let place = place.unwrap_or_else(|| {
                    s.store.f += 1;
                    s.store.f
                });
                s.store.put(Entry { token, held: false, ord: place, x: s.now + self.ttl });
                return;
            }
        };
        let until = s.now + self.ttl;
        s.tasks[usize::from(t)] = if taken {
            Task::Waiting { token, taken, own: Some(own.map_or((fence, until), |(_, u)| (fence, u.min(until)))) }
        } else {
            Task::Holding { token, fence, until }
        };
    }

    /// A new permit for the hand-over's waiter, after the releaser's went:
    /// notes whether it takes a permit owed to B0's reservation ahead.
    /// `read`: the entries were read (not a grant by the stamp), so the
    /// channel may be told and the stamp written.
    pub(super) fn hand(&self, s: &mut ShareHandOverState, to: Token, keep: Option<u8>, read: bool) -> u8 {
        let ahead: Vec<Entry> = s.store.ahead_of(to).copied().collect();
        let fence = self.grant(s, to, keep);
        if read {
            s.store.restamp();
        }
        // The channel is told when the first reservation in line fits
        // beside the permits now held.
        let first = s.store.entries.iter().filter(|e| !e.held).min_by_key(|e| e.ord);
        if read
            && self.variant != ShareHandOverVariant::SilentGrant
            && first.is_some_and(|_| s.store.held() < usize::from(self.limit))
        {
            s.woken = true;
            s.wake_reached = true;
        }
        if ahead.iter().any(|e| e.token.0 == B0) {
            if s.store.held() + ahead.len() > usize::from(self.limit) {
                s.bypassed = true;
            } else {
                s.beside_reached = true;
            }
        }
        fence
    }

    /// The stamp's weight bound, if this design trusts the stamp now.
    pub(super) fn stamp_bound(&self, s: &ShareHandOverState) -> Option<u8> {
        match self.variant {
            ShareHandOverVariant::StampClearedByNewClients => s.store.stamp.map(|(_, zw)| zw),
            _ => s.store.stamped(),
        }
    }

    pub(super) fn apply(&self, s: &mut ShareHandOverState) {
        let Some(mut fl) = s.flight else { return };
        let from = s.store.entry(fl.from).filter(|e| e.held);
        if self.variant == ShareHandOverVariant::MysqlPass {
            fl.outcome = if from.is_some() {
                s.store.remove(fl.from);
                s.store.r = Some(fl.from);
                let reserved = s.store.entries.iter().any(|e| !e.held && e.token != fl.to);
                let own_held = s.store.entry(fl.to).is_some_and(|e| e.held);
                let permits = s.store.entries.iter().filter(|e| e.held).count();
                if !reserved && !own_held && permits < usize::from(self.limit) {
                    Outcome::Handed(self.hand(s, fl.to, None, true))
                } else {
                    s.refused_reached |= reserved;
                    s.woken = true;
                    Outcome::Released
                }
            } else {
                Outcome::Nothing
            };
            s.flight = if fl.stage == Stage::Settled { None } else { Some(fl) };
            return;
        }
        // By the stamp: the releaser's weight out, the waiter's in, within
        // the limit; the waiter's token has no entry (else the entries are
        // read: its own attempt may have been granted).
        let zw = self.stamp_bound(s).filter(|&zw| zw <= self.limit);
        if let (Some(_), Some(zw), None) = (from, zw, s.store.entry(fl.to)) {
            s.store.remove(fl.from);
            s.store.r = Some(fl.from);
            let fence = self.hand(s, fl.to, None, false);
            s.store.stamp = Some((s.store.f, zw));
            s.stamped_reached = true;
            fl.outcome = Outcome::Handed(fence);
            s.flight = if fl.stage == Stage::Settled { None } else { Some(fl) };
            return;
        }
        fl.outcome = if from.is_some() || self.variant == ShareHandOverVariant::NoLeaseCheck {
            s.store.remove(fl.from);
            let keep = from.filter(|_| self.variant == ShareHandOverVariant::KeepFence).map(|e| e.ord);
            match s.store.admission(fl.to, self.limit) {
                // The waiter's own attempt was granted meanwhile: that grant,
                // the releaser's release recorded.
                Admission::Held(fence) => {
                    s.store.r = Some(fl.from);
                    self.regrant(s, fl.to, fence);
                    s.woken = true;
                    Outcome::Handed(fence)
                }
                Admission::Refuse(_) if self.variant != ShareHandOverVariant::SwapIgnoringReservations => {
                    s.store.r = Some(fl.from);
                    s.refused_reached |= from.is_some();
                    s.woken = true;
                    Outcome::Released
                }
                Admission::Grant | Admission::Refuse(_) => {
                    s.store.r = Some(fl.from);
                    Outcome::Handed(self.hand(s, fl.to, keep, true))
                }
            }
        } else {
            match s.store.entry(fl.to) {
                // A copy of a call applied before: the same grant, its
                // lease counted from now.
                Some(e) if e.held && s.store.r == Some(fl.from) => {
                    self.regrant(s, fl.to, e.ord);
                    Outcome::Handed(e.ord)
                }
                _ => Outcome::Nothing,
            }
        };
        s.flight = if fl.stage == Stage::Settled { None } else { Some(fl) };
    }

    /// The waiter learns the call's outcome: `handed` with its fence, or
    /// not (it waits on, or returns its own grant).
    pub(super) fn tell_waiter(&self, s: &mut ShareHandOverState, fl: &Flight, handed: Option<u8>) {
        let Task::Waiting { token, own, .. } = s.tasks[usize::from(fl.waiter)] else { return };
        s.tasks[usize::from(fl.waiter)] = match (handed, own) {
            (Some(fence), _) => {
                let from = if self.variant == ShareHandOverVariant::LeaseFromReply { s.now } else { fl.sent };
                s.handed_reached = true;
                Task::Holding { token, fence, until: from + self.ttl }
            }
            (None, Some((fence, until))) => Task::Holding { token, fence, until },
            (None, None) => Task::Waiting { token, taken: false, own: None },
        };
    }

    pub(super) fn reply(&self, s: &mut ShareHandOverState) {
        let Some(fl) = s.flight else { return };
        s.flight = None;
        match fl.outcome {
            Outcome::Handed(_) if s.tasks[usize::from(fl.waiter)] == Task::Gone => {
                // The oneshot's receiver is gone: release its token.
                Self::store_release(s, fl.to);
            }
            Outcome::Handed(fence) => self.tell_waiter(s, &fl, Some(fence)),
            Outcome::Released => self.tell_waiter(s, &fl, None),
            Outcome::Nothing => {
                Self::store_release(s, fl.from);
                self.tell_waiter(s, &fl, None);
            }
            Outcome::Pending => unreachable!("no reply before the store applied the call"),
        }
    }

    pub(super) fn settle(&self, s: &mut ShareHandOverState) {
        let Some(mut fl) = s.flight else { return };
        let tell_first = self.variant == ShareHandOverVariant::TellBeforeRelease;
        match (fl.stage, tell_first) {
            (Stage::TimedOut, false) | (Stage::Settling, true) => {
                Self::store_release(s, fl.from);
                fl.stage = if tell_first { Stage::Settled } else { Stage::Settling };
            }
            (Stage::Settling, false) | (Stage::TimedOut, true) => {
                if s.tasks[usize::from(fl.waiter)] == Task::Gone {
                    Self::store_release(s, fl.to);
                } else {
                    self.tell_waiter(s, &fl, None);
                }
                fl.stage = if tell_first { Stage::Settling } else { Stage::Settled };
            }
            _ => return,
        }
        s.flight = if fl.stage == Stage::Settled && fl.outcome != Outcome::Pending { None } else { Some(fl) };
    }
}
