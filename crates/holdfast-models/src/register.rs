//! A fenced register: the resource a lock protects.
//!
//! It remembers the highest fence it accepted and refuses lower ones (an equal
//! fence is accepted, so one holder may write twice). That is all a fencing
//! resource can do; whether it is enough depends on the lock's fences, which is
//! what the property built on it checks: the register must never accept a
//! write from a grant older (in grant order) than a grant whose write it already
//! accepted. That "stale write" is what fencing exists to refuse.

/// The register's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencedRegister<F> {
    highest_fence: Option<F>,
    newest_writer: Option<u8>,
    stale_write_accepted: bool,
}

impl<F> Default for FencedRegister<F> {
    fn default() -> Self {
        Self { highest_fence: None, newest_writer: None, stale_write_accepted: false }
    }
}

impl<F: Ord + Copy> FencedRegister<F> {
    /// A write carrying `fence` from the grant numbered `grant` (grants are
    /// numbered in the order clients counted themselves granted). Returns
    /// whether the register accepted it.
    pub fn write(&mut self, fence: F, grant: u8) -> bool {
        if self.highest_fence.is_some_and(|highest| fence < highest) {
            return false;
        }
        if self.newest_writer.is_some_and(|newest| grant < newest) {
            self.stale_write_accepted = true;
        }
        self.highest_fence = Some(fence);
        self.newest_writer = Some(self.newest_writer.map_or(grant, |newest| newest.max(grant)));
        true
    }

    /// True once the register accepted a write from a grant older than one
    /// whose write it had already accepted.
    pub fn stale_write_accepted(&self) -> bool {
        self.stale_write_accepted
    }

    /// The highest fence accepted so far.
    pub fn highest_fence(&self) -> Option<F> {
        self.highest_fence
    }
}
