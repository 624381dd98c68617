//! The admin calls: who holds a key, every held key under a prefix, and a
//! forced release.

use std::time::Duration;

use super::{SqliteBackend, sql};
use crate::backend::{ForceReleased, HolderInfo, LeaseMode, LockStatus};
use crate::vocabulary::error::Result;
use crate::vocabulary::key::LockKey;

impl SqliteBackend {
    /// Who holds `key`: its unexpired leases.
    pub(super) async fn status_of(&self, key: &LockKey) -> Result<LockStatus> {
        let k = key.as_str().to_owned();
        let rows = self.with_conn(move |conn| sql::status(conn, &k)).await?;
        let mut status = LockStatus::free(key);
        for (mode, label, fence, left_ms) in rows {
            add_lease(&mut status, mode, label, fence, left_ms);
        }
        Ok(status)
    }

    /// Every key under `prefix` with an unexpired lease, sorted by key.
    pub(super) async fn list_held(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        let p = prefix.to_owned();
        let rows = self.with_conn(move |conn| sql::list(conn, &p)).await?;
        let mut all: Vec<LockStatus> = Vec::new();
        for (key, mode, label, fence, left_ms) in rows {
            if all.last().is_none_or(|s| s.key != key) {
                all.push(LockStatus { key, holder: None, shared: Vec::new(), limit: None, waiters: None });
            }
            if let Some(status) = all.last_mut() {
                add_lease(status, mode, label, fence, left_ms);
            }
        }
        Ok(all)
    }

    /// Removes every lease of `key`, waking one local waiter per lease.
    pub(super) async fn force_release_all(&self, key: &LockKey) -> Result<ForceReleased> {
        let k = key.as_str().to_owned();
        let removed = self.with_conn(move |conn| sql::force_release(conn, &k)).await?;
        let mut out = ForceReleased::free();
        for (mode, fence) in &removed {
            out.add(*fence, mode.is_exclusive());
            // As a release of each lease would: one waiter per freed lease.
            self.wakeups.wake_one(key.as_str());
        }
        Ok(out)
    }
}

/// Adds one held lease, as `sql::status` and `sql::list` read it, to `status`.
fn add_lease(status: &mut LockStatus, mode: LeaseMode, label: String, fence: u64, left_ms: i64) {
    let info = HolderInfo {
        label,
        fence,
        ttl_left: Some(Duration::from_millis(left_ms.max(0) as u64)),
        weight: mode.weight(),
    };
    match mode.limit() {
        Some(limit) => {
            status.limit = Some(limit);
            status.shared.push(info);
        }
        None => status.holder = Some(info),
    }
}
