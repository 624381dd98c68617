//! Renewal on PostgreSQL: one statement per session for the mutex leases
//! that live with one (see `session`), and one statement for the leases
//! that keep their own expiry (shares, writers, rows of earlier versions).

use std::time::{Duration, Instant};

use tokio_postgres::types::Type;

use super::PostgresBackend;
use super::error::map_err;
use super::statements::Stmt;
use crate::backend::RenewRequest;
use crate::vocabulary::error::Result;

impl PostgresBackend {
    /// [`Backend::renew`](crate::backend::Backend::renew): for each
    /// session among the leases, its row extended to the TTL from now if
    /// it is unexpired (one row, whatever the number of leases), and if its
    /// `removed` count moved, a second statement that reads which of its
    /// rows are left (after the first committed: see `session`); the other
    /// leases by the per-row statement.
    pub(super) async fn renew_leases(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        let mut held = vec![false; leases.len()];
        let (by_session, own_expiry) = self.book().group(leases);
        for (id, ttl, at) in by_session {
            let ttl_ms = ttl.as_millis() as i64;
            let session = &id[..];
            let sent = Instant::now();
            let rows = self
                .query("renew", None, Stmt::RenewSession, &[(&session, Type::BYTEA), (&ttl_ms, Type::INT8)])
                .await?;
            let Some(row) = rows.first() else {
                // Lapsed: every lease of it is lost.
                self.book().lapsed(id);
                continue;
            };
            let removed: i64 = row.try_get(0).map_err(map_err)?;
            // Extended to at least the TTL from the server's now, after the send.
            self.book().known_until(id, sent + Duration::from_millis(ttl_ms as u64));
            if removed != self.book().seen(&id) {
                let left = self.query("renew", None, Stmt::SessionRows, &[(&session, Type::BYTEA)]).await?;
                let left =
                    left.iter().map(|r| r.try_get::<_, Vec<u8>>(0).map_err(map_err)).collect::<Result<Vec<_>>>()?;
                self.book().settle(id, removed, &left);
            }
            let book = self.book();
            for i in at {
                held[i] = book.session_of(leases[i].token) == Some(id);
            }
        }
        if !own_expiry.is_empty() {
            for (i, h) in own_expiry.iter().zip(self.renew_own_expiry(leases, &own_expiry).await?) {
                held[*i] = h;
            }
        }
        Ok(held)
    }

    /// The per-row renewal of `leases[at]` (leases without a session).
    async fn renew_own_expiry(&self, leases: &[RenewRequest], at: &[usize]) -> Result<Vec<bool>> {
        let keys: Vec<&str> = at.iter().map(|&i| leases[i].key.as_str()).collect();
        let tokens: Vec<Vec<u8>> = at.iter().map(|&i| leases[i].token.to_bytes().to_vec()).collect();
        let ttls: Vec<i64> = at.iter().map(|&i| leases[i].ttl.as_millis() as i64).collect();
        let rows = self
            .query(
                "renew",
                None,
                Stmt::Renew,
                &[(&keys, Type::TEXT_ARRAY), (&tokens, Type::BYTEA_ARRAY), (&ttls, Type::INT8_ARRAY)],
            )
            .await?;
        let mut held = vec![false; at.len()];
        for row in rows {
            let i: i64 = row.try_get(0).map_err(map_err)?;
            if let Some(h) = usize::try_from(i).ok().and_then(|i| i.checked_sub(1)).and_then(|i| held.get_mut(i)) {
                *h = true;
            }
        }
        Ok(held)
    }
}
