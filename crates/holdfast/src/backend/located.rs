//! A store opened from a URL, whose errors name its endpoint: every call's
//! [`Error::Backend`](crate::Error::Backend) says `STORE at HOST:PORT: ...`
//! (see `store_error.rs`). Everything else is the store's own: its name,
//! capabilities, answers and `Debug`.

use std::fmt;

use async_trait::async_trait;

use futures::StreamExt;

use crate::backend::{AcquireRequest, Backend, ForceReleased, Grant, HolderWatch, LeaseMode, LockStatus, RenewRequest};
use crate::vocabulary::capability::Capabilities;
use crate::vocabulary::error::Result;
use crate::vocabulary::key::{LockKey, OwnerToken};

/// `B`, with its endpoint put into its errors.
pub(crate) struct Located<B> {
    inner: B,
    endpoint: String,
}

impl<B: Backend> Located<B> {
    /// `inner`, whose errors will name `endpoint` (never a password).
    pub(crate) fn new(inner: B, endpoint: String) -> Self {
        Located { inner, endpoint }
    }

    fn at<T>(&self, r: Result<T>) -> Result<T> {
        r.map_err(|e| e.at(&self.endpoint))
    }
}

impl<B: fmt::Debug> fmt::Debug for Located<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

#[async_trait]
impl<B: Backend> Backend for Located<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        self.at(self.inner.try_acquire(req).await)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        self.at(self.inner.acquire(req).await)
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        self.at(self.inner.release(key, token).await)
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        self.at(self.inner.renew(leases).await)
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        self.at(self.inner.status(key).await)
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        self.at(self.inner.resize(key, limit).await)
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        self.at(self.inner.relabel(key, token, label).await)
    }

    async fn raise_fence(&self, key: &LockKey, token: OwnerToken, floor: u64) -> Result<bool> {
        self.at(self.inner.raise_fence(key, token, floor).await)
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<u64>> {
        self.at(self.inner.read_record(key).await)
    }

    async fn write_record(&self, key: &LockKey, token: OwnerToken, value: u64) -> Result<bool> {
        self.at(self.inner.write_record(key, token, value).await)
    }

    async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        self.at(self.inner.shrink(key, token, to).await)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        self.at(self.inner.list(prefix).await)
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForceReleased> {
        self.at(self.inner.force_release(key).await)
    }

    async fn watch_holders(&self, key: &LockKey) -> Result<Option<HolderWatch>> {
        let endpoint = self.endpoint.clone();
        let watch = self.at(self.inner.watch_holders(key).await)?;
        Ok(watch.map(|w| w.map(move |item| item.map_err(|e| e.at(&endpoint))).boxed()))
    }
}
