//! Segmented locks for hot keys: one logical lock split into N segment
//! mutexes, an id routed to its segment by a stable hash, fall-over to the
//! next segment that still has stock, and every segment at once for totals.
//!
//! See [`Segmented`] for the routing, the fall-over and where the
//! guarantees end.

mod all;
mod guard;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::client::Client;
use crate::lease::lock_options::LockOptions;
use crate::mutex::Mutex;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, MAX_KEY_BYTES};

pub use guard::{AllSegmentsGuard, SegmentGuard};

/// The most segments a [`Segmented`] lock may have. Taking every segment
/// ([`Segmented::lock_all`]) takes them one after another, so the bound
/// keeps that (and the per-handle marks) finite.
pub(crate) const MAX_SEGMENTS: usize = 4096;

/// The lock key of segment `index` of the segmented lock `key`:
/// `{key}/seg-{index}`, the index in decimal without padding (`stock:42/seg-0`
/// .. `stock:42/seg-99`). The naming is part of the stable interface: other
/// processes, other builds and other languages find a segment's lock (and
/// `holdfast status` shows it) by this name.
pub(crate) fn segment_key(key: &str, index: usize) -> String {
    format!("{key}/seg-{index}")
}

/// The segment `id` belongs to among `segments`: `XXH3_64(id) mod segments`,
/// XXH3 64-bit with seed 0 over the id's bytes, as published by the xxHash
/// project (`xxhsum -H3`, Python's `xxhash.xxh3_64_intdigest`). Fixed by that
/// specification, so the same in every process, build, platform and
/// language. `None` for 0 segments.
pub(crate) fn route(id: impl AsRef<[u8]>, segments: usize) -> Option<usize> {
    let n = u64::try_from(segments).ok().filter(|n| *n > 0)?;
    // The remainder is below `segments`, which is a usize.
    Some((xxhash_rust::xxh3::xxh3_64(id.as_ref()) % n) as usize)
}

/// A hot key split into segments, each under its own
/// [`Mutex`](crate::Mutex): the flash sale's stock of 2,000 items split into
/// 100 segments of 20, a buyer routed to one segment by a hash of their id,
/// so that 100 buyers can be inside at once instead of one. Cheap to clone;
/// holds nothing by itself. Made by [`Client::segmented`].
///
/// # Routing
///
/// Segment `i`'s lock key is `{key}/seg-{i}` ([`segment_key`](Self::segment_key)).
/// [`route`](Self::route) maps an id to `XXH3_64(id bytes) mod n`: the same in every process and build,
/// never `std`'s `DefaultHasher`, whose output may change between Rust
/// releases. It takes bytes, not `impl Hash`, for the same reason: `Hash`
/// impls feed a hasher differently on different platforms and releases.
/// Write a numeric id one way everywhere (its decimal text, or
/// `to_be_bytes()`). Every process must use the same `n`: another `n`
/// routes most ids elsewhere (this is not consistent hashing); changing `n`
/// means moving the stock under [`lock_all`](Self::lock_all).
///
/// # Fall-over
///
/// [`acquire_available`](Self::acquire_available) takes the id's segment
/// and runs a check under its lock ("does this segment still have stock?").
/// When the check says no, the segment is marked empty, released, and the
/// next segment in a fixed order (`i + 1`, `i + 2`, ... wrapping around) is
/// tried, skipping marked ones; `Ok(None)` once every segment is empty. A
/// holder never waits for a segment while holding another, so fall-over
/// cannot deadlock with anything.
///
/// **Marks are per handle**: kept in memory, shared by this handle's
/// clones, seen by no other handle or process. Another process learns a
/// segment is empty by running the check under its lock itself, once; a
/// mark is only a shortcut past a segment already found empty, and the
/// check under the lock always decides. Stock that comes back (a restock, a
/// cancelled order, a rebalance) is seen by a handle once it calls
/// [`restock`](Self::restock) or [`restock_all`](Self::restock_all); until
/// then it routes past that segment.
///
/// # Totals across segments
///
/// The article this design comes from warns that cross-segment statistics
/// are the hard part. Reading each segment's stock one after another while
/// buyers run does not give a total that was ever true: each read is from
/// another moment, and a rebalance that moves stock from segment 3 to
/// segment 7 between the two reads is counted twice or not at all.
/// [`lock_all`](Self::lock_all) takes every segment at once (a
/// [`MultiLock`](crate::MultiLock): canonical order, all or nothing, no deadlock with buyers,
/// who hold one segment at a time): while its guard lives no buyer is inside
/// any segment, so a total read under it, or a move of stock between
/// segments, is exact. It costs one acquisition per segment, one after
/// another, and it is not fair: buyers keep taking the segments it has not
/// reached yet.
///
/// # Guarantees and where they end
///
/// - Each segment is an ordinary mutex: one holder at a time, fences
///   increasing per segment, `lost()`, renewal and cancel safety as for
///   [`Mutex`](crate::Mutex). Fences of different segments are not
///   comparable; each protects its own segment's resource.
/// - The stock must be split the same way as the locks: segment `i`'s lock
///   protects segment `i`'s stock and nothing else. Two segments' stock in
///   one record (one row, one counter) is written by two holders at once.
/// - What the lock protects is the segment's resource; whether an id may buy
///   twice, or in two segments, is the application's to check.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> holdfast::Result<()> {
/// use std::time::Duration;
/// let client = holdfast::Client::connect("sqlite:///tmp/holdfast-doc.db").await?;
/// let stock = client.segmented("stock:42", 16)?.ttl(Duration::from_secs(10));
/// # let stock_left = async |_segment: usize| -> holdfast::Result<u64> { Ok(1) };
/// // A buyer: their segment, or the next one with stock, or sold out.
/// let sale = stock.acquire_available("buyer-1017", async |segment| Ok::<_, holdfast::Error>(stock_left(segment).await? > 0));
/// match sale.await? {
///     Some(guard) => {
///         // ... take one item of segment guard.segment(), fenced by guard.fence() ...
///         guard.release().await?;
///     }
///     None => println!("sold out"),
/// }
/// // An exact total: every segment held at once.
/// let all = stock.lock_all().await?;
/// let mut total = 0;
/// for segment in 0..all.segments() {
///     total += stock_left(segment).await?;
/// }
/// all.release().await?;
/// # let _ = total; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Segmented {
    pub(super) client: Client,
    pub(super) key: String,
    /// Segment `i`'s lock key at `i`.
    pub(super) keys: Arc<[String]>,
    pub(super) opts: LockOptions,
    /// Segment `i` was found empty by this handle or a clone.
    empty: Arc<[AtomicBool]>,
}

impl fmt::Debug for Segmented {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segmented")
            .field("key", &self.key)
            .field("segments", &self.keys.len())
            .field("marked_empty", &self.marked_empty())
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A [segmented lock](Segmented) of `segments` segments on `key`, with
    /// default [`LockOptions`]. Nothing is sent until an acquire.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for 0 segments or more than
    /// [`Segmented::MAX_SEGMENTS`] (`what: "segments"`), a key that is not a valid
    /// [`LockKey`], or one so long that the last segment's key
    /// (`{key}/seg-{segments - 1}`) passes [`LockKey::MAX_BYTES`] (`what: "key"`).
    pub fn segmented(&self, key: impl Into<String>, segments: usize) -> Result<Segmented> {
        let key = key.into();
        if segments == 0 || segments > MAX_SEGMENTS {
            return Err(Error::invalid(
                "segments",
                format!("a segmented lock has 1 to {MAX_SEGMENTS} segments, not {segments}"),
            ));
        }
        LockKey::new(key.as_str())?;
        let last = segment_key(&key, segments - 1);
        if last.len() > MAX_KEY_BYTES {
            return Err(Error::invalid(
                "key",
                format!(
                    "segment keys such as {last:?} would have {} bytes, above the {MAX_KEY_BYTES} a lock key may \
                     have: shorten the key by {} bytes",
                    last.len(),
                    last.len() - MAX_KEY_BYTES
                ),
            ));
        }
        Ok(Segmented {
            client: self.clone(),
            keys: (0..segments).map(|i| segment_key(&key, i)).collect(),
            key,
            opts: LockOptions::default(),
            empty: (0..segments).map(|_| AtomicBool::new(false)).collect(),
        })
    }
}

impl Segmented {
    /// The most segments a segmented lock has: 4,096.
    pub const MAX_SEGMENTS: usize = MAX_SEGMENTS;

    crate::lease::lock_options::lock_option_setters!("every segment");

    /// Sets how long a waiting acquire waits in all before it fails with
    /// [`Error::Timeout`] (default: no limit). For
    /// [`acquire_available`](Self::acquire_available) the limit is one
    /// deadline for every segment it tries; for
    /// [`lock_all`](Self::lock_all) one deadline for all segments.
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.opts.wait_timeout = Some(timeout);
        self
    }

    /// The options every segment is acquired with.
    pub fn options(&self) -> &LockOptions {
        &self.opts
    }

    /// The segmented lock's key (the segments' keys start with it).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How many segments there are.
    pub fn segments(&self) -> usize {
        self.keys.len()
    }

    /// Segment `index`'s lock key (`{key}/seg-{index}`), `None` out of range.
    pub fn segment_key(&self, index: usize) -> Option<&str> {
        self.keys.get(index).map(String::as_str)
    }

    /// The segment `id` is routed to: `XXH3_64(id) mod n` (see
    /// [Routing](Segmented#routing)). Stable across processes and builds;
    /// marks play no part.
    pub fn route(&self, id: impl AsRef<[u8]>) -> usize {
        route(id, self.keys.len()).unwrap_or(0)
    }

    /// Marks segment `index` empty for this handle and its clones:
    /// [`acquire_available`](Self::acquire_available) routes past it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an index out of range.
    pub fn mark_empty(&self, index: usize) -> Result<()> {
        self.mark(index)?.store(true, Ordering::Release);
        Ok(())
    }

    /// Un-marks segment `index` (stock came back): this handle and its
    /// clones route to it again. Other handles were never told it was empty.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an index out of range.
    pub fn restock(&self, index: usize) -> Result<()> {
        self.mark(index)?.store(false, Ordering::Release);
        Ok(())
    }

    /// Un-marks every segment.
    pub fn restock_all(&self) {
        for mark in self.empty.iter() {
            mark.store(false, Ordering::Release);
        }
    }

    /// Whether this handle (or a clone) marked segment `index` empty; false
    /// out of range.
    pub fn is_marked_empty(&self, index: usize) -> bool {
        self.empty.get(index).is_some_and(|m| m.load(Ordering::Acquire))
    }

    /// The segments marked empty, in index order.
    pub fn marked_empty(&self) -> Vec<usize> {
        (0..self.keys.len()).filter(|&i| self.is_marked_empty(i)).collect()
    }

    fn mark(&self, index: usize) -> Result<&AtomicBool> {
        self.empty.get(index).ok_or_else(|| self.out_of_range(index))
    }

    fn out_of_range(&self, index: usize) -> Error {
        Error::invalid("segment", format!("segment {index} of a lock with {} segments", self.keys.len()))
    }

    /// Segment `index`'s mutex, with this handle's options.
    fn mutex(&self, index: usize) -> Result<Mutex> {
        let key = self.keys.get(index).ok_or_else(|| self.out_of_range(index))?;
        Ok(self.client.mutex_with_options(key.as_str(), self.opts.clone()))
    }

    /// Waits for the segment `id` routes to (marks play no part), at most
    /// the [`wait_timeout`](Self::wait_timeout) if set.
    ///
    /// # Cancel safety
    ///
    /// As for [`Mutex::acquire`](crate::Mutex::acquire): dropping the
    /// future leaves no grant and no queue entry behind.
    pub async fn acquire(&self, id: impl AsRef<[u8]>) -> Result<SegmentGuard> {
        self.acquire_segment(self.route(id)).await
    }

    /// One attempt at the segment `id` routes to: `None` if it is busy.
    ///
    /// # Cancel safety
    ///
    /// As for [`Mutex::try_acquire`](crate::Mutex::try_acquire).
    pub async fn try_acquire(&self, id: impl AsRef<[u8]>) -> Result<Option<SegmentGuard>> {
        let segment = self.route(id);
        Ok(self.mutex(segment)?.try_acquire().await?.map(|guard| SegmentGuard::new(segment, guard)))
    }

    /// Waits for segment `index` itself, at most the
    /// [`wait_timeout`](Self::wait_timeout) if set.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an index out of range, before any I/O;
    /// otherwise as [`Mutex::acquire`](crate::Mutex::acquire).
    ///
    /// # Cancel safety
    ///
    /// As for [`Mutex::acquire`](crate::Mutex::acquire).
    pub async fn acquire_segment(&self, index: usize) -> Result<SegmentGuard> {
        Ok(SegmentGuard::new(index, self.mutex(index)?.acquire().await?))
    }

    /// The fall-over acquire: takes the segment `id` routes to and runs
    /// `has_stock(segment index)` under its lock; if it says `true`, returns
    /// the guard.
    /// If it says `false`, marks the segment empty (see
    /// [Fall-over](Segmented#fall-over)), releases it, and tries the next
    /// segment not marked, in the order `i + 1, i + 2, ...` wrapping around,
    /// until one has stock. `Ok(None)` once every segment is marked empty:
    /// sold out, as far as this handle knows.
    ///
    /// `has_stock` gets the segment's index rather than its guard, and its
    /// future owns what it uses: such a future, unlike one that borrows the
    /// guard, keeps the call `Send` for [`tokio::spawn`]. The fence is on the
    /// guard returned, for the writes.
    ///
    /// Each segment is awaited in turn, with one deadline for the whole
    /// call if a [`wait_timeout`](Self::wait_timeout) is set. No segment is
    /// held while another is awaited. `has_stock` must not take another
    /// segment of this lock (or [`lock_all`](Self::lock_all)): it runs while
    /// this one is held.
    ///
    /// # Errors
    ///
    /// The error `has_stock` returns (the segment is released first and not
    /// marked); [`Error::Lost`] if the segment's lease was lost by the time
    /// `has_stock` answered (its answer cannot be trusted; the segment is
    /// not marked); the first segment's acquire error ([`Error::Timeout`] at
    /// the deadline, naming the segment then awaited, a store error).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future at any await point leaves no grant
    /// behind. While a segment is awaited, that is
    /// [`Mutex::acquire`](crate::Mutex::acquire)'s cancel safety; while
    /// `has_stock` runs or an empty segment is being released, the held
    /// segment is released in the background (its guard's drop, or the
    /// release's own task). A mark already set stays set: it was found
    /// empty under the lock.
    pub async fn acquire_available<E, F>(
        &self,
        id: impl AsRef<[u8]>,
        mut has_stock: impl FnMut(usize) -> F,
    ) -> std::result::Result<Option<SegmentGuard>, E>
    where
        F: Future<Output = std::result::Result<bool, E>>,
        E: From<Error>,
    {
        let started = Instant::now();
        let deadline = self.opts.wait_timeout.map(|t| started.checked_add(t));
        let n = self.keys.len();
        let first = self.route(id);
        for index in (first..n).chain(0..first) {
            if self.is_marked_empty(index) {
                continue;
            }
            let mutex = self.mutex(index)?;
            let guard = match deadline {
                None | Some(None) => mutex.acquire().await,
                Some(Some(at)) => match mutex.acquire_timeout(at.saturating_duration_since(Instant::now())).await {
                    Err(Error::Timeout { key, .. }) => Err(Error::Timeout { key, waited: started.elapsed() }),
                    other => other,
                },
            };
            let guard = SegmentGuard::new(index, guard?);
            let answer = has_stock(index).await;
            if guard.is_lost() {
                let key = guard.key().to_owned();
                drop(guard);
                return Err(Error::Lost { key }.into());
            }
            match answer {
                Ok(true) => return Ok(Some(guard)),
                Ok(false) => {
                    self.empty[index].store(true, Ordering::Release);
                    tracing::debug!(key = %guard.key(), "segment empty; falling over to the next");
                    if let Err(e) = guard.release().await {
                        // The answer was given under the lock; only the
                        // release's outcome is unknown (it goes on in the
                        // background on a store error).
                        tracing::warn!(segment = index, error = %e, "releasing an empty segment");
                    }
                }
                Err(e) => {
                    if let Err(re) = guard.release().await {
                        tracing::warn!(segment = index, error = %re, "releasing a segment whose check failed");
                    }
                    return Err(e);
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests;
