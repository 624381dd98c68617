//! The all-or-nothing multi-lock: one guard over several mutexes, on one
//! store or on several, granted whole or not at all.
//!
//! See [`MultiLock`] for the order parts are taken in and what holds.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures::future::{join_all, select_all};
use tokio::time::Instant;

use crate::client::Client;
use crate::guard::MutexGuard;
use crate::lease::lock_options::LockOptions;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, check_ttl};

/// A lock over several keys, on one store or on several, granted all or
/// nothing. Cheap to clone; holds nothing by itself.
///
/// A multi-lock is a composite over ordinary [`Mutex`](crate::Mutex)es,
/// not a store of its own: each part is a lease on its own store, with its
/// own fence, renewal and `lost()`.
///
/// # The canonical order
///
/// Parts are taken one after another in one order that every process
/// computes the same way: by key (byte order), then by the part's
/// [`Client::store_id`]. A process waits for a part only while it holds
/// parts that come before it, never after, so two multi-locks that overlap
/// cannot each hold what the other waits for: they never deadlock, whatever
/// order their parts were listed in.
///
/// The store identity is the client's URL as written (passwords hidden) or
/// the one set with [`ClientOptions::with_store_id`](crate::ClientOptions::with_store_id);
/// every process must name a store the same way. Parts with the same key on
/// two stores of the same kind are ordered by that identity. A client built
/// with [`Client::with_backend`] is identified by its store's name alone, so
/// two such stores of one kind with the same key in one multi-lock are
/// refused as duplicates until they are given store ids.
///
/// # Guarantees and where they end
///
/// - **All or nothing**: a multi-lock returns a guard only once every part is
///   granted. Any other outcome (a busy part for [`try_acquire`](MultiLock::try_acquire),
///   the deadline, a store error, a part lost while waiting, the future
///   dropped) releases the parts already granted before it returns (or, when
///   dropped, on tasks of their own).
/// - **No atomic grant across stores**: parts are granted one after another,
///   so a part may be held for a while by a multi-lock that then fails, and
///   parts on different stores can be lost independently. [`MultiGuard::lost`]
///   fires when any part is lost; each part's fence protects its resource.
/// - A store reached under two identities (two URLs for one server) with the
///   same key on both is two parts on one lock: the multi-lock waits for itself.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> holdfast::Result<()> {
/// use std::time::Duration;
/// let orders = holdfast::Client::connect("sqlite:///tmp/holdfast-doc.db").await?;
/// let cache = holdfast::Client::connect("redis://127.0.0.1:6379").await?;
/// let both = holdfast::MultiLock::new()
///     .with(&orders, "order:17")
///     .with(&cache, "cache:order:17")
///     .ttl(Duration::from_secs(10));
/// let guard = both.acquire_timeout(Duration::from_secs(3)).await?;
/// for (key, fence) in guard.fences() {
///     println!("{key}: fence {fence}");
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MultiLock {
    parts: Vec<(Client, String)>,
    opts: LockOptions,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("parts", &self.parts.iter().map(|(c, k)| (c.store_id(), k)).collect::<Vec<_>>())
            .field("opts", &self.opts)
            .finish()
    }
}

/// One part of a checked plan, in canonical order.
struct Part<'a> {
    client: &'a Client,
    key: &'a str,
}

impl Client {
    /// A [multi-lock](MultiLock) over `keys` on this client's store, with
    /// default [`LockOptions`]; add parts on other stores with
    /// [`MultiLock::with`]. Nothing is checked or sent until an acquire.
    pub fn multi(&self, keys: impl IntoIterator<Item = impl Into<String>>) -> MultiLock {
        keys.into_iter().fold(MultiLock::new(), |multi, key| multi.with(self, key))
    }
}

impl MultiLock {
    /// A multi-lock of no parts yet, with default [`LockOptions`]; add parts
    /// with [`with`](Self::with).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `key` on `client`'s store as a part. The order parts are added
    /// in does not matter (see the [canonical order](MultiLock#the-canonical-order)).
    pub fn with(mut self, client: &Client, key: impl Into<String>) -> Self {
        self.parts.push((client.clone(), key.into()));
        self
    }

    crate::lease::lock_options::lock_option_setters!("every part");

    /// How many parts were added.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// Whether no part was added (acquiring such a multi-lock is refused).
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The options every part acquires with.
    pub fn options(&self) -> &LockOptions {
        &self.opts
    }

    /// One attempt at each part in turn: the guard if every part was granted,
    /// `None` as soon as one is busy, after the parts already granted were
    /// released (they are free when this returns).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] before any I/O for no parts, two parts with the
    /// same key on the same store, a bad key, TTL or renewal period; a part's
    /// store error, after the parts already granted were released.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future at any await point leaves no grant
    /// behind. The part in flight is cleaned up as
    /// [`Mutex::try_acquire`](crate::Mutex::try_acquire) does; the parts
    /// already granted are released in the background by their guards' drop.
    pub async fn try_acquire(&self) -> Result<Option<MultiGuard>> {
        self.acquire_parts(None).await
    }

    /// Waits for every part, in the canonical order, holding the parts
    /// already granted while it waits for the next (which cannot deadlock
    /// with another multi-lock: see the [canonical order](MultiLock#the-canonical-order)).
    /// Each part's wait follows the [waiting policy](crate::backend::wait#the-waiting-policy).
    ///
    /// # Errors
    ///
    /// As for [`try_acquire`](Self::try_acquire); also [`Error::Lost`] if a
    /// part granted earlier was lost while a later one was awaited. Every
    /// part already granted is released before the error is returned.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping this future at any await point leaves no grant
    /// and no queue entry behind. The part being waited for is cleaned up as
    /// [`Mutex::acquire`](crate::Mutex::acquire) does; the parts already
    /// granted are released in the background by their guards' drop, on tasks
    /// the drop cannot cancel.
    pub async fn acquire(&self) -> Result<MultiGuard> {
        self.wait_for_all(None).await
    }

    /// Waits for every part as [`acquire`](Self::acquire) does, with one
    /// deadline `timeout` from now for the whole; then fails with
    /// [`Error::Timeout`] (naming the part that stayed busy, and the time
    /// waited in all) after releasing the parts already granted.
    ///
    /// # Cancel safety
    ///
    /// As for [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<MultiGuard> {
        // A deadline past what the clock can count is no deadline.
        self.wait_for_all(Some(Instant::now().checked_add(timeout))).await
    }

    async fn wait_for_all(&self, deadline: Option<Option<Instant>>) -> Result<MultiGuard> {
        let waiting = Some(deadline.flatten());
        self.acquire_parts(waiting)
            .await?
            // A waiting part acquire only returns a grant or an error.
            .ok_or_else(|| Error::backend("holdfast", false, "a waiting multi-lock acquire came back busy"))
    }

    /// The parts checked (everything that can be refused before any I/O is)
    /// and sorted into the canonical order.
    fn plan(&self) -> Result<Vec<Part<'_>>> {
        if self.parts.is_empty() {
            return Err(Error::invalid("multi-lock", "a multi-lock needs at least one key"));
        }
        check_ttl(self.opts.ttl)?;
        self.opts.renew_interval()?;
        let mut plan = Vec::with_capacity(self.parts.len());
        for (client, key) in &self.parts {
            LockKey::new(key.as_str())?;
            plan.push(Part { client, key });
        }
        plan.sort_by(|a, b| (a.key, a.client.store_id()).cmp(&(b.key, b.client.store_id())));
        if let Some(pair) =
            plan.windows(2).find(|w| (w[0].key, w[0].client.store_id()) == (w[1].key, w[1].client.store_id()))
        {
            return Err(Error::invalid(
                "multi-lock",
                format!(
                    "key {:?} appears twice on store {:?} (stores built with Client::with_backend need distinct \
                     ClientOptions::with_store_id to be told apart)",
                    pair[0].key,
                    pair[0].client.store_id()
                ),
            ));
        }
        Ok(plan)
    }

    /// Takes the parts in canonical order: `waiting` is `None` for one
    /// attempt each, `Some(deadline)` to wait (until the deadline, if any).
    async fn acquire_parts(&self, waiting: Option<Option<Instant>>) -> Result<Option<MultiGuard>> {
        let started = Instant::now();
        let plan = self.plan()?;
        let opts = LockOptions { wait_timeout: None, ..self.opts.clone() };
        // Dropped with this future, these guards release in the background.
        let mut held: Vec<Held> = Vec::with_capacity(plan.len());
        for part in plan {
            let mutex = part.client.mutex_with_options(part.key, opts.clone());
            let attempt = async {
                match waiting {
                    None => mutex.try_acquire().await,
                    Some(None) => mutex.acquire().await.map(Some),
                    Some(Some(deadline)) => {
                        mutex.acquire_timeout(deadline.saturating_duration_since(Instant::now())).await.map(Some)
                    }
                }
            };
            let outcome = tokio::select! {
                biased;
                outcome = attempt => outcome,
                // Dropping the attempt cleans it up as a dropped acquire does.
                key = any_lost(&held) => Err(Error::Lost { key }),
            };
            let failure = match outcome {
                Ok(Some(guard)) => {
                    held.push(Held { store: part.client.store_id().to_owned(), guard });
                    continue;
                }
                Ok(None) => None,
                Err(Error::Timeout { key, .. }) => Some(Error::Timeout { key, waited: started.elapsed() }),
                Err(e) => Some(e),
            };
            release_partial(held).await;
            return failure.map_or(Ok(None), Err);
        }
        if let Some(lost) = held.iter().find(|p| p.guard.is_lost()) {
            let key = lost.guard.key().to_owned();
            release_partial(held).await;
            return Err(Error::Lost { key });
        }
        Ok(Some(MultiGuard { parts: held }))
    }
}

/// One granted part: its store's identity and its guard.
struct Held {
    store: String,
    guard: MutexGuard,
}

/// Resolves with the key of the first of `parts` to be lost; never without
/// parts.
fn any_lost(parts: &[Held]) -> impl Future<Output = String> + Send + 'static {
    let watches: Vec<_> = parts
        .iter()
        .map(|p| {
            let (lost, key) = (p.guard.lost(), p.guard.key().to_owned());
            Box::pin(async move {
                lost.await;
                key
            })
        })
        .collect();
    async move {
        if watches.is_empty() {
            return std::future::pending().await;
        }
        select_all(watches).await.0
    }
}

/// Releases every part at once; the first error in canonical order.
async fn release_all(parts: Vec<Held>) -> Result<()> {
    let outcomes = join_all(parts.into_iter().map(|p| p.guard.release())).await;
    outcomes.into_iter().find(Result::is_err).unwrap_or(Ok(()))
}

/// Releases the parts of a multi-lock that failed. A release that failed on
/// a store error goes on in the background (see [`MutexGuard::release`]);
/// the caller's outcome is the failure that ended the attempt.
async fn release_partial(parts: Vec<Held>) {
    if let Err(e) = release_all(parts).await {
        tracing::warn!(error = %e, "releasing the parts of a failed multi-lock");
    }
}

/// A held [`MultiLock`]: every part's lease. Dropping it releases every part.
///
/// `Send` and `Sync`, and `'static`, like every guard.
///
/// # Drop
///
/// Prefer [`release`](Self::release), which reports whether every part was
/// still held. A guard dropped without it releases each part as a dropped
/// [`MutexGuard`] does: in the background when a tokio runtime is running,
/// else when each lease runs out.
#[must_use = "every part is released when the guard is dropped"]
#[clippy::has_significant_drop]
pub struct MultiGuard {
    /// In canonical order.
    parts: Vec<Held>,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.parts.iter().map(|p| (&p.store, &p.guard))).finish()
    }
}

impl MultiGuard {
    /// Each part's key and fence, in the canonical order (by key, then by
    /// store identity). Each fence is its own store's, for the resource that
    /// part protects: fences of different parts are not comparable.
    pub fn fences(&self) -> Vec<(&str, u64)> {
        self.parts.iter().map(|p| (p.guard.key(), p.guard.fence())).collect()
    }

    /// Each part's store identity ([`Client::store_id`]) and guard, in the
    /// canonical order: for a part's token, TTL or its own `lost()`.
    pub fn parts(&self) -> impl ExactSizeIterator<Item = (&str, &MutexGuard)> + '_ {
        self.parts.iter().map(|p| (p.store.as_str(), &p.guard))
    }

    /// Whether any part is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.parts.iter().any(|p| p.guard.is_lost())
    }

    /// Resolves when any part is lost (see [`MutexGuard::lost`]); the others
    /// may still be held. Never resolves while every part is held; may be
    /// awaited after the guard is gone (it is `'static`).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only observes the leases; dropping it changes nothing.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let lost = any_lost(&self.parts);
        async move {
            lost.await;
        }
    }

    /// Resolves when any part can no longer be guaranteed to last another
    /// `within` (see [`MutexGuard::expiring`]). May be awaited after the guard
    /// is gone (it is `'static`).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only observes the leases; dropping it changes nothing.
    pub fn expiring(&self, within: Duration) -> impl Future<Output = ()> + Send + 'static {
        let watches: Vec<_> = self.parts.iter().map(|p| Box::pin(p.guard.expiring(within))).collect();
        async move {
            if watches.is_empty() {
                return std::future::pending().await;
            }
            select_all(watches).await;
        }
    }

    /// Releases every part at once, owner-checked, and returns the first
    /// error in canonical order ([`Error::Lost`] if that part's lease had run
    /// out or been taken over, or a store error); the other parts are
    /// released regardless.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: each part's release is carried out once started (on a
    /// task of its own if this future is dropped), and a part whose release had not started is released by its
    /// guard's drop; only the outcome is not reported.
    pub async fn release(self) -> Result<()> {
        release_all(self.parts).await
    }
}
