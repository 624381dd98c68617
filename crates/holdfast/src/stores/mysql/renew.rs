//! Renewal on MySQL/MariaDB: leases of their own expiry, one `UPDATE` per
//! TTL and chunk of [`RENEW_CHUNK`] leases. (Leases held under a session
//! row are renewed by their session: see `session_rows`.)

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Value};

use super::sql::{RENEW_CHUNK, Statements, micros};
use crate::vocabulary::key::OwnerToken;

/// Extends every listed lease its token still holds: one `UPDATE` per TTL
/// value and chunk (usually exactly one), plus one `SELECT` only when some
/// lease was not extended, to tell which.
pub(super) async fn renew(
    conn: &mut Conn,
    s: &Statements,
    leases: &[(String, OwnerToken, Duration)],
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
