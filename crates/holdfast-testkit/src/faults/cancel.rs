//! Dropping a future at a chosen suspension point, and at each one in turn.
//!
//! A future is cancelled in Rust by dropping it, and that can only happen
//! where it is suspended: after a poll that returned `Pending`. [`cancel_at`]
//! wraps a future, counts those suspensions, and drops the future right
//! after its n-th one, without waiting for it to be woken: the request it
//! was waiting on is then in flight, which is when a lost grant or a stale
//! queue entry is left behind. [`cancel_at_each_suspension`] runs an
//! operation again and again with n = 1, 2, 3, ... until it completes before
//! its n-th suspension, and checks after every drop that nothing was left
//! behind. The counts depend on timing (a reply that is already there does
//! not suspend), so each run explores the suspension points it met; running
//! n up to completion covers every point the operation reached.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future that drops `F` right after its n-th suspension; see [`cancel_at`].
#[must_use = "futures do nothing unless polled"]
pub struct CancelAt<F: Future> {
    inner: Option<Pin<Box<F>>>,
    suspensions: u32,
    drop_at: u32,
}

impl<F: Future> std::fmt::Debug for CancelAt<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelAt")
            .field("running", &self.inner.is_some())
            .field("suspensions", &self.suspensions)
            .field("drop_at", &self.drop_at)
            .finish()
    }
}

/// Runs `future` until it completes (`Some(output)`) or until its poll has
/// returned `Pending` `n` times; then it is dropped at once (`None`), inside
/// the same poll, so it is cancelled at exactly that suspension point.
///
/// `n` must be at least 1 (a future is never suspended before its first
/// poll; to drop one unpolled, just drop it).
pub fn cancel_at<F: Future>(future: F, n: u32) -> CancelAt<F> {
    assert!(n >= 1, "cancel_at: n counts suspensions and starts at 1");
    CancelAt { inner: Some(Box::pin(future)), suspensions: 0, drop_at: n }
}

impl<F: Future> CancelAt<F> {
    /// How many times the wrapped future has returned `Pending` so far.
    pub fn suspensions(&self) -> u32 {
        self.suspensions
    }
}

impl<F: Future> Future for CancelAt<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // `CancelAt` is Unpin: the inner future is pinned in its own box.
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            // Polled again after it finished or was dropped: nothing to run.
            return Poll::Ready(None);
        };
        match inner.as_mut().poll(cx) {
            Poll::Ready(output) => {
                this.inner = None;
                Poll::Ready(Some(output))
            }
            Poll::Pending => {
                this.suspensions += 1;
                if this.suspensions >= this.drop_at {
                    this.inner = None;
                    Poll::Ready(None)
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

/// What [`cancel_at_each_suspension`] did.
#[derive(Debug)]
pub struct Sweep<T> {
    /// How many runs were dropped (and checked): one per suspension point
    /// before the run that completed, or `cap` if none did.
    pub drops: u32,
    /// The output of the run that completed before being dropped; `None` if
    /// the operation was still suspending at the cap.
    pub output: Option<T>,
}

/// Drops an operation at its first suspension, then a fresh run of it at its
/// second, and so on, until a run completes before its n-th suspension (or n
/// passes `cap`); after every drop, `check(n)` verifies that the dropped run
/// left nothing behind (it should panic if it did).
///
/// `prepare(n)` sets up run n and returns the operation's future: only that
/// future's suspensions are counted, so setup (taking a lock someone else
/// must hold, say) does not shift the count.
///
/// # Cancel safety
///
/// Dropping the sweep drops the run in progress, like any other drop of it;
/// nothing else is left running.
pub async fn cancel_at_each_suspension<T, F>(
    cap: u32,
    mut prepare: impl AsyncFnMut(u32) -> F,
    mut check: impl AsyncFnMut(u32),
) -> Sweep<T>
where
    F: Future<Output = T>,
{
    for n in 1..=cap {
        let operation = prepare(n).await;
        match cancel_at(operation, n).await {
            Some(output) => return Sweep { drops: n - 1, output: Some(output) },
            None => check(n).await,
        }
    }
    Sweep { drops: cap, output: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A future that suspends `k` times (waking itself) and then returns `k`.
    async fn suspend(k: u32, done: &Cell<bool>) -> u32 {
        for _ in 0..k {
            tokio::task::yield_now().await;
        }
        done.set(true);
        k
    }

    #[tokio::test]
    async fn drops_at_the_nth_suspension_or_completes() {
        let done = Cell::new(false);
        assert_eq!(cancel_at(suspend(3, &done), 1).await, None);
        assert!(!done.get());
        assert_eq!(cancel_at(suspend(3, &done), 3).await, None, "dropped at its third (last) suspension");
        assert!(!done.get());
        assert_eq!(cancel_at(suspend(3, &done), 4).await, Some(3));
        assert!(done.get());
        assert_eq!(cancel_at(suspend(0, &done), 1).await, Some(0), "never suspends: completes");
    }

    #[tokio::test]
    async fn sweep_checks_every_drop_then_completes() {
        let done = Cell::new(false);
        let checked = Cell::new(Vec::new());
        let sweep = cancel_at_each_suspension(
            10,
            async |_| suspend(4, &done),
            async |n| {
                let mut seen = checked.take();
                seen.push(n);
                checked.set(seen);
            },
        )
        .await;
        assert_eq!((sweep.drops, sweep.output), (4, Some(4)));
        assert_eq!(checked.take(), vec![1, 2, 3, 4]);

        let capped = cancel_at_each_suspension(2, async |_| suspend(5, &done), async |_| {}).await;
        assert_eq!((capped.drops, capped.output), (2, None));
    }
}
