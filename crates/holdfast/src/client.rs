//! The client: one store connection, its renewal task, and the lock builders.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::wait::DEFAULT_STORE_RETRY;
use crate::backend::{Backend, ForceReleased, LockStatus};
use crate::election::Election;
use crate::guard::MutexGuard;
use crate::held::ClientCore;
use crate::lease::lock_options::LockOptions;
use crate::mutex::Mutex;
use crate::rwlock::RwLock;
use crate::semaphore::Semaphore;
use crate::vocabulary::capability::Capabilities;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::LockKey;

/// Settings of a [`Client`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// The label stored with every grant and shown by `status`; default
    /// `host:pid`. At most 4096 bytes of UTF-8 without NUL: a longer one, or
    /// one with a NUL, makes every acquire fail with [`Error::InvalidInput`]
    /// (`what: "label"`) before any I/O.
    pub label: Option<String>,
    /// How long a waiting acquire rides out a store that fails (connection
    /// lost, failover, its session expired) before it fails with the store's
    /// error; default 10 s. See the [waiting policy](crate::backend::wait#the-waiting-policy).
    pub store_retry: Duration,
    /// The store's identity, as [`Client::store_id`] reports it; `None`: the
    /// redacted URL for a client opened from a URL, the store's name for one
    /// built with [`Client::with_backend`]. Only a
    /// [multi-lock](crate::MultiLock) reads it, to order and tell apart parts
    /// on different stores; every process must give a store the same identity.
    pub store_id: Option<String>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions { label: None, store_retry: DEFAULT_STORE_RETRY, store_id: None }
    }
}

impl ClientOptions {
    /// Sets the holder label.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Sets how long a waiting acquire rides out a failing store.
    pub fn with_store_retry(mut self, store_retry: Duration) -> Self {
        self.store_retry = store_retry;
        self
    }

    /// Sets the store's identity (see [`store_id`](Self::store_id)): for a
    /// client built with [`Client::with_backend`] whose store takes part in
    /// [multi-locks](crate::MultiLock) next to another store of the same kind.
    pub fn with_store_id(mut self, store_id: impl Into<String>) -> Self {
        self.store_id = Some(store_id.into());
        self
    }
}

/// A connection to one lock store. Cheap to clone; clones share the
/// connection and the renewal task.
///
/// ```no_run
/// # async fn demo() -> holdfast::Result<()> {
/// let client = holdfast::Client::connect("sqlite:///tmp/holdfast-doc.db").await?;
/// let total = client
///     .with_lock("billing/run", holdfast::LockOptions::default(), async |guard| {
///         // ... work that must not run twice at once; guard.fence() for writes ...
///         guard.fence()
///     })
///     .await?;
/// # let _ = total; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    core: Arc<ClientCore>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("backend", &self.core.backend)
            .field("label", &self.core.label)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the store the URL names. The scheme picks the store:
    /// `sqlite://PATH` (feature `sqlite`, on by default); see the crate docs
    /// for the others. A scheme whose feature is off fails with
    /// [`Error::FeatureDisabled`]; a malformed URL with [`Error::InvalidInput`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: connecting takes no lock, so a dropped connect leaves
    /// nothing behind.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, ClientOptions::default()).await
    }

    /// Connects with options.
    ///
    /// # Cancel safety
    ///
    /// As for [`connect`](Self::connect).
    pub async fn connect_with(url: &str, mut options: ClientOptions) -> Result<Self> {
        let backend = crate::stores::connect(url).await?;
        options.store_id.get_or_insert_with(|| crate::vocabulary::url_text::redact_url(url));
        Ok(Self::with_backend(backend, options))
    }

    /// A client over a backend built by hand (or a custom one). Its
    /// [`store_id`](Self::store_id) is the one in `options`, or else the
    /// store's name.
    pub fn with_backend(backend: Arc<dyn Backend>, options: ClientOptions) -> Self {
        let label = options.label.unwrap_or_else(crate::lease::lock_options::default_label);
        let store_id = options.store_id.unwrap_or_else(|| backend.name().to_owned());
        Client { core: Arc::new(ClientCore::new(backend, label, options.store_retry, store_id)) }
    }

    /// A mutex on `key` with default [`LockOptions`]. Nothing is checked or
    /// sent until an acquire.
    pub fn mutex(&self, key: impl Into<String>) -> Mutex {
        Mutex::new(self.core.clone(), key.into(), LockOptions::default())
    }

    /// A mutex on `key` with the given options (the builder methods on
    /// [`Mutex`] change them further).
    pub fn mutex_with_options(&self, key: impl Into<String>, options: LockOptions) -> Mutex {
        Mutex::new(self.core.clone(), key.into(), options)
    }

    /// A semaphore of `permits` permits on `key` with default [`LockOptions`]
    /// (see [`Semaphore`] for how the count lives with the key). Nothing is
    /// checked or sent until an acquire; 0 permits is refused there.
    pub fn semaphore(&self, key: impl Into<String>, permits: u32) -> Semaphore {
        Semaphore::new(self.core.clone(), key.into(), LockOptions::default()).with_permits(permits)
    }

    /// A leader election named `name` (its lock key) with default
    /// [`LockOptions`].
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election::new(self.core.clone(), name.into(), LockOptions::default())
    }

    /// A leader election named `name` with the given options for its
    /// leadership lease.
    pub fn election_with_options(&self, name: impl Into<String>, options: LockOptions) -> Election {
        Election::new(self.core.clone(), name.into(), options)
    }

    /// A read-write lock on `key` with default [`LockOptions`].
    pub fn rwlock(&self, key: impl Into<String>) -> RwLock {
        RwLock::new(self.core.clone(), key.into(), LockOptions::default())
    }

    /// A read-write lock on `key` with the given options for both sides.
    pub fn rwlock_with_options(&self, key: impl Into<String>, options: LockOptions) -> RwLock {
        RwLock::new(self.core.clone(), key.into(), options)
    }

    /// Runs `work` while holding `key`, then releases it.
    ///
    /// Waits for the key (at most `options.wait_timeout`, if set). If the
    /// lease is lost while `work` runs, `work` is dropped at its current await
    /// point and the call fails with [`Error::Lost`]: nothing keeps running
    /// unprotected.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in that nothing is left behind: dropping the future while
    /// it waits is [`Mutex::acquire`]'s cancel safety; dropping it while
    /// `work` runs drops `work` at its await point and releases the lock in
    /// the background (the guard's drop). `work` itself must tolerate being
    /// dropped at any of its await points.
    pub async fn with_lock<T>(
        &self,
        key: impl Into<String>,
        options: LockOptions,
        work: impl AsyncFnOnce(&MutexGuard) -> T,
    ) -> Result<T> {
        let guard = self.mutex_with_options(key, options).acquire().await?;
        let lost = guard.lost();
        let outcome = tokio::select! {
            biased;
            _ = lost => None,
            out = work(&guard) => Some(out),
        };
        match outcome {
            Some(out) => {
                guard.release().await?;
                Ok(out)
            }
            None => {
                let key = guard.key().to_owned();
                drop(guard);
                Err(Error::Lost { key })
            }
        }
    }

    /// Who holds `key`, as far as the store can tell.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn status(&self, key: &str) -> Result<LockStatus> {
        self.core.status(key).await
    }

    /// The store's declared capabilities.
    pub fn capabilities(&self) -> Capabilities {
        self.core.backend.capabilities()
    }

    /// The store's name (`"sqlite"`, `"redis"`, ...).
    pub fn store_name(&self) -> &'static str {
        self.core.backend.name()
    }

    /// The store's identity: the one set with [`ClientOptions::with_store_id`],
    /// or else the URL the client was opened with, passwords hidden
    /// ([`redact_url`](crate::stores::redact_url)), or else (a client built with
    /// [`with_backend`](Self::with_backend)) the store's name. A
    /// [multi-lock](crate::MultiLock) orders its parts by key, then by this,
    /// and refuses two parts with the same key and identity.
    pub fn store_id(&self) -> &str {
        &self.core.store_id
    }

    /// How many leases this client is renewing now.
    pub fn renewing_leases(&self) -> usize {
        self.core.renewer.len()
    }

    // Admin calls, for people on call: list the held keys, free a key whose
    // holder is gone. Not for applications' locking paths: a forced release
    // breaks the mutual exclusion a holder believes it has (its fence still
    // protects a fenced resource, and its `lost()` fires at its next renewal).

    /// Every key under `prefix` (`None`: every key) that has an unexpired
    /// lease, with its holder, shared leases, fences, TTL left and waiters,
    /// sorted by key: the admin view behind `holdfast list`.
    ///
    /// # Cost
    ///
    /// An admin call, not for a locking path: it reads every key under the
    /// prefix (O(keys held there), plus the key's status where the store
    /// needs a second read), in pages where the store pages (Redis `SCAN`
    /// on every master, an etcd range, ZooKeeper children, one SQL query).
    /// Narrow it with a prefix on a store with many held keys.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad prefix (see [`LockKey::check_prefix`]);
    /// [`Error::Unsupported`] on a store that cannot list (the composites
    /// other than those that say so).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn list(&self, prefix: Option<&str>) -> Result<Vec<LockStatus>> {
        let prefix = LockKey::check_prefix(prefix.unwrap_or(""))?;
        let mut all = self.core().backend.list(prefix).await?;
        all.retain(|s| s.key.starts_with(prefix) && (s.holder.is_some() || !s.shared.is_empty()));
        all.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(all)
    }

    /// Frees `key` whatever its owner: removes its exclusive lease and its
    /// shared leases, and returns their fences ([`ForceReleased::was_free`]
    /// if nothing was held). For a key whose holder is gone, without waiting
    /// out its lease.
    ///
    /// After it returns, the key can be granted again at once, with a fence
    /// above every removed one; waiters are woken as by a release (and
    /// keep their places in the queue); the old holder's next renewal fails,
    /// so its `lost()` fires by then at the latest (until then it may still
    /// believe it holds the key: its fence is what a fenced resource must
    /// check).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad key; [`Error::Unsupported`] on a
    /// store that cannot (see [`list`](Self::list)).
    ///
    /// # Cancel safety
    ///
    /// Dropped, it removed all, some or none of the key's leases (one
    /// script or transaction on Redis and the SQL stores: all or none; on
    /// etcd one transaction; on ZooKeeper one delete per holding node);
    /// calling it again removes the rest and is otherwise harmless.
    pub async fn force_release(&self, key: &str) -> Result<ForceReleased> {
        let key = LockKey::new(key)?;
        self.core().backend.force_release(&key).await
    }

    /// What this client shares with its locks and guards.
    pub(crate) fn core(&self) -> &Arc<ClientCore> {
        &self.core
    }
}
