//! The MySQL store's error mapping: which server errors a caller may retry,
//! and which are contention (deadlocks, lock wait timeouts) rather than failure.

use super::STORE;
use crate::vocabulary::error::Error;

/// Server error codes after which the same call may succeed: lock wait
/// timeout, deadlock, too many connections, shutdown in progress, aborted or
/// killed connections, server gone, read-only (a failover in progress).
const RETRYABLE_CODES: &[u16] = &[1205, 1213, 1040, 1053, 1077, 1152, 1158, 1159, 1160, 1161, 1290, 1927, 2006, 2013];

pub(super) fn map_err(e: mysql_async::Error) -> Error {
    let retryable = match &e {
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => true,
        mysql_async::Error::Server(s) => RETRYABLE_CODES.contains(&s.code),
        mysql_async::Error::Other(_) | mysql_async::Error::Url(_) => false,
    };
    Error::backend(STORE, retryable, e)
}

/// Deadlocks and lock wait timeouts: contention, not failure.
pub(super) fn is_contention(e: &Error) -> bool {
    match e {
        Error::Backend { source, .. } => matches!(
            crate::vocabulary::store_error::original(source).downcast_ref::<mysql_async::Error>(),
            Some(mysql_async::Error::Server(s)) if s.code == 1205 || s.code == 1213
        ),
        _ => false,
    }
}
