//! How Redis's errors become holdfast's: which are retryable (a dropped
//! connection, a failover, a busy server) and which are not.

use std::time::Duration;

use super::STORE;
use crate::vocabulary::error::Error;

/// Maps a redis error: connection trouble, timeouts and failover states are retryable.
pub(super) fn map_err(e: redis::RedisError) -> Error {
    use redis::{ErrorKind, ServerErrorKind};
    let retryable = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::BusyLoading
            )
        );
    Error::backend(STORE, retryable, e)
}

/// A call that outlasted its time limit: retryable.
pub(super) fn timed_out(what: &str, after: Duration) -> Error {
    Error::backend(STORE, true, format!("{what} timed out after {after:?}"))
}
