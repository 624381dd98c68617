//! The distributed mutex: a [`Lock`] of one exclusive lease, with the
//! options only a mutex has (fair, reentrant).

use crate::guard::MutexKind;
use crate::lock::Lock;

/// A named distributed mutex. Cheap to clone; holds no lock by itself. The
/// acquire and builder methods are [`Lock`]'s.
///
/// ```no_run
/// # async fn demo() -> holdfast::Result<()> {
/// use std::time::Duration;
/// let client = holdfast::Client::connect("sqlite:///tmp/holdfast-doc.db").await?;
/// let lock = client.mutex("reports/nightly").ttl(Duration::from_secs(10));
/// let guard = lock.acquire_timeout(Duration::from_secs(3)).await?;
/// println!("fence {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub type Mutex = Lock<MutexKind>;

impl Lock<MutexKind> {
    /// Asks for grants in request order; acquiring fails with
    /// [`Error::Unsupported`](crate::Error::Unsupported) on a store that cannot queue.
    pub fn fair(mut self, fair: bool) -> Self {
        self.opts.fair = fair;
        self
    }

    /// Makes the lock reentrant for `owner`: while a guard of this owner lives,
    /// further acquisitions by the same owner through the same client return
    /// at once with the same fence, and the key is freed only when every
    /// guard is gone. Async tasks have no thread identity, so the owner is an
    /// explicit value (a job id, a request id).
    pub fn reentrant(mut self, owner: impl Into<String>) -> Self {
        self.opts.owner = Some(owner.into());
        self
    }
}
