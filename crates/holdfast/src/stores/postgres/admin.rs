//! The admin calls on PostgreSQL: the held keys under a prefix and the
//! forced release, each built from the namespace's checked, quoted names
//! (as in [`Statements`](super::statements::Statements)) at the call: admin calls
//! are rare, so they keep no prepared statements.

use tokio_postgres::types::Type;

use super::PostgresBackend;
use super::error::map_err;
use super::gate::is_gate;
use super::session::{held_session_sql, until_sql};
use super::statements::RELEASED;
use crate::backend::ForceReleased;
use crate::backend::LockStatus;
use crate::vocabulary::error::Result;
use crate::vocabulary::key::LockKey;

impl PostgresBackend {
    fn admin_tables(&self) -> (String, String) {
        let c = &self.inner.config;
        (format!("\"{}\".\"{}\"", c.schema, c.table), format!("\"{}\".\"{}_shares\"", c.schema, c.table))
    }

    /// When lease row `l` is held until (see `session`).
    fn admin_until(&self) -> String {
        until_sql("l", &self.inner.sql.sessions_regclass)
    }

    /// Every key under `prefix` with an unexpired lease row (an exclusive
    /// holder, or the gate row that held shares keep at least as long as
    /// themselves), then each one's status. One pass over the lease table
    /// (its rows are the held keys plus rows expired less than a minute ago,
    /// which the sweep removes), then one status read per key.
    pub(super) async fn list_held(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        let (t, _) = self.admin_tables();
        let u = self.admin_until();
        let sql =
            format!("SELECT key FROM {t} AS l WHERE starts_with(key, $1) AND {u} > clock_timestamp() ORDER BY key");
        let rows = self
            .transaction("list", async |c| c.query_typed(&sql, &[(&prefix, Type::TEXT)]).await.map_err(map_err))
            .await?;
        let keys = rows.iter().map(|row| row.try_get::<_, String>(0).map_err(map_err)).collect::<Result<Vec<_>>>()?;
        crate::backend::held_statuses(self, keys).await
    }

    /// One transaction: the key's lease row locked (as every shared acquire
    /// locks it first), then released (the exclusive holder, or the shares'
    /// gate: the row stays with the key's fence, as after a release), its
    /// held shares deleted (reservations stay), and the waiters told at
    /// commit by the channel every release uses. The next grant's fence is
    /// above the removed ones (the row's fence + 1); the holders' renewals
    /// find no row of theirs and fail; a holder whose lease lives with a
    /// session finds the removal counted in it (see `session`).
    pub(super) async fn force(&self, key: &LockKey) -> Result<ForceReleased> {
        let (t, s) = self.admin_tables();
        let lock_row = format!("SELECT 1 FROM {t} WHERE key = $1 FOR UPDATE");
        // The row stays as the released marker, keeping the key's fence
        // (read after the lock above, so `o` is the latest version).
        let u = self.admin_until();
        let ss = &self.inner.sql.sessions_regclass;
        let hs = held_session_sql("l");
        let count =
            format!("UPDATE {ss} SET removed = removed + 1 WHERE id = (SELECT {hs} FROM {t} AS l WHERE key = $1)");
        let del_lease = format!(
            "UPDATE {t} AS l SET token = {RELEASED}, label = '', expires_at = least(o.until, clock_timestamp()),
                 session = NULL
             FROM (SELECT token, {u} AS until FROM {t} AS l WHERE key = $1) o
             WHERE l.key = $1
             RETURNING o.token, l.fence, o.until > clock_timestamp()"
        );
        let del_shares =
            format!("DELETE FROM {s} WHERE key = $1 AND held RETURNING fence, expires_at > clock_timestamp()");
        let (k, channel) = (key.as_str(), &self.inner.channel);
        let out = self
            .transaction("force_release", async |c| {
                c.query_typed(&lock_row, &[(&k, Type::TEXT)]).await.map_err(map_err)?;
                c.query_typed(&count, &[(&k, Type::TEXT)]).await.map_err(map_err)?;
                let mut out = ForceReleased::free();
                for row in c.query_typed(&del_lease, &[(&k, Type::TEXT)]).await.map_err(map_err)? {
                    let token: Vec<u8> = row.try_get(0).map_err(map_err)?;
                    let live: bool = row.try_get(2).map_err(map_err)?;
                    if live && !is_gate(&token) {
                        out.add(row.try_get::<_, i64>(1).map_err(map_err)?.max(0) as u64, true);
                    }
                }
                for row in c.query_typed(&del_shares, &[(&k, Type::TEXT)]).await.map_err(map_err)? {
                    if row.try_get::<_, bool>(1).map_err(map_err)? {
                        out.add(row.try_get::<_, i64>(0).map_err(map_err)?.max(0) as u64, false);
                    }
                }
                if !out.was_free() {
                    c.query_typed("SELECT pg_notify($1, $2)", &[(channel, Type::TEXT), (&k, Type::TEXT)])
                        .await
                        .map_err(map_err)?;
                }
                Ok(out)
            })
            .await?;
        // As a release: without a live listener, a local waiter is woken directly.
        if !out.was_free() && !self.listening() {
            self.inner.wakeups.wake_one(key.as_str());
        }
        Ok(out)
    }
}
