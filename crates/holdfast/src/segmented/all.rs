//! Every segment at once: [`Segmented::lock_all`], for exact totals and
//! moves of stock between segments.

use super::{AllSegmentsGuard, Segmented};
use crate::multi::MultiLock;
use crate::vocabulary::error::Result;

impl Segmented {
    /// The [`MultiLock`] over every segment, with this handle's options.
    fn all(&self) -> MultiLock {
        let mut all = self.client.multi(self.keys.iter().cloned()).ttl(self.opts.ttl);
        if let Some(every) = self.opts.renew_every {
            all = all.renew_every(every);
        }
        if let Some(max_hold) = self.opts.max_hold {
            all = all.max_hold(max_hold);
        }
        if !self.opts.auto_renew {
            all = all.no_renew();
        }
        all
    }

    /// Takes every segment at once, for an exact total or a move of stock
    /// between segments (see [Totals](Segmented#totals-across-segments)):
    /// a [`MultiLock`] over the segments' keys, taken in its canonical order,
    /// all or nothing, at most the [`wait_timeout`](Self::wait_timeout) in
    /// all if set.
    ///
    /// # Errors
    ///
    /// As for [`MultiLock::acquire`]; every segment already taken is
    /// released before an error is returned.
    ///
    /// # Cancel safety
    ///
    /// As for [`MultiLock::acquire`]: dropping the future at any await
    /// point leaves no grant and no queue entry behind.
    pub async fn lock_all(&self) -> Result<AllSegmentsGuard> {
        let all = self.all();
        let guard = match self.opts.wait_timeout {
            Some(timeout) => all.acquire_timeout(timeout).await?,
            None => all.acquire().await?,
        };
        AllSegmentsGuard::new(&self.key, guard)
    }

    /// One attempt at every segment: the guard if all were free, `None` as
    /// soon as one is busy (the segments taken before it are released
    /// first).
    ///
    /// # Cancel safety
    ///
    /// As for [`MultiLock::try_acquire`].
    pub async fn try_lock_all(&self) -> Result<Option<AllSegmentsGuard>> {
        match self.all().try_acquire().await? {
            Some(guard) => AllSegmentsGuard::new(&self.key, guard).map(Some),
            None => Ok(None),
        }
    }
}
