//! The model's steps: each action of [`FenceAction`](super::FenceAction)
//! as one atomic change of the state, `None` when it changes nothing.

use super::state::{FenceState, LeaseRow, Share, Token};
use super::{FenceModel, FenceVariant, Kind};

impl FenceModel {
    /// Whether the upgrade renamed the expiry column (old statements that
    /// name it fail).
    pub(super) fn renamed(&self) -> bool {
        self.variant != FenceVariant::NoRename
    }

    pub(super) fn has_old(&self) -> bool {
        self.kinds.contains(&Kind::Old)
    }

    /// Records a grant of `fence` to `c`, before its writes.
    fn grant(s: &mut FenceState, c: u8, fence: u8, shared: bool) {
        if s.live_holder().is_some() || (!shared && s.live_share_besides(None)) {
            s.granted_over_live = true;
        }
        if fence <= s.top_fence {
            s.fence_went_back = true;
        }
        s.top_fence = s.top_fence.max(fence);
        if s.swept {
            s.granted_after_sweep = true;
        }
        s.grants[c as usize] += 1;
    }

    /// `FastGrant`: the autocommit takeover of a row that is not live.
    pub(super) fn fast_grant(s: &mut FenceState, c: u8) -> Option<()> {
        let row = s.row.filter(|r| !r.live)?;
        let fence = row.fence + 1;
        Self::grant(s, c, fence, false);
        if row.token == Token::Released {
            s.granted_over_marker = true;
        }
        s.row = Some(LeaseRow { token: Token::Holder(c), fence, live: true });
        Some(())
    }

    /// `SlowGrant`: the counter drawn, the row inserted; rolled back if a
    /// row exists.
    pub(super) fn slow_grant(s: &mut FenceState, c: u8) -> Option<()> {
        if s.row.is_some() {
            return None;
        }
        let fence = s.counter + 1;
        s.counter = fence;
        Self::grant(s, c, fence, false);
        s.row = Some(LeaseRow { token: Token::Holder(c), fence, live: true });
        Some(())
    }

    /// `Release`: the row becomes the released marker (or, rejected, is
    /// deleted).
    pub(super) fn release(&self, s: &mut FenceState, c: u8) -> Option<()> {
        let row = s.row.filter(|r| r.token == Token::Holder(c))?;
        s.row = if self.variant == FenceVariant::ReleaseDeletes {
            None
        } else {
            Some(LeaseRow { token: Token::Released, fence: row.fence, live: false })
        };
        Some(())
    }

    /// `Expire`: `c`'s lease runs out (its row, or its share and the gate
    /// with it if no other share is live).
    pub(super) fn expire(s: &mut FenceState, c: u8) -> Option<()> {
        if let Some(r) = s.row.as_mut()
            && r.token == Token::Holder(c)
            && r.live
        {
            r.live = false;
            return Some(());
        }
        let share = s.shares[c as usize].as_mut().filter(|sh| sh.live)?;
        share.live = false;
        s.refresh_gate();
        Some(())
    }

    /// `Sweep`: a row that is not live, with no live share, deleted; the
    /// counter raised to its fence.
    pub(super) fn sweep(&self, s: &mut FenceState) -> Option<()> {
        let row = s.row.filter(|r| !r.live)?;
        if s.live_share_besides(None) {
            return None;
        }
        if self.variant != FenceVariant::SweepWithoutRaise {
            s.counter = s.counter.max(row.fence);
        }
        s.row = None;
        s.swept = true;
        Some(())
    }

    /// `ForceRelease` (`raise`: the new layout's; the old one raises
    /// nothing): the row and every held share deleted.
    pub(super) fn force_release(s: &mut FenceState, raise: bool) -> Option<()> {
        if s.row.is_none() && s.shares.iter().all(Option::is_none) {
            return None;
        }
        if raise {
            let shares = s.shares.iter().flatten().map(|sh| sh.fence);
            let top = s.row.map(|r| r.fence).into_iter().chain(shares).max().unwrap_or(0);
            s.counter = s.counter.max(top);
        }
        s.row = None;
        s.shares.iter_mut().for_each(|sh| *sh = None);
        Some(())
    }

    /// `ShareGrant`: unless an exclusive holder is live, a share fenced
    /// from the key's row when it has one (the row's fence + 1, under the
    /// row's lock alone), else from the counter (under the counter's lock,
    /// which every insert of a row takes first); the gate keeps the
    /// greatest fence.
    pub(super) fn share_grant(&self, s: &mut FenceState, c: u8) -> Option<()> {
        if s.live_holder().is_some() {
            return None;
        }
        let row_fence = s.row.map(|r| r.fence);
        let fence = match (self.variant, row_fence) {
            (FenceVariant::SharesFromCounter, _) | (_, None) => s.counter + 1,
            (FenceVariant::SharesUnderCounter, Some(r)) => (s.counter + 1).max(r + 1),
            (_, Some(r)) => r + 1,
        };
        if row_fence.is_some_and(|r| r > s.counter) {
            s.share_over_raised_row = true;
        }
        // Only a draw from the counter moves it.
        let drew = row_fence.is_none()
            || matches!(self.variant, FenceVariant::SharesFromCounter | FenceVariant::SharesUnderCounter);
        if drew {
            s.counter = fence;
        }
        Self::grant(s, c, fence, true);
        let gate_fence = match (self.variant, row_fence) {
            (FenceVariant::SharesFromCounter | FenceVariant::GateOverwrite, _) | (_, None) => fence,
            (FenceVariant::GateNotRaised, Some(r)) => r,
            (_, Some(r)) => r.max(fence),
        };
        s.shares[c as usize] = Some(Share { fence, live: true });
        s.row = Some(LeaseRow { token: Token::Gate, fence: gate_fence, live: true });
        Some(())
    }

    /// `ShareAgain`: `c`'s live share re-acquired; the gate extended and its
    /// fence kept at least the share's.
    pub(super) fn share_again(&self, s: &mut FenceState, c: u8) -> Option<()> {
        let share = s.shares[c as usize].filter(|sh| sh.live)?;
        let gate = s.row.as_mut().filter(|r| r.token == Token::Gate)?;
        gate.fence =
            if self.variant == FenceVariant::GateOverwrite { share.fence } else { gate.fence.max(share.fence) };
        gate.live = true;
        Some(())
    }

    /// `ShareRelease`: `c`'s share deleted; the gate not live if no share is.
    pub(super) fn share_release(s: &mut FenceState, c: u8) -> Option<()> {
        s.shares[c as usize].take()?;
        s.refresh_gate();
        Some(())
    }

    /// `RaiseFence`: a holder of a live lease raises the row's fence to a
    /// floor above every fence so far.
    pub(super) fn raise_fence(&self, s: &mut FenceState, c: u8) -> Option<()> {
        let holds = s.live_holder() == Some(c) || s.shares[c as usize].is_some_and(|sh| sh.live);
        if !holds || s.raises >= self.raises {
            return None;
        }
        let floor = s.top_fence + 2;
        let row = s.row.as_mut()?;
        row.fence = row.fence.max(floor);
        s.top_fence = floor;
        s.raises += 1;
        Some(())
    }

    /// `OldGrant` (unrenamed only): the counter bumped, then a takeover with
    /// it if the row is absent or not live (busy: rolled back, nothing
    /// changed, so not offered).
    pub(super) fn old_grant(s: &mut FenceState, c: u8) -> Option<()> {
        if s.row.is_some_and(|r| r.live) {
            return None;
        }
        s.counter += 1;
        let fence = s.counter;
        Self::grant(s, c, fence, false);
        s.row = Some(LeaseRow { token: Token::Holder(c), fence, live: true });
        Some(())
    }

    /// `OldRelease`: the row deleted if `c` holds it.
    pub(super) fn old_release(s: &mut FenceState, c: u8) -> Option<()> {
        s.row.filter(|r| r.token == Token::Holder(c))?;
        s.row = None;
        Some(())
    }

    /// `OldSweep` (unrenamed only): a row that is not live deleted, the
    /// counter untouched.
    pub(super) fn old_sweep(s: &mut FenceState) -> Option<()> {
        s.row.filter(|r| !r.live)?;
        s.row = None;
        Some(())
    }
}
