//! The guards of a segmented lock: one segment ([`SegmentGuard`]) or every
//! segment at once ([`AllSegmentsGuard`]).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::guard::MutexGuard;
use crate::multi::MultiGuard;
use crate::vocabulary::error::{Error, Result};

/// One held segment of a [`Segmented`](super::Segmented) lock: which
/// segment, and its [`MutexGuard`]. Dropping it releases the segment.
///
/// `Send` and `Sync`, and `'static`, like every guard.
///
/// # Drop
///
/// As for [`MutexGuard`]: prefer [`release`](Self::release); a guard
/// dropped without it releases in the background when a tokio runtime is
/// running, else the lease runs out.
#[must_use = "the segment is released when the guard is dropped"]
#[clippy::has_significant_drop]
pub struct SegmentGuard {
    segment: usize,
    guard: MutexGuard,
}

impl fmt::Debug for SegmentGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentGuard").field("segment", &self.segment).field("guard", &self.guard).finish()
    }
}

impl SegmentGuard {
    pub(super) fn new(segment: usize, guard: MutexGuard) -> Self {
        SegmentGuard { segment, guard }
    }

    /// The index of the segment held, `0..n`.
    pub fn segment(&self) -> usize {
        self.segment
    }

    /// The segment's fencing token: above every earlier fence of this
    /// segment (not comparable with other segments' fences).
    pub fn fence(&self) -> u64 {
        self.guard.fence()
    }

    /// The segment's lock key, `{key}/seg-{segment}`.
    pub fn key(&self) -> &str {
        self.guard.key()
    }

    /// Whether the segment's lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Resolves when the segment's lease is lost (see [`MutexGuard::lost`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only observes the lease; dropping it changes nothing.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// Resolves when the lease can no longer be guaranteed to last another
    /// `within` (see [`MutexGuard::expiring`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only observes the lease; dropping it changes nothing.
    pub fn expiring(&self, within: Duration) -> impl Future<Output = ()> + Send + 'static {
        self.guard.expiring(within)
    }

    /// The segment's mutex guard: its token, TTL and the rest.
    pub fn mutex_guard(&self) -> &MutexGuard {
        &self.guard
    }

    /// The segment's mutex guard, owned.
    pub fn into_mutex_guard(self) -> MutexGuard {
        self.guard
    }

    /// Releases the segment, owner-checked, as [`MutexGuard::release`]:
    /// [`Error::Lost`] if the lease had run out or been taken over.
    ///
    /// # Cancel safety
    ///
    /// As for [`MutexGuard::release`]: once polled, the release runs on a
    /// task of its own.
    pub async fn release(self) -> Result<()> {
        self.guard.release().await
    }
}

/// Every segment of a [`Segmented`](super::Segmented) lock, held at once
/// by [`lock_all`](super::Segmented::lock_all): while it lives no one else
/// holds any segment, so a total read or a move of stock between segments
/// is exact. Dropping it releases every segment.
///
/// `Send` and `Sync`, and `'static`, like every guard.
///
/// # Drop
///
/// As for [`MultiGuard`]: prefer [`release`](Self::release).
#[must_use = "every segment is released when the guard is dropped"]
#[clippy::has_significant_drop]
pub struct AllSegmentsGuard {
    /// Segment `i`'s fence at `i`.
    fences: Vec<u64>,
    multi: MultiGuard,
}

impl fmt::Debug for AllSegmentsGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllSegmentsGuard").field("fences", &self.fences).finish_non_exhaustive()
    }
}

impl AllSegmentsGuard {
    pub(super) fn new(key: &str, multi: MultiGuard) -> Result<Self> {
        let prefix = format!("{key}/seg-");
        let mut fences = vec![0; multi.parts().len()];
        for (part, fence) in multi.fences() {
            let index = part.strip_prefix(&prefix).and_then(|i| i.parse::<usize>().ok());
            match index.and_then(|i| fences.get_mut(i)) {
                Some(slot) => *slot = fence,
                None => {
                    return Err(Error::backend("holdfast", false, format!("{part:?} is not a segment of {key:?}")));
                }
            }
        }
        Ok(AllSegmentsGuard { fences, multi })
    }

    /// How many segments are held (all of them).
    pub fn segments(&self) -> usize {
        self.fences.len()
    }

    /// Each segment's fence, by segment index.
    pub fn fences(&self) -> &[u64] {
        &self.fences
    }

    /// Segment `index`'s fence; `None` out of range.
    pub fn fence(&self, index: usize) -> Option<u64> {
        self.fences.get(index).copied()
    }

    /// Whether any segment's lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.multi.is_lost()
    }

    /// Resolves when any segment's lease is lost (see [`MultiGuard::lost`]):
    /// a total read after that may have missed a buyer.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only observes the leases; dropping it changes nothing.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.multi.lost()
    }

    /// The multi-lock guard over the segments' keys, for each part's guard.
    pub fn multi_guard(&self) -> &MultiGuard {
        &self.multi
    }

    /// Releases every segment, as [`MultiGuard::release`]: the first error
    /// ([`Error::Lost`] if a segment's lease had run out: what was read or
    /// moved under it may not be exact).
    ///
    /// # Cancel safety
    ///
    /// As for [`MultiGuard::release`].
    pub async fn release(self) -> Result<()> {
        self.multi.release().await
    }
}

/// Both guards move between tasks and threads, as every guard does.
const _: fn() = || {
    fn send_sync_static<T: Send + Sync + 'static>() {}
    send_sync_static::<SegmentGuard>();
    send_sync_static::<AllSegmentsGuard>();
    send_sync_static::<super::Segmented>();
};
