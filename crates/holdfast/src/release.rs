//! Releasing a grant, or an abandoned attempt, so that nothing is left
//! behind: every release runs on a task of its own, so a caller whose future
//! is dropped cannot cancel it half-way, and a release that fails while the
//! store is unreachable is retried until it succeeds or the grant can no
//! longer exist.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::key::{LockKey, OwnerToken};
use crate::lease::LeaseState;
use crate::metrics::Op;

/// The longest a failing release is retried when nothing else bounds it.
const MAX_RETRY: Duration = Duration::from_secs(3600);
/// Delays between retries: doubling from the first to the last, jittered.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const LAST_BACKOFF: Duration = Duration::from_secs(2);

/// After when a release no longer matters, because the store has let the
/// grant go by itself.
#[derive(Debug, Clone)]
pub(crate) enum Horizon {
    /// The store expires the grant by this instant (its TTL, plus drift).
    At(Instant),
    /// The grant lives on a store session; it goes when the session ends.
    Session(CancellationToken),
    /// Unknown (an abandoned attempt on a session-bound store): the store's
    /// release reports `Ok(false)` once the grant cannot exist any more.
    Unknown,
}

impl Horizon {
    fn passed(&self) -> bool {
        match self {
            Horizon::At(t) => Instant::now() >= *t,
            Horizon::Session(s) => s.is_cancelled(),
            Horizon::Unknown => false,
        }
    }

    async fn reached(&self) {
        match self {
            Horizon::At(t) => tokio::time::sleep_until(*t).await,
            Horizon::Session(s) => s.cancelled().await,
            Horizon::Unknown => std::future::pending().await,
        }
    }
}

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
    /// Starts the release on its own task. The receiver gets the first
    /// attempt's outcome; retries after a retryable failure go on in the
    /// background. `None` when no tokio runtime is running (the lease then
    /// expires by itself, or with the session).
    pub(crate) fn spawn(self) -> Option<oneshot::Receiver<Result<bool>>> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = oneshot::channel();
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
        handle.spawn(self.run(tx).instrument(span));
        Some(rx)
    }

    /// Starts the release and waits for its first attempt's outcome.
    pub(crate) async fn first_outcome(self) -> Result<bool> {
        let store = self.backend.name();
        match self.spawn() {
            Some(rx) => rx
                .await
                .unwrap_or_else(|_| Err(Error::backend(store, true, "the release task ended without an answer"))),
            None => Err(Error::backend(store, false, "no tokio runtime to release in")),
        }
    }

    async fn run(self, tx: oneshot::Sender<Result<bool>>) {
        let mut first = Some(tx);
        let mut backoff = FIRST_BACKOFF;
        let give_up = Instant::now() + MAX_RETRY;
        let mut tries = 0u32;
        loop {
            tries += 1;
            let call = tracing::debug_span!("store", store = self.backend.name(), op = "release");
            let outcome = self.backend.release(&self.key, self.token).instrument(call).await;
            if let (Some(lease), Err(e)) = (&self.observed, &outcome) {
                lease.metrics.store.store_error(Op::Release, e);
            }
            let retry =
                matches!(&outcome, Err(e) if is_transient(e)) && !self.horizon.passed() && Instant::now() < give_up;
            match (&outcome, retry) {
                (Err(e), true) if tries == 1 => {
                    tracing::warn!(key = %self.key, error = %e, "release failed; retrying in the background")
                }
                (Err(e), true) => tracing::debug!(key = %self.key, error = %e, tries, "release failed again"),
                (Err(e), false) if first.is_none() => {
                    tracing::warn!(key = %self.key, error = %e, tries, "gave up releasing; the lease will expire")
                }
                (Ok(_), _) if first.is_none() => tracing::info!(key = %self.key, tries, "released after retries"),
                _ => {}
            }
            if let Some(tx) = first.take() {
                // A lease lost before its release was not held, whatever the
                // store says of the token (a store may remember its release).
                let lost = self.observed.as_ref().is_some_and(|l| l.is_lost());
                let shown = match &outcome {
                    Ok(true) if !lost => "released",
                    Ok(_) => "not_held",
                    Err(_) => "error",
                };
                tracing::Span::current().record("outcome", shown);
                if let Some(lease) = &self.observed {
                    lease.metrics.released(shown);
                }
                let _ = tx.send(outcome);
            }
            if !retry {
                return;
            }
            let jittered = backoff.mul_f64(crate::entropy::with_rng(|rng| rng.random_range(0.5..1.0)));
            tokio::select! {
                // In the order written, not at random: a seed replays exactly.
                biased;
                _ = tokio::time::sleep(jittered) => {}
                _ = self.horizon.reached() => return,
            }
            backoff = (backoff * 2).min(LAST_BACKOFF);
        }
    }
}

/// A store failure that the same call may get past.
pub(crate) fn is_transient(e: &Error) -> bool {
    matches!(e, Error::Backend { retryable: true, .. })
}
