//! Renewal on MySQL/MariaDB: one statement per session row for the mutex
//! leases held under one (see `session_rows`), whatever their number; one
//! `UPDATE` per TTL and chunk of [`RENEW_CHUNK`] leases for leases of
//! their own expiry; then the shares.
//!
//! Renewal runs on its own pool and is bounded by the plain [`timed`], not
//! by the operation that ends lost connections first (see `lost`): a
//! renewal grants nothing, so a lost one leaves nothing behind, and one held
//! behind the end of a lost connection could lose leases.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Value};

use super::session::{micros, rows_matched};
use super::sql::{RENEW_CHUNK, Statements};
use super::{MysqlBackend, shares, timed};
use crate::backend::RenewRequest;
use crate::vocabulary::error::Result;
use crate::vocabulary::key::OwnerToken;

impl MysqlBackend {
    /// [`Backend::renew`](crate::backend::Backend::renew): each session
    /// among the leases extended to the TTL from now if it is unexpired
    /// (one row, and if its `removed` count moved, a read of which of its
    /// rows are left); the other leases by their own rows, then as shares.
    pub(super) async fn renew_leases(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        let mut held = vec![false; leases.len()];
        let (by_session, own_expiry) = self.book().group(leases);
        for (id, ttl, at) in by_session {
            // Extending to "TTL from now" again is harmless, so retry deadlocks.
            let sent = Instant::now();
            let (matched, removed) = self
                .retry_contention(|| {
                    timed(&self.config, async {
                        let mut conn = self.renew_pool.get_conn().await?;
                        conn.exec_drop(self.sql.sessions.renew.as_str(), (micros(ttl), &id[..])).await?;
                        Ok((rows_matched(&conn), conn.last_insert_id().unwrap_or(0) as i64))
                    })
                })
                .await?;
            if matched != Some(1) {
                // Lapsed (never extended again): every lease of it is lost.
                self.book().lapsed(id);
                continue;
            }
            self.book().known_until(id, sent + ttl);
            if removed != self.book().seen(&id) {
                // A statement after the renewal's: it sees every removal
                // the count counted.
                let left: Vec<Vec<u8>> = timed(&self.config, async {
                    let mut conn = self.renew_pool.get_conn().await?;
                    conn.exec(self.sql.sessions.rows_of.as_str(), (&id[..],)).await
                })
                .await?;
                self.book().settle(id, removed, &left);
            }
            let book = self.book();
            for i in at {
                held[i] = book.session_of(leases[i].token) == Some(id);
            }
        }
        if own_expiry.is_empty() {
            return Ok(held);
        }
        let batch: Vec<_> =
            own_expiry.iter().map(|&i| (leases[i].key.as_str(), leases[i].token, leases[i].ttl)).collect();
        let own = self
            .retry_contention(|| {
                timed(&self.config, async {
                    let mut conn = self.renew_pool.get_conn().await?;
                    let mut got = renew(&mut conn, &self.sql, &batch).await?;
                    // Leases not in the lease table: shares (or lost grants).
                    let rest: Vec<usize> = (0..got.len()).filter(|&i| !got[i]).collect();
                    if !rest.is_empty() {
                        let asked: Vec<_> = rest.iter().map(|&i| batch[i]).collect();
                        for (i, extended) in rest.into_iter().zip(shares::renew(&mut conn, &self.shares, &asked).await?)
                        {
                            got[i] = extended;
                        }
                    }
                    Ok(got)
                })
            })
            .await?;
        for (i, h) in own_expiry.into_iter().zip(own) {
            held[i] = h;
        }
        Ok(held)
    }
}

/// Extends every listed lease its token still holds: one `UPDATE` per TTL
/// value and chunk (usually exactly one), plus one `SELECT` only when some
/// lease was not extended, to tell which.
async fn renew(
    conn: &mut Conn,
    s: &Statements,
    leases: &[(&str, OwnerToken, Duration)],
) -> mysql_async::Result<Vec<bool>> {
    let mut held = vec![false; leases.len()];
    if let [(key, token, ttl)] = leases {
        conn.exec_drop(s.renew_one.as_str(), (micros(*ttl), key.as_bytes(), &token.to_bytes()[..])).await?;
        held[0] = conn.affected_rows() == 1;
        return Ok(held);
    }
    let mut by_ttl: Vec<(Duration, Vec<usize>)> = Vec::new();
    for (i, (_, _, ttl)) in leases.iter().enumerate() {
        match by_ttl.iter_mut().find(|(t, _)| t == ttl) {
            Some((_, idx)) => idx.push(i),
            None => by_ttl.push((*ttl, vec![i])),
        }
    }
    for (ttl, idx) in by_ttl {
        for chunk in idx.chunks(RENEW_CHUNK) {
            let mut params = vec![Value::Int(micros(ttl))];
            for &i in chunk {
                params.push(Value::Bytes(leases[i].0.as_bytes().to_vec()));
                params.push(Value::Bytes(leases[i].1.to_bytes().to_vec()));
            }
            conn.exec_drop(s.renew_many(chunk.len()), Params::Positional(params.clone())).await?;
            if conn.affected_rows() as usize == chunk.len() {
                chunk.iter().for_each(|&i| held[i] = true);
                continue;
            }
            // Rows extended just now are unexpired; rows not extended had
            // expired (or were gone) and nobody else ever writes our token,
            // so they cannot have become ours since.
            params.remove(0);
            let rows: Vec<(Vec<u8>, Vec<u8>)> = conn.exec(s.held_many(chunk.len()), Params::Positional(params)).await?;
            for &i in chunk {
                let (key, token) = (leases[i].0.as_bytes(), leases[i].1.to_bytes());
                held[i] = rows.iter().any(|(k, t)| k == key && t[..] == token[..]);
            }
        }
    }
    Ok(held)
}
