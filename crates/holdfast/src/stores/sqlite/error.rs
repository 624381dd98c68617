//! How SQLite's errors become holdfast's: which are retryable (a dropped
//! connection, a failover, a busy server) and which are not.

use super::STORE;
use crate::vocabulary::error::Error;

/// Maps an SQLite error: a busy or locked database is retryable.
pub(super) fn map_err(e: rusqlite::Error) -> Error {
    let retryable =
        matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked));
    Error::backend(STORE, retryable, e)
}
