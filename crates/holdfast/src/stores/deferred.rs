//! A member store that could not be reached when its composite was built.
//!
//! A composite (RedLock, layered, fallback) exists to ride out a member's
//! outage, so a member that is down when the composite is built must not
//! stop the build: [`connect_or_defer`] connects once, and if that fails
//! with a retryable error (the server is down, unreachable, timing out) it
//! returns a [`Deferred`] store instead, which keeps connecting in the
//! background with a jittered backoff and, until it is connected, answers
//! like a store that is down:
//!
//! - `try_acquire`, `acquire`, `status`, `resize`, `raise_fence`, `list`
//!   and `force_release` fail with a retryable [`Error::Backend`] naming the
//!   store and its endpoint (password hidden) and the last connection error.
//!   RedLock counts that as a failed vote, a layered chain as a failing
//!   store of its role, a fallback chain as a failing store (it switches
//!   after `switch_after`) or arbiter.
//! - `release` and `relabel` answer `Ok(false)` and `renew` answers `false`
//!   per lease: nothing was ever sent to this store, so it holds nothing of
//!   anyone's, and saying so spares the callers background releases of
//!   grants that cannot exist.
//!
//! Once connected, every call goes to the store. A URL that is malformed or
//! names a disabled feature is never deferred: [`connect_or_defer`] returns
//! its [`Error::InvalidInput`] at once, as does any permanent connection
//! error (bad credentials, a refused TLS certificate).
//!
//! # What it declares before it is connected
//!
//! [`name`](Backend::name) is the store's name, from the URL's scheme.
//! [`capabilities`](Backend::capabilities) are what that store declares,
//! except what only the connection tells: fence durability is taken as
//! [`FenceDurability::Volatile`] (the weakest) and PostgreSQL's notification
//! as absent, until the store answers; from then on they are the store's
//! own. A composite reads its members' capabilities on every call, so it
//! promises no more than it knows at each moment.
//!
//! # Logs and metrics
//!
//! The deferral is logged as a `warn` with the endpoint and error, and so is
//! the outage once a minute while it lasts (not every retry); the connection
//! that ends it is logged at `info`. The metrics are
//! [`STORE_CONNECT_ERRORS_TOTAL`](crate::vocabulary::metrics::STORE_CONNECT_ERRORS_TOTAL)
//! (one per failed connection attempt) and
//! [`STORES_UNCONNECTED`](crate::vocabulary::metrics::STORES_UNCONNECTED) (deferred
//! stores not connected yet), labelled by `store`.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use tokio::time::Instant;

use crate::backend::ConnectFn;
use crate::backend::{AcquireRequest, Backend, ForceReleased, Grant, HolderWatch, LeaseMode, LockStatus, RenewRequest};
use crate::vocabulary::capability::{Capabilities, FenceDurability};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};
use crate::vocabulary::metrics::{STORE_CONNECT_ERRORS_TOTAL, STORES_UNCONNECTED};
use crate::vocabulary::secret::Secret;

/// The first delay between background connection attempts; it doubles up
/// to [`RECONNECT_MAX`].
const RECONNECT_MIN: Duration = Duration::from_millis(100);
/// The longest delay between background connection attempts: a member
/// that comes back is in use again within about this long.
const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// How often a continuing outage is logged again.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Connects to the store `url` names with `connect`; if that fails with a
/// retryable error, a [`Deferred`] store that keeps connecting in the
/// background (with `connect`) and fails every call retryably until then.
/// The public face, with its docs, is
/// [`stores::connect_or_defer`](crate::stores::connect_or_defer).
pub(crate) async fn connect_or_defer_with(url: &str, connect: ConnectFn) -> Result<Arc<dyn Backend>> {
    match connect(url).await {
        Ok(store) => Ok(store),
        Err(e) if e.is_retryable() => Ok(Arc::new(Deferred::start(url, e, connect))),
        Err(e) => Err(e),
    }
}

/// A store not connected yet, connecting in the background. See the
/// [module docs](self).
pub struct Deferred {
    shared: Arc<Shared>,
}

struct Shared {
    store: &'static str,
    /// The URL, password hidden, for errors and logs.
    endpoint: String,
    assumed: Capabilities,
    connected: OnceLock<Arc<dyn Backend>>,
    last_error: Mutex<String>,
}

impl fmt::Debug for Deferred {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deferred")
            .field("store", &self.shared.store)
            .field("endpoint", &self.shared.endpoint)
            .field("connected", &self.shared.connected.get().is_some())
            .finish()
    }
}

impl Deferred {
    /// Deferred after the connection error `first`; starts the background
    /// connection task (it ends once connected, or when this is dropped).
    fn start(url: &str, first: Error, connect: ConnectFn) -> Self {
        let (store, assumed) = assumed(url);
        let endpoint = crate::vocabulary::url_text::redact_url(url);
        tracing::warn!(store, endpoint = %endpoint, error = %first,
            "store unreachable while its composite is built; it counts as failing and is connected in the background");
        metrics::counter!(STORE_CONNECT_ERRORS_TOTAL, "store" => store).increment(1);
        metrics::gauge!(STORES_UNCONNECTED, "store" => store).increment(1.0);
        let shared = Arc::new(Shared {
            store,
            endpoint,
            assumed,
            connected: OnceLock::new(),
            last_error: Mutex::new(first.to_string()),
        });
        tokio::spawn(reconnect(Arc::downgrade(&shared), Secret::new(url), connect));
        Deferred { shared }
    }

    /// The connected store, or the error every call gets until then.
    fn store(&self) -> Result<&Arc<dyn Backend>> {
        self.shared.connected.get().ok_or_else(|| {
            let last = self.shared.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
            // The last error names the store and its endpoint already.
            Error::said(self.shared.store, true, format!("{last} (not connected yet; reconnecting in the background)"))
        })
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if self.shared.connected.get().is_none() {
            metrics::gauge!(STORES_UNCONNECTED, "store" => self.shared.store).decrement(1.0);
        }
    }
}

/// Connects `url` with a doubling, jittered backoff until it answers or
/// its [`Deferred`] is gone.
async fn reconnect(shared: Weak<Shared>, url: Secret, connect: ConnectFn) {
    let mut delay = RECONNECT_MIN;
    let mut warned = Instant::now();
    loop {
        let jittered = delay.mul_f64(crate::vocabulary::entropy::with_rng(|rng| rng.random_range(0.5..1.0)));
        tokio::time::sleep(jittered).await;
        delay = (delay * 2).min(RECONNECT_MAX);
        if shared.strong_count() == 0 {
            return;
        }
        let outcome = connect(url.expose()).await;
        let Some(shared) = shared.upgrade() else { return };
        match outcome {
            Ok(store) => {
                tracing::info!(store = shared.store, endpoint = %shared.endpoint, "store connected; it takes part again");
                metrics::gauge!(STORES_UNCONNECTED, "store" => shared.store).decrement(1.0);
                let _ = shared.connected.set(store);
                return;
            }
            Err(e) => {
                metrics::counter!(STORE_CONNECT_ERRORS_TOTAL, "store" => shared.store).increment(1);
                if warned.elapsed() >= WARN_EVERY {
                    warned = Instant::now();
                    tracing::warn!(store = shared.store, endpoint = %shared.endpoint, error = %e,
                        "store still unreachable; it counts as failing");
                }
                *shared.last_error.lock().unwrap_or_else(|p| p.into_inner()) = e.to_string();
            }
        }
    }
}

/// The store name and the capabilities its store declares, from `url`'s
/// scheme, before any connection: durability the weakest, and PostgreSQL's
/// notification absent (both known only once connected).
fn assumed(url: &str) -> (&'static str, Capabilities) {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase()).unwrap_or_default();
    let lease_model = Capabilities {
        shared_leases: true,
        fence_floor: true,
        admin: true,
        records: true,
        shrink: true,
        fence_durability: FenceDurability::Volatile,
        ..Capabilities::minimal()
    };
    let queued = Capabilities {
        fair: true,
        always_fair: true,
        store_notification: true,
        counts_waiters: true,
        session_bound: true,
        renew_slice: Some(4096),
        shared_leases: true,
        fence_durability: FenceDurability::Durable,
        fence_floor: false,
        admin: true,
        records: false,
        shrink: true,
    };
    match scheme.as_str() {
        "redis" | "rediss" | "redis+sentinel" | "redis+cluster" | "rediss+cluster" => {
            let caps = Capabilities {
                fair: true,
                always_fair: redis_fair_default(url),
                store_notification: true,
                counts_waiters: true,
                renew_slice: Some(32),
                ..lease_model
            };
            ("redis", caps)
        }
        "postgres" | "postgresql" => ("postgres", lease_model),
        "mysql" => ("mysql", lease_model),
        // The SQLite store's `RENEW_SLICE` (this file compiles without it).
        "sqlite" => ("sqlite", Capabilities { renew_slice: Some(512), ..lease_model }),
        "etcd" | "etcds" => ("etcd", queued),
        "zk" | "zks" | "zookeeper" | "zookeepers" => ("zookeeper", queued),
        // A RedLock connects its own members this way and builds without
        // them, so it is not deferred itself; whatever else: the least.
        _ => ("store", Capabilities::minimal()),
    }
}

#[cfg(feature = "redis")]
fn redis_fair_default(url: &str) -> bool {
    crate::stores::redis::RedisConfig::from_url(url).is_ok_and(|c| c.fair_default)
}

#[cfg(not(feature = "redis"))]
fn redis_fair_default(_url: &str) -> bool {
    false
}

#[async_trait]
impl Backend for Deferred {
    fn name(&self) -> &'static str {
        match self.shared.connected.get() {
            Some(store) => store.name(),
            None => self.shared.store,
        }
    }

    fn capabilities(&self) -> Capabilities {
        match self.shared.connected.get() {
            Some(store) => store.capabilities(),
            None => self.shared.assumed,
        }
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Grant>> {
        self.store()?.try_acquire(req).await
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Grant> {
        self.store()?.acquire(req).await
    }

    async fn release(&self, key: &LockKey, token: OwnerToken) -> Result<bool> {
        match self.shared.connected.get() {
            Some(store) => store.release(key, token).await,
            // Nothing was ever sent here: nothing to release.
            None => Ok(false),
        }
    }

    async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        match self.shared.connected.get() {
            Some(store) => store.renew(leases).await,
            // Nothing was ever granted here.
            None => Ok(vec![false; leases.len()]),
        }
    }

    async fn status(&self, key: &LockKey) -> Result<LockStatus> {
        self.store()?.status(key).await
    }

    async fn resize(&self, key: &LockKey, limit: u32) -> Result<u64> {
        self.store()?.resize(key, limit).await
    }

    async fn relabel(&self, key: &LockKey, token: OwnerToken, label: &str) -> Result<bool> {
        match self.shared.connected.get() {
            Some(store) => store.relabel(key, token, label).await,
            None => Ok(false),
        }
    }

    async fn raise_fence(&self, key: &LockKey, token: OwnerToken, floor: u64) -> Result<bool> {
        self.store()?.raise_fence(key, token, floor).await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<u64>> {
        self.store()?.read_record(key).await
    }

    async fn write_record(&self, key: &LockKey, token: OwnerToken, value: u64) -> Result<bool> {
        // Nothing was ever granted through an unconnected store, so its
        // token holds nothing there: nothing is written.
        match self.shared.connected.get() {
            Some(store) => store.write_record(key, token, value).await,
            None => Ok(false),
        }
    }

    async fn shrink(&self, key: &LockKey, token: OwnerToken, to: LeaseMode) -> Result<bool> {
        // Nothing was ever granted through an unconnected store.
        match self.shared.connected.get() {
            Some(store) => store.shrink(key, token, to).await,
            None => Ok(false),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        self.store()?.list(prefix).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<ForceReleased> {
        self.store()?.force_release(key).await
    }

    async fn watch_holders(&self, key: &LockKey) -> Result<Option<HolderWatch>> {
        // Unconnected: an error (not "no watch"), so that an observer asks
        // again once the store is there rather than polling for good.
        self.store()?.watch_holders(key).await
    }
}
