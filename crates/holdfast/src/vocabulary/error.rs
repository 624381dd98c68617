//! The one error type of holdfast.

use std::time::Duration;

pub use crate::vocabulary::store_error::BoxError;
use crate::vocabulary::store_error::{Advised, AtEndpoint, Said, is_located};

/// `Result` with holdfast's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with a lock, as variants a caller can act on.
///
/// Match on the variant, not on the message: messages may change between
/// releases, variants follow semver (new ones may be added, hence
/// `#[non_exhaustive]`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock stayed busy until the acquire deadline passed. Nothing was
    /// left behind in the store: an attempt that raced the deadline was
    /// released by its token before this error was returned.
    #[error("lock {key:?} still busy after {waited:?}")]
    Timeout {
        /// The lock key.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The lease was lost while the guard lived (renewal failed, the store
    /// said the grant was gone, or the local lease deadline passed). Work done
    /// under the guard after [`lost`](crate::MutexGuard::lost) fired may have
    /// overlapped another holder; use the fence to reject it downstream.
    #[error("lease on lock {key:?} was lost before release")]
    Lost {
        /// The lock key.
        key: String,
    },
    /// Input rejected before any I/O: a bad key, TTL, URL or option.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// What was wrong: `key`, `ttl`, `url`, ...
        what: &'static str,
        /// Why, in words a user can fix.
        reason: String,
    },
    /// The store holds the key in a way this request disagrees with: a
    /// semaphore acquire that names another permit count than the one the
    /// key's live permits were granted under (change it with
    /// [`Semaphore::resize`](crate::Semaphore::resize)), or a shared request
    /// on a key used as a read-write lock.
    #[error("lock {key:?}: {reason}")]
    Conflict {
        /// The lock key.
        key: String,
        /// What disagrees.
        reason: String,
    },
    /// The store cannot do what was asked (for example a fair lock on a store
    /// that does not queue waiters). Checked before any I/O.
    #[error("{store} store does not support {what}")]
    Unsupported {
        /// The store's name.
        store: &'static str,
        /// The unsupported capability.
        what: &'static str,
    },
    /// The URL names a store whose cargo feature was not enabled at build time.
    #[error("URL scheme {scheme:?} needs holdfast's cargo feature {feature:?}, which is not enabled")]
    FeatureDisabled {
        /// The URL scheme.
        scheme: String,
        /// The cargo feature to enable.
        feature: &'static str,
    },
    /// The store failed or could not be reached.
    ///
    /// Its message is one line: the store, its endpoint where known
    /// (`host:port`, a host list or a file; never a password), the cause in
    /// plain words and what to do, as in `redis at 127.0.0.1:6379:
    /// connection refused: is redis running and listening there? (check the
    /// URL's host and port)`. The client library's own error is in the
    /// `source()` chain.
    #[error("{}", crate::vocabulary::store_error::backend_message(store, source))]
    Backend {
        /// The store's name.
        store: &'static str,
        /// Whether the same call may succeed if tried again (a lost connection,
        /// a failover in progress), as opposed to a permanent refusal.
        retryable: bool,
        /// The store client's error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// A store error that a retry may cure (a dropped connection, a
    /// failover): the one kind a release, a renewal or a wait retries on
    /// its own. A [`Timeout`](Error::Timeout) is the caller's bound, not
    /// the store's state, so it is not transient.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(self, Error::Backend { retryable: true, .. })
    }

    /// Whether retrying the same operation may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Backend { retryable, .. } => *retryable,
            Error::Timeout { .. } => true,
            _ => false,
        }
    }

    /// An [`Error::InvalidInput`].
    pub fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput { what, reason: reason.into() }
    }

    /// An [`Error::Backend`] from any error, for store implementations.
    pub fn backend(store: &'static str, retryable: bool, source: impl Into<BoxError>) -> Self {
        Error::Backend { store, retryable, source: source.into() }
    }

    /// An [`Error::Backend`] whose cause is `text` in holdfast's own words,
    /// which say what to do: located like any other, never re-explained.
    #[allow(dead_code)] // not every build has a store that uses it
    pub(crate) fn advised(store: &'static str, retryable: bool, text: String) -> Self {
        Error::Backend { store, retryable, source: Box::new(Advised(text)) }
    }

    /// An [`Error::Backend`] whose message is `text` as it is: it names
    /// the store and endpoint itself.
    pub(crate) fn said(store: &'static str, retryable: bool, text: String) -> Self {
        Error::Backend { store, retryable, source: Box::new(Said(text)) }
    }

    /// This error, if it is an [`Error::Backend`], as one that names the
    /// store's `endpoint` (`host:port`, a host list, or a file) and says
    /// the cause in plain words. Idempotent: an error that names its
    /// endpoint already is returned as it is, as is any other variant.
    pub(crate) fn at(self, endpoint: &str) -> Self {
        match self {
            Error::Backend { store, retryable, source } if !is_located(&source) => {
                let source = Box::new(AtEndpoint::new(store, endpoint, source));
                Error::Backend { store, retryable, source }
            }
            other => other,
        }
    }
}
