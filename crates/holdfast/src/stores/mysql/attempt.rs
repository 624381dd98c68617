//! One attempt of a mutex acquire on MySQL/MariaDB: the session it is
//! held under (see `session_rows`), the grant statement on a task of its
//! own (so that a caller dropped mid-flight leaves the task to release what
//! was granted), and the takeover of a lapsed session's row.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::{MysqlBackend, STORE, Turn, session_rows, sql, takeover};
use crate::backend::wait::Attempt;
use crate::backend::{AcquireRequest, Backend, Grant};
use crate::vocabulary::error::{Error, Result};

/// Sets its flag when dropped armed: the caller of an attempt is gone (see
/// [`MysqlBackend::attempt`]).
struct Abandoned {
    flag: Arc<AtomicBool>,
    armed: bool,
}

impl Abandoned {
    fn new() -> Self {
        Abandoned { flag: Arc::default(), armed: true }
    }

    fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.flag)
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if self.armed {
            self.flag.store(true, Ordering::Release);
        }
    }
}

impl MysqlBackend {
    /// One attempt of an exclusive acquire (see [`Turn`]).
    pub(super) async fn attempt(&self, req: &AcquireRequest, turn: Turn) -> Result<Attempt> {
        let started = Instant::now();
        let floor = req.fence_floor_within(sql::MAX_FENCE_FLOOR, STORE)?;
        // The grant of a key with a row is one autocommit statement: once
        // sent, it commits whether or not anyone reads its reply. So it runs
        // on a task of its own, and a caller dropped while it is in flight
        // (whose cleanup then releases the token, maybe before the grant
        // lands) leaves the task to release what it was granted, or what it
        // may have been. A grant in a transaction needs none of this: a
        // dropped connection rolls back.
        let abandoned = Abandoned::new();
        let (this, req, gone) = (self.clone(), req.clone(), abandoned.flag());
        let task = tokio::spawn(async move {
            let key = req.key.as_str();
            let outcome = this
                .timed(async |op| {
                    let mut conn = op.conn().await?;
                    // A waiter first looks without locking anything, so waiting
                    // costs one primary-key read, not a write.
                    if turn == Turn::Wait {
                        if let Some(left) = sql::peek_busy(&mut conn, &this.sql, key, req.token).await? {
                            return Ok((sql::Acquired::Busy { expires_in: Some(left) }, started));
                        }
                    }
                    let (session, until) =
                        session_rows::choose(&mut conn, &this.sql.sessions, &this.sessions, req.ttl).await?;
                    let probe = turn != Turn::FirstWait;
                    let asked = (req.token, &session[..], req.label.as_str());
                    let outcome = match sql::acquire(&mut conn, &this.sql, key, asked, floor, probe).await? {
                        sql::Acquired::RowHeld => {
                            takeover::take_lapsed(&mut conn, &this.sql, key, asked, floor).await?
                        }
                        outcome => outcome,
                    };
                    // Known before the caller hears of it, so that a release
                    // of the token (also the one below) finds its session.
                    let granted = matches!(outcome, sql::Acquired::Granted { .. });
                    this.book().used(req.ttl.as_millis() as i64, session, granted.then_some(req.token));
                    Ok((outcome, until))
                })
                .await;
            // An error leaves the grant unknown: its statement may have been
            // applied, or (its connection lost) may still be. The caller's
            // cleanup released the token when it left, maybe before; this
            // release runs after the end of the lost connection on the
            // server (see `lost`), so it finds any grant the statement made.
            let granted_or_unknown = matches!(outcome, Ok((sql::Acquired::Granted { .. }, _)) | Err(_));
            if gone.load(Ordering::Acquire) && granted_or_unknown {
                if let Err(e) = this.release(&req.key, req.token).await {
                    tracing::warn!(error = %e, "could not release an attempt whose caller was gone");
                }
            }
            outcome
        });
        let outcome = task.await.map_err(|e| Error::backend(STORE, false, format!("the grant's task failed: {e}")))?;
        abandoned.disarm();
        let (outcome, until) = outcome?;
        Ok(match outcome {
            sql::Acquired::Granted { fence } => {
                // Valid as long as this client's count of its session.
                let mut grant = Grant::new(fence, started, req.ttl);
                grant.valid_for = until.saturating_duration_since(started).min(req.ttl);
                Attempt::Granted(grant)
            }
            sql::Acquired::Busy { expires_in } => Attempt::Busy { expires_in },
            sql::Acquired::RowHeld => Attempt::Busy { expires_in: None },
        })
    }
}
