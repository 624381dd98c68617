//! Ending the backend of a lost connection before its slot is used again.
//!
//! A key's statements share one connection (see [`Pool`](super::pool::Pool)),
//! so the release that cleans up after an acquire runs after that acquire on
//! the server. When the connection breaks with an acquire in flight, the
//! server does not know it at once: the backend may still read the acquire
//! from the network, or wait for the key's row lock and then commit a grant
//! under the client's live session, to a token nobody tracks any more (the
//! cleanup's release ran meanwhile on the slot's new connection and found
//! nothing). So before a slot's new connection runs anything, the old
//! connection's backend is ended and the client waits until the server says
//! it is gone: a statement still in the network is then never read (its
//! socket is closed), one waiting for a lock was rolled back, and one that
//! was committing finished first, so what the release finds is final. Model
//! 18 (`holdfast-models`, `sql_late_statement`) checks the rule and the
//! variants that fall short (a cancel request, a termination not waited
//! for, a fence on one slot with releases on any).
//!
//! Only a direct connection's backend can be named: behind a pooler the
//! client does not know which server connection ran its statement.

use std::time::Duration;

use tokio_postgres::Client as PgClient;
use tokio_postgres::types::Type;

use super::STORE;
use super::error::map_err;
use crate::vocabulary::error::{Error, Result};

/// The backend of a direct connection, as the server names it: the process
/// id with the backend's start time (a process id is reused; the pair is not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Backend {
    /// `pg_backend_pid()`.
    pub(super) pid: i32,
    /// `backend_start` in microseconds since 1970.
    pub(super) started_us: i64,
}

/// `client`'s backend if the connection is direct (see `pooler`), `None`
/// behind a pooler. One round trip.
pub(super) async fn backend_of(client: &PgClient) -> std::result::Result<Option<Backend>, tokio_postgres::Error> {
    let row = client
        .query_typed_one(
            "SELECT pid, (extract(epoch FROM backend_start) * 1000000)::int8
             FROM pg_stat_activity WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    let backend = Backend { pid: row.try_get(0)?, started_us: row.try_get(1)? };
    Ok((super::pooler::announced_pid(client).await == Some(backend.pid)).then_some(backend))
}

/// The row of `$1 pid, $2 start` in `pg_stat_activity`, if that backend lives.
const ALIVE: &str = "FROM pg_stat_activity WHERE pid = $1 AND (extract(epoch FROM backend_start) * 1000000)::int8 = $2";

/// Ends `lost` and returns once the server reports it gone (at once if it
/// is gone already), within `limit`; run on `client`, a new connection of
/// the same role (a role may end its own backends).
///
/// A role refused `pg_terminate_backend` (revoked from PUBLIC, say) is not
/// stuck: the server refuses the function before it reads a row, so it is
/// called only for a backend seen alive, and after a refusal the backend
/// is still waited for, since it ends by itself once it notices its closed
/// socket (the pool sets `client_connection_check_interval`); only one that
/// outlives `limit` gets the refusal's advice.
///
/// Cancel safety: dropping it leaves the backend ended or not; the caller
/// keeps `lost` until this returns `Ok`, and ending it again is harmless.
pub(super) async fn end(client: &PgClient, lost: &Backend, limit: Duration) -> Result<()> {
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
        [(&lost.pid, Type::INT4), (&lost.started_us, Type::INT8)];
    let alive = format!("SELECT count(*) {ALIVE}");
    let is_alive = async || -> Result<bool> {
        let row = client.query_typed_one(&alive, &params).await.map_err(map_err)?;
        Ok(row.try_get::<_, i64>(0).map_err(map_err)? > 0)
    };
    if !is_alive().await? {
        return Ok(());
    }
    // `pg_terminate_backend` signals and returns (PostgreSQL 14's timeout
    // argument waits, but older servers lack it): the row going from
    // `pg_stat_activity` is what says the backend has exited.
    let refused = match client.query_typed(&format!("SELECT pg_terminate_backend(pid) {ALIVE}"), &params).await {
        Ok(_) => None,
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => Some(e),
        Err(e) => return Err(map_err(e)),
    };
    let since = std::time::Instant::now();
    loop {
        if !is_alive().await? {
            return Ok(());
        }
        if since.elapsed() >= limit {
            return Err(match refused {
                Some(e) => Error::advised(
                    STORE,
                    false,
                    format!(
                        "the server refused to end the backend (pid {}) of a connection this client lost with a \
                         statement in flight ({}), and it did not end by itself within {limit:?}; a role may end \
                         its own backends, so check that every connection of this client logs in as the same \
                         role, or grant the role pg_signal_backend; nothing is sent on its slot until that \
                         backend has ended",
                        lost.pid,
                        super::error::PgError(e)
                    ),
                ),
                None => Error::backend(
                    STORE,
                    true,
                    format!(
                        "the backend (pid {}) of a connection lost with a statement in flight did not end within \
                         {limit:?}; nothing more is sent on its slot until it has (a statement of it could still \
                         commit a grant)",
                        lost.pid
                    ),
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
