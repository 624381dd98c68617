//! Releasing a grant, or an abandoned attempt, so that nothing is left
//! behind: a caller whose future is dropped cannot cancel a release half-way
//! (the release goes on, or is sent again, on a task of its own), and a
//! release that fails while the store is unreachable is retried in the
//! background until it succeeds or the grant can no longer exist.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::Backend;
use crate::lease::state::{Horizon, LeaseState};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};
use crate::vocabulary::metrics::Op;

/// The longest a failing release is retried when nothing else bounds it.
const MAX_RETRY: Duration = Duration::from_secs(3600);
/// Delays between retries: doubling from the first to the last, jittered.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const LAST_BACKOFF: Duration = Duration::from_secs(2);

/// One release to carry out.
pub(crate) struct Release {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) key: LockKey,
    pub(crate) token: OwnerToken,
    pub(crate) horizon: Horizon,
    /// A guard's release: its lease, for the metrics of its key, its fence
    /// and whether it was lost (`None` for an abandoned attempt's or a
    /// composite's inner release).
    pub(crate) observed: Option<Arc<LeaseState>>,
}

impl Release {
    /// The span of this release (`key`, `store`, `fence`, `outcome`).
    fn span(&self) -> tracing::Span {
        let span = tracing::debug_span!(
            "release",
            key = %self.key,
            store = self.backend.name(),
            fence = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if let Some(lease) = &self.observed {
            span.record("fence", lease.fence);
        }
        span
    }

    /// Starts the release on its own task. The receiver gets the first
    /// attempt's outcome; retries after a retryable failure go on in the
    /// background. `None` when no tokio runtime is running (the lease then
    /// expires by itself, or with the session).
    pub(crate) fn spawn(self) -> Option<oneshot::Receiver<Result<bool>>> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = oneshot::channel();
        let span = self.span();
        handle.spawn(
            async move {
                let outcome = self.attempt().await;
                let retry = self.first_done(&outcome);
                let _ = tx.send(outcome);
                if retry {
                    self.retry().await;
                }
            }
            .instrument(span),
        );
        Some(rx)
    }

    /// Makes the first attempt on the caller's task and returns its
    /// outcome; retries after a retryable failure go on in the background,
    /// as with [`spawn`](Self::spawn).
    ///
    /// No task is spawned for a release that succeeds (one per lock cycle
    /// was measured as a share of the client's time per cycle, and a task
    /// hand-off on the path from one holder to the next). A caller dropped
    /// while the attempt is in flight hands the release to a task of its
    /// own, which sends it again: a release is idempotent (a re-sent one
    /// answers as the first would, and changes nothing more), so nothing is
    /// left behind and nothing is released twice.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: see above.
    pub(crate) async fn first_outcome(self) -> Result<bool> {
        let store = self.backend.name();
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::backend(store, false, "no tokio runtime to release in"));
        }
        let span = self.span();
        let mut armed = HandOffIfDropped(Some(self));
        let outcome = match &armed.0 {
            Some(release) => release.attempt().instrument(span.clone()).await,
            None => return Err(Error::backend(store, false, "the release was handed off")),
        };
        let Some(release) = armed.0.take() else {
            return Err(Error::backend(store, false, "the release was handed off"));
        };
        let retry = span.in_scope(|| release.first_done(&outcome));
        if retry {
            tokio::spawn(release.retry().instrument(span));
        }
        outcome
    }

    /// One release call to the store.
    async fn attempt(&self) -> Result<bool> {
        let call = tracing::debug_span!("store", store = self.backend.name(), op = "release");
        let outcome = self.backend.release(&self.key, self.token).instrument(call).await;
        if let (Some(lease), Err(e)) = (&self.observed, &outcome) {
            lease.metrics.store.store_error(Op::Release, e);
        }
        outcome
    }

    /// Whether an attempt's outcome is worth retrying.
    fn retryable(&self, outcome: &Result<bool>, give_up: Instant) -> bool {
        matches!(outcome, Err(e) if e.is_transient()) && !self.horizon.passed() && Instant::now() < give_up
    }

    /// Records the first attempt's outcome (span, metrics, log); returns
    /// whether to retry in the background.
    fn first_done(&self, outcome: &Result<bool>) -> bool {
        let retry = self.retryable(outcome, Instant::now() + MAX_RETRY);
        if let (Err(e), true) = (outcome, retry) {
            tracing::warn!(key = %self.key, error = %e, "release failed; retrying in the background");
        }
        // A lease lost before its release was not held, whatever the
        // store says of the token (a store may remember its release).
        let lost = self.observed.as_ref().is_some_and(|l| l.is_lost());
        let shown = match outcome {
            Ok(true) if !lost => "released",
            Ok(_) => "not_held",
            Err(_) => "error",
        };
        tracing::Span::current().record("outcome", shown);
        if let Some(lease) = &self.observed {
            lease.metrics.released(shown);
        }
        retry
    }

    /// Retries after a first attempt failed with a retryable error, until
    /// one succeeds, fails for good, or the grant can no longer exist.
    async fn retry(self) {
        let mut backoff = FIRST_BACKOFF;
        let give_up = Instant::now() + MAX_RETRY;
        let mut tries = 1u32;
        loop {
            let jittered = backoff.mul_f64(crate::vocabulary::entropy::with_rng(|rng| rng.random_range(0.5..1.0)));
            tokio::select! {
                // In the order written, not at random: a seed replays exactly.
                biased;
                _ = tokio::time::sleep(jittered) => {}
                _ = self.horizon.reached() => return,
            }
            backoff = (backoff * 2).min(LAST_BACKOFF);
            tries += 1;
            let outcome = self.attempt().await;
            let retry = self.retryable(&outcome, give_up);
            match (&outcome, retry) {
                (Err(e), true) => tracing::debug!(key = %self.key, error = %e, tries, "release failed again"),
                (Err(e), false) => {
                    tracing::warn!(key = %self.key, error = %e, tries, "gave up releasing; the lease will expire")
                }
                (Ok(_), _) => tracing::info!(key = %self.key, tries, "released after retries"),
            }
            if !retry {
                return;
            }
        }
    }
}

/// Holds a release whose first attempt runs on the caller's task; dropped
/// while it still holds it (the caller's future was dropped mid-attempt),
/// it starts the release again on a task of its own.
struct HandOffIfDropped(Option<Release>);

impl Drop for HandOffIfDropped {
    fn drop(&mut self) {
        if let Some(release) = self.0.take() {
            // Without a runtime (it is shutting down) the lease expires by
            // itself, or with the session.
            let _ = release.spawn();
        }
    }
}
