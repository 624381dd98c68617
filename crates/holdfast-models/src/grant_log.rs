//! The order in which clients counted themselves granted, and whether fences
//! followed it.
//!
//! A property sees one state, not a transition, so the log keeps what the
//! "fences increase in grant order" property needs: the highest fence granted
//! so far and a flag set by the first grant whose fence was not above it.

/// What the models remember of past grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GrantLog<F> {
    grants: u8,
    first_fence: Option<F>,
    highest_fence: Option<F>,
    fence_regressed: bool,
}

impl<F> Default for GrantLog<F> {
    fn default() -> Self {
        Self { grants: 0, first_fence: None, highest_fence: None, fence_regressed: false }
    }
}

impl<F: Ord + Copy> GrantLog<F> {
    /// Records a grant with `fence`; returns its number in grant order.
    pub fn record(&mut self, fence: F) -> u8 {
        if self.highest_fence.is_some_and(|highest| fence <= highest) {
            self.fence_regressed = true;
        }
        self.first_fence = self.first_fence.or(Some(fence));
        self.highest_fence = Some(self.highest_fence.map_or(fence, |highest| highest.max(fence)));
        let number = self.grants;
        self.grants = self.grants.saturating_add(1);
        number
    }

    /// True once some grant's fence was not above every earlier grant's fence.
    pub fn fence_regressed(&self) -> bool {
        self.fence_regressed
    }

    /// The first grant's fence.
    pub fn first_fence(&self) -> Option<F> {
        self.first_fence
    }

    /// The highest fence granted so far.
    pub fn highest_fence(&self) -> Option<F> {
        self.highest_fence
    }

    /// How many grants were made.
    pub fn grants(&self) -> u8 {
        self.grants
    }
}
