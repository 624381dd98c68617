//! Shrinking a held lease in place ([`Backend::shrink`]) on PostgreSQL: a
//! writer's lease (a lease row held by its token) becomes a held share
//! under the key's gate, or a held share takes a smaller weight, in one
//! transaction that holds the key's gate row lock (as every shared
//! transaction and every grant of the key takes it first), so no request is
//! granted between the two modes.
//!
//! [`Backend::shrink`]: crate::backend::Backend::shrink

use tokio_postgres::types::Type;

use super::PostgresBackend;
use super::config::PostgresConfig;
use super::error::map_err;
use super::session::until_sql;
use crate::backend::LeaseMode;
use crate::backend::admission::{self, Shrink};
use crate::vocabulary::error::Result;
use crate::vocabulary::key::{LockKey, OwnerToken};

/// The statements of a shrink (schema and table names checked and quoted as
/// in [`Statements`](super::statements::Statements); all values bound).
#[derive(Debug)]
pub(super) struct ShrinkSql {
    /// `$1 key, $2 token` -> whether the token holds the key's lease row
    /// (exclusive), locking the row.
    lock_exclusive: String,
    /// `$1 key, $2 token, $3 mode, $4 weight, $5 limit`: the lease row's
    /// grant copied into a held share (its fence, label and expiry).
    exclusive_to_share: String,
    /// `$1 key, $2 token` -> a held share's mode, weight and limit.
    held_share: String,
    /// `$1 key, $2 token, $3 weight`.
    set_weight: String,
}

impl ShrinkSql {
    pub(super) fn new(config: &PostgresConfig) -> Self {
        let schema = format!("\"{}\"", config.schema);
        let t = format!("{schema}.\"{}\"", config.table);
        let s = format!("{schema}.\"{}_shares\"", config.table);
        let u = until_sql("l", &format!("{schema}.\"{}_sess\"", config.table));
        ShrinkSql {
            lock_exclusive: format!(
                "SELECT 1 FROM {t} AS l WHERE key = $1 AND token = $2 AND {u} > clock_timestamp() FOR UPDATE"
            ),
            // A lease that lived with a session becomes a share with the
            // session's expiry as its own (shares keep their own expiry).
            exclusive_to_share: format!(
                "INSERT INTO {s} (key, token, mode, weight, limit_n, held, fence, label, acquired_at, expires_at)
                 SELECT key, token, $3, $4, $5, true, fence, label, acquired_at, {u}
                 FROM {t} AS l WHERE key = $1 AND token = $2
                 ON CONFLICT (key, token) DO UPDATE SET mode = excluded.mode, weight = excluded.weight,
                     limit_n = excluded.limit_n, held = true, fence = excluded.fence, label = excluded.label,
                     acquired_at = excluded.acquired_at, expires_at = excluded.expires_at"
            ),
            held_share: format!(
                "SELECT mode, weight, limit_n FROM {s}
                 WHERE key = $1 AND token = $2 AND held AND expires_at > clock_timestamp()"
            ),
            set_weight: format!("UPDATE {s} SET weight = $3 WHERE key = $1 AND token = $2"),
        }
    }
}

impl PostgresBackend {
    /// [`Backend::shrink`](crate::backend::Backend::shrink).
    ///
    /// # Cancel safety
    ///
    /// One transaction: dropped, it committed or rolled back (a connection
    /// abandoned inside it is closed, see `shares.rs`).
    pub(super) async fn shrink_lease(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        let (sql, key, tok) = (&self.inner.shrink, key.as_str(), token.to_bytes().to_vec());
        let channel = &self.inner.channel;
        let outcome = self
            .transaction("shrink", async |c| {
                let by = [(&key as &(dyn tokio_postgres::types::ToSql + Sync), Type::TEXT), (&tok, Type::BYTEA)];
                let exclusive = !c.query_typed(&sql.lock_exclusive, &by).await.map_err(map_err)?.is_empty();
                if exclusive {
                    let smaller = match admission::shrunk(LeaseMode::Exclusive, to) {
                        Ok(mode) => mode,
                        Err(reason) => return Ok(Shrink::NotSmaller(reason)),
                    };
                    let (mode, weight, limit) = admission::encode(smaller);
                    let mode = mode as i16;
                    let row = [
                        by[0].clone(),
                        by[1].clone(),
                        (&mode, Type::INT2),
                        (&weight, Type::INT8),
                        (&limit, Type::INT8),
                    ];
                    c.query_typed(&sql.exclusive_to_share, &row).await.map_err(map_err)?;
                    self.lease_to_gate(c, key, &tok).await?;
                } else {
                    self.lock_gate(c, key).await?;
                    let Some(r) = c.query_typed(&sql.held_share, &by).await.map_err(map_err)?.into_iter().next() else {
                        return Ok(Shrink::NotHeld);
                    };
                    let held = admission::decode(
                        r.try_get::<_, i16>(0).map_err(map_err)?.into(),
                        r.try_get(1).map_err(map_err)?,
                        r.try_get(2).map_err(map_err)?,
                    );
                    let smaller = match admission::shrunk(held, to) {
                        Ok(mode) => mode,
                        Err(reason) => return Ok(Shrink::NotSmaller(reason)),
                    };
                    let weight = i64::from(smaller.weight());
                    c.query_typed(&sql.set_weight, &[by[0].clone(), by[1].clone(), (&weight, Type::INT8)])
                        .await
                        .map_err(map_err)?;
                }
                // Room was made, as by a release: the waiters are told.
                c.query_typed("SELECT pg_notify($1, $2)", &[(channel, Type::TEXT), (&key, Type::TEXT)])
                    .await
                    .map_err(map_err)?;
                Ok(Shrink::Shrunk)
            })
            .await?;
        outcome.answer()
    }
}
