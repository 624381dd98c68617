//! The error mapping: which tokio-postgres errors a caller may retry.

use std::time::Duration;

use super::STORE;
use crate::vocabulary::error::Error;

/// A tokio-postgres error whose message includes its cause (tokio-postgres
/// prints only "db error" for a server error; the SQLSTATE and the server's
/// message are in the cause). The original is the `source()`.
#[derive(Debug)]
pub struct PgError(pub(super) tokio_postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.0.as_db_error(), std::error::Error::source(&self.0)) {
            (Some(db), _) => write!(f, "{} (SQLSTATE {})", db.message(), db.code().code()),
            (None, Some(cause)) => write!(f, "{}: {cause}", self.0),
            (None, None) => write!(f, "{}", self.0),
        }
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Maps a tokio-postgres error: connection loss, server shutdown, resource
/// shortage, serialization failures and deadlocks are retryable; TLS and
/// authentication failures, bad settings and SQL errors are not.
pub(super) fn map_err(e: tokio_postgres::Error) -> Error {
    let retryable = match e.code() {
        None => {
            let kind = e.to_string();
            ["error communicating with the server", "connection closed", "error connecting to server", "timeout"]
                .iter()
                .any(|k| kind.starts_with(k))
        }
        Some(code) => {
            let c = code.code();
            c.starts_with("08") // connection exception
                || c.starts_with("53") // insufficient resources (too many connections)
                || c.starts_with("57P") // admin/crash shutdown, cannot connect now
                || c == "40001" // serialization failure
                || c == "40P01" // deadlock
                || c == "55P03" // lock not available
        }
    };
    Error::backend(STORE, retryable, PgError(e))
}

/// Whether `e` is the server's "no such function" (SQLSTATE 42883): raised
/// when a statement is parsed, so nothing of it ran.
pub(super) fn is_undefined_function(e: &Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(pg) = c.downcast_ref::<tokio_postgres::Error>() {
            return pg.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_FUNCTION);
        }
        cause = c.source();
    }
    false
}

pub(super) fn timed_out(what: &str, after: Duration) -> Error {
    Error::backend(STORE, true, format!("{what} timed out after {after:?}"))
}
