//! `replicas=N`: a grant or a renewal counts only once `N` replicas
//! acknowledged it (`WAIT N replicas_timeout_ms`, sent on the connection
//! that wrote it), as Redisson's replica sync check does.
//!
//! `WAIT` counts the replicas that have every write of *its own*
//! connection. A connection re-made between the script's reply and `WAIT`
//! (the connection manager reconnects by itself, and a fixed server's link
//! keeps generation 0) would run `WAIT` on a fresh connection, which wrote
//! nothing, so every replica would count. So the script goes in one
//! pipeline after `CLIENT ID`, and `WAIT` in one before it: a write is
//! confirmed only when both ids are the same connection's.

use super::link::Link;
use super::lua::ScriptCall;
use super::{RedisBackend, STORE, map_err, timed_out};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

impl RedisBackend {
    /// Makes `inv` keep the id of the connection it runs on when writes
    /// are confirmed (`replicas=N`), and returns `conn`'s generation: the two
    /// things [`confirm_writes`](Self::confirm_writes) checks.
    pub(super) fn track(&self, conn: &Link, inv: &mut ScriptCall<'_>) -> u64 {
        if self.inner.config.replicas > 0 {
            inv.track_client();
        }
        conn.generation()
    }

    /// Waits until `config.replicas` replicas have every write this
    /// client sent on `conn` before, or fails with a retryable error.
    /// `generation` is the connection's [`Link::generation`] from before
    /// the write, and `client_id` the server's id of the connection the
    /// write ran on ([`track`](Self::track)): a connection that moved to
    /// another master or was re-made since cannot confirm it (its `WAIT`
    /// would count writes it never sent).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: `WAIT` changes nothing on the server.
    pub(super) async fn confirm_writes(&self, conn: &Link, generation: u64, client_id: Option<i64>) -> Result<()> {
        let config = &self.inner.config;
        if config.replicas == 0 {
            return Ok(());
        }
        let mut c = conn.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("WAIT").arg(config.replicas).arg(config.replicas_timeout.as_millis() as u64);
        pipe.cmd("CLIENT").arg("ID");
        let limit = config.timeout;
        let (acks, waited_on): (i64, i64) = match tokio::time::timeout(limit, pipe.query_async(&mut c)).await {
            Ok(r) => r.map_err(map_err)?,
            Err(_) => return Err(timed_out("WAIT", limit)),
        };
        if conn.generation() != generation {
            return Err(Error::backend(STORE, true, "the master changed before its replicas confirmed the write"));
        }
        if client_id != Some(waited_on) {
            return Err(Error::backend(
                STORE,
                true,
                "the connection was re-made between the write and WAIT, so its replicas cannot confirm it",
            ));
        }
        if acks < i64::from(config.replicas) {
            return Err(Error::backend(
                STORE,
                true,
                format!(
                    "{acks} of the {} replicas asked for confirmed the write within {:?}",
                    config.replicas, config.replicas_timeout
                ),
            ));
        }
        Ok(())
    }

    /// Confirms a grant just made on the command connection; a grant not
    /// confirmed is released (by its token, best effort) and the acquire
    /// fails with the retryable error.
    ///
    /// # Cancel safety
    ///
    /// A call dropped during `WAIT` leaves the grant in place; the client
    /// releases an acquire that raced a drop by its token (C9).
    pub(super) async fn confirm_grant(
        &self,
        key: &LockKey,
        token: OwnerToken,
        generation: u64,
        client_id: Option<i64>,
    ) -> Result<()> {
        match self.confirm_writes(&self.inner.conn, generation, client_id).await {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::debug!(key = key.as_str(), error = %e, "grant not confirmed by replicas; releasing it");
                if let Err(release) = self.release_plain(key, token).await {
                    tracing::debug!(error = %release, "releasing an unconfirmed grant failed; its lease runs out");
                }
                Err(e)
            }
        }
    }
}
