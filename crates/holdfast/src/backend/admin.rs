//! What the store contract says of admin calls: what a forced release
//! removed, and the listing of stores that can only name their keys.

/// What [`Client::force_release`](crate::Client::force_release) (and [`Backend::force_release`](super::Backend::force_release))
/// removed from a key: the fences of the leases that were held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForceReleased {
    /// The fence of the exclusive lease (a mutex, a writer), if one was held.
    pub exclusive: Option<u64>,
    /// The fences of the shared leases (semaphore permits, readers) that
    /// were held, lowest first.
    pub shared: Vec<u64>,
}

impl ForceReleased {
    /// Nothing was held: the key was free.
    pub fn free() -> Self {
        ForceReleased::default()
    }

    /// Whether the key was free (no lease was removed).
    pub fn was_free(&self) -> bool {
        self.exclusive.is_none() && self.shared.is_empty()
    }

    /// The highest fence removed, if any: every later grant of the key gets
    /// a fence above it.
    pub fn highest(&self) -> Option<u64> {
        self.exclusive.into_iter().chain(self.shared.iter().copied()).max()
    }

    /// Every fence removed, the exclusive one first.
    pub fn fences(&self) -> impl Iterator<Item = u64> + '_ {
        self.exclusive.into_iter().chain(self.shared.iter().copied())
    }

    /// Records a removed lease (for store implementations).
    pub fn add(&mut self, fence: u64, exclusive: bool) {
        if exclusive {
            self.exclusive = Some(self.exclusive.map_or(fence, |f| f.max(fence)));
        } else {
            self.shared.push(fence);
            self.shared.sort_unstable();
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// The status of each listed key that is still held (a key the store
/// listed may be freed before its status is read), skipping names that are
/// not valid keys: the list of the stores that can only name the keys.
pub(crate) async fn held_statuses(
    backend: &(impl super::Backend + ?Sized),
    keys: impl IntoIterator<Item = String>,
) -> crate::vocabulary::error::Result<Vec<super::LockStatus>> {
    let mut out = Vec::new();
    for key in keys {
        let Ok(key) = crate::vocabulary::key::LockKey::new(key) else { continue };
        let status = backend.status(&key).await?;
        if status.holder.is_some() || !status.shared.is_empty() {
            out.push(status);
        }
    }
    Ok(out)
}
