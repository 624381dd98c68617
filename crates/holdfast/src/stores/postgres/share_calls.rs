//! The calls of the namespace's functions of shared leases (their text and
//! what they do: `share_fns`), and the fall-back to the transactions of
//! `shares` when a namespace has them no more.

use std::time::{Duration, Instant};

use tokio_postgres::types::{ToSql, Type};

use super::error::map_err;
use super::share_fns::{BUSY, CONFLICT, GRANTED};
use super::statements::Stmt;
use super::{PostgresBackend, STORE};
use crate::backend::admission;
use crate::backend::wait::Attempt;
use crate::backend::{AcquireRequest, Grant};
use crate::vocabulary::error::{Error, Result};

impl PostgresBackend {
    /// [`attempt_shared`](Self::attempt_shared) as one call of the server's
    /// function (see `share_fns`), on the key's connection: a caller
    /// dropped meanwhile leaves it to run, and the release its client
    /// sends to clean up goes on the same connection, so it runs after.
    pub(super) async fn attempt_shared_in_server(
        &self,
        req: &AcquireRequest,
        reserve: bool,
        started: Instant,
    ) -> Result<Attempt> {
        let key = req.key.as_str();
        let token = req.token.to_bytes().to_vec();
        let ttl_ms = req.ttl.as_millis() as i64;
        let (mode, weight, limit) = admission::encode(req.mode);
        let mode = mode as i16;
        let params = [
            (&key as &(dyn ToSql + Sync), Type::TEXT),
            (&token, Type::BYTEA),
            (&mode, Type::INT2),
            (&weight, Type::INT8),
            (&limit, Type::INT8),
            (&ttl_ms, Type::INT8),
            (&req.label, Type::TEXT),
            (&reserve, Type::BOOL),
        ];
        let rows = self.query("acquire", Some(key), Stmt::ShareAcquire, &params).await?;
        let row = rows.first().ok_or_else(|| Error::backend(STORE, false, "the shared acquire answered no row"))?;
        let value: Option<i64> = row.try_get(1).map_err(map_err)?;
        match (row.try_get::<_, i16>(0).map_err(map_err)?, value) {
            (GRANTED, Some(fence)) => Ok(Attempt::Granted(Grant::new(fence as u64, started, req.ttl))),
            (CONFLICT, Some(held)) => {
                let (asked, held) = (limit.clamp(0, u32::MAX.into()) as u32, held.clamp(0, u32::MAX.into()) as u32);
                Err(Error::Conflict { key: key.to_owned(), reason: admission::conflict_reason(asked, held) })
            }
            (BUSY, left) => {
                Ok(Attempt::Busy { expires_in: Some(Duration::from_millis(left.unwrap_or(0).max(0) as u64)) })
            }
            (kind, value) => Err(Error::backend(
                STORE,
                false,
                format!(
                    "the shared acquire answered ({kind}, {value:?}); is the namespace's function of another version?"
                ),
            )),
        }
    }

    /// Whether `e` says the namespace's functions are gone (dropped since
    /// this client connected): then this client runs the transactions from
    /// now on, and the call that failed (which ran nothing) runs as one.
    pub(super) fn functions_gone(&self, e: &Error) -> bool {
        let gone = super::error::is_undefined_function(e);
        if gone && self.inner.share_fns.swap(false, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(error = %e, "the namespace's functions of shared leases are gone; using transactions");
        }
        gone
    }

    /// After a held share was released: the gate's shrink in one call.
    pub(super) async fn shrink_gate_in_server(&self, key: &str) -> Result<()> {
        let params = [(&key as &(dyn ToSql + Sync), Type::TEXT), (&self.inner.channel, Type::TEXT)];
        self.query("release", Some(key), Stmt::ShrinkGate, &params).await.map(|_| ())
    }
}
