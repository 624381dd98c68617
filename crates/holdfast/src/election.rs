//! Leader election over the lease model: a campaign is a mutex acquire (fair
//! where the store queues) whose grant carries the candidate's value as its
//! label; the term is the grant's fence.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};

use crate::backend::{Backend, HolderWatch};
use crate::guard::MutexGuard;
use crate::held::ClientCore;
use crate::lease::lock_options::LockOptions;
use crate::mutex::Mutex;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::LockKey;

/// The longest value a candidate may publish (a value is the grant's
/// label, under the same rule: no NUL either).
pub(crate) const MAX_VALUE_BYTES: usize = crate::vocabulary::key::MAX_LABEL_BYTES;

/// A named leader election. Cheap to clone; campaigns nothing by itself.
///
/// The election named `name` is the lock key `name`: its leader is the key's
/// holder, the published value is the grant's label (so `holdfast status
/// NAME` shows the leader), and the **term** is the grant's fence, strictly
/// increasing across leaders.
///
/// - **Safety**: at most one leader at a time on the store's clock, with
///   the mutex's guarantees: a leader that stops renewing learns it from
///   [`Leadership::lost`] before the store can elect anyone else.
/// - **Order**: on a store that queues waiters (declares `fair`: Redis in
///   fair mode, etcd, ZooKeeper) candidates lead in the order they
///   campaigned; elsewhere the next leader is whichever candidate's attempt
///   lands first.
/// - **Restarts**: a restarted process does not resume an old leadership;
///   it campaigns anew, and its old grant is released or runs out.
///
/// ```no_run
/// # async fn demo() -> holdfast::Result<()> {
/// let client = holdfast::Client::connect("sqlite:///tmp/holdfast-doc.db").await?;
/// let election = client.election("scheduler");
/// let leading = election.campaign("worker-7:8080").await?;   // resolves when this one leads
/// println!("leading in term {}", leading.term());
/// tokio::select! {
///     _ = leading.lost() => { /* stop scheduling: someone else may lead now */ }
///     _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => leading.resign().await?,
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    mutex: Mutex,
    /// How often [`observe`](Self::observe) reads the leader.
    poll: Duration,
}

/// A leader as observers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The value the leader published.
    pub value: String,
    /// Its term: the fence of its grant, strictly increasing across leaders.
    pub term: u64,
}

impl Election {
    /// The longest value a candidate publishes, in bytes.
    pub const MAX_VALUE_BYTES: usize = MAX_VALUE_BYTES;

    pub(crate) fn new(core: Arc<ClientCore>, name: String, opts: LockOptions) -> Self {
        Election { mutex: Mutex::new(core, name, opts), poll: Duration::from_millis(100) }
    }

    /// The election's name (its lock key).
    pub fn name(&self) -> &str {
        self.mutex.key()
    }

    /// Sets the leadership lease's TTL: a leader that dies is replaced
    /// within it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.mutex = self.mutex.ttl(ttl);
        self
    }

    /// Sets how often [`observe`](Self::observe) reads the leader on a
    /// store without a watch (default 100 ms), and how long it waits
    /// before asking again after a failed start of a watch.
    pub fn observe_every(mut self, every: Duration) -> Self {
        self.poll = every.max(Duration::from_millis(1));
        self
    }

    /// Campaigns with `value` and resolves once this candidate leads.
    /// Waits without limit, or at most the options' `wait_timeout` (then
    /// [`Error::Timeout`]). A value over [`MAX_VALUE_BYTES`](Self::MAX_VALUE_BYTES), or with a NUL,
    /// is [`Error::InvalidInput`] before any I/O.
    ///
    /// # Cancel safety
    ///
    /// As for [`Mutex::acquire`](crate::Lock::acquire): dropping the future
    /// withdraws the candidacy, leaving no grant and no queue entry.
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        let value = check_value(value.into())?;
        let fair = self.mutex.core().backend.capabilities().fair;
        let mut candidate = self.mutex.clone().fair(fair);
        candidate.label = Some(value.clone());
        let guard = candidate.acquire().await?;
        Ok(Leadership { guard, value })
    }

    /// Leads whenever it can, in the manner of Curator's `LeaderSelector`
    /// with auto-requeue: campaigns with `value`; once leading, runs
    /// `take_leadership(term)`; when that returns `Ok`, resigns and
    /// campaigns again; when leadership is lost, **drops** the
    /// `take_leadership` future (it runs no further: loss is seen before the
    /// store can elect anyone else, so no two candidates' work overlaps as
    /// long as the work is awaited inside that future) and campaigns again.
    ///
    /// It returns only an error: the one `take_leadership` returned (after
    /// resigning), an invalid `value`, or a permanent store error (bad
    /// credentials, say). A store that is down is campaigned through: the
    /// campaign is tried again every second, with a warning logged. End it
    /// by dropping the future, for instance in a `select!` with your
    /// shutdown signal.
    ///
    /// ```no_run
    /// # async fn demo() -> holdfast::Result<()> {
    /// let client = holdfast::Client::connect("sqlite:///tmp/holdfast-doc.db").await?;
    /// let election = client.election("scheduler");
    /// let leading = election.lead("worker-7", |term| async move {
    ///     println!("leading in term {term}");
    ///     tokio::time::sleep(std::time::Duration::from_secs(10)).await; // one round of leader work
    ///     Ok(()) // resign; campaign again
    /// });
    /// let shutdown = tokio::time::sleep(std::time::Duration::from_secs(3600)); // your shutdown signal
    /// tokio::select! {
    ///     result = leading => result?,
    ///     _ = shutdown => {} // dropping `leading` resigns
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while campaigning, as [`campaign`](Self::campaign);
    /// dropped while leading, the work future is dropped and leadership is
    /// resigned in the background, as when a [`Leadership`] is dropped.
    pub async fn lead<F, Fut>(&self, value: impl Into<String>, mut take_leadership: F) -> Result<()>
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let value = check_value(value.into())?;
        loop {
            let leadership = match self.campaign(value.clone()).await {
                Ok(leadership) => leadership,
                Err(e) if e.is_transient() => {
                    tracing::warn!(election = %self.name(), error = %e, "campaign failed; trying again in 1s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let outcome = tokio::select! {
                // Loss first: work that would go on past it is not polled again.
                biased;
                () = leadership.lost() => None,
                done = take_leadership(leadership.term()) => Some(done),
            };
            match outcome {
                None => tracing::warn!(election = %self.name(), "leadership lost; campaigning again"),
                Some(Ok(())) => {
                    // Lost meanwhile is no error here: the next campaign starts anyway.
                    let _ = leadership.resign().await;
                }
                Some(Err(e)) => {
                    let _ = leadership.resign().await;
                    return Err(e);
                }
            }
        }
    }

    /// The current leader, if any.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let status = self.mutex.core().status(self.name()).await?;
        Ok(status.holder.map(|h| Leader { value: h.label, term: h.fence }))
    }

    /// A stream of leaders: each new term once, in increasing order of term;
    /// a store error ends nothing and is yielded as an item.
    ///
    /// Where the store has a watch ([`Backend::watch_holders`]) the stream
    /// is fed by it, and a term is seen even if it began and ended between
    /// two reads of the leader:
    ///
    /// - **etcd**: one watch on the election's key range, from the revision
    ///   of the first read: every term is seen, however short. A watch
    ///   whose stream broke resumes from the last revision it saw and
    ///   misses nothing; if that revision was compacted meanwhile, an error
    ///   item says terms may have been missed, and the stream goes on from
    ///   a fresh read (the leader of that moment is seen).
    /// - **ZooKeeper**: a persistent recursive watch on the election's
    ///   node. Every term is seen while the session stays connected,
    ///   except that a term whose node was deleted before the observer's
    ///   read of it came back (shorter than one round trip from the event)
    ///   is an error item (its term and value are gone with the node), not
    ///   a leader. Across a disconnection ZooKeeper may drop the watch's
    ///   events: the observer reads the queue again, and if the leader it
    ///   knew is gone, an error item says terms may have been missed before
    ///   the current leader is yielded.
    /// - **Other stores** (SQLite, Redis, PostgreSQL, MySQL, the
    ///   composites) have no watch that carries grants: the leader is read
    ///   every [`observe_every`](Self::observe_every), and a term that began
    ///   and ended between two reads is not seen (terms are fences, which
    ///   are not consecutive, so the gap cannot be told either).
    ///
    /// A watch-fed stream that is not polled keeps the watch's events
    /// until it is (ZooKeeper's client buffers them without bound): poll
    /// it, or drop it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the stream stops the reads and the watch.
    pub fn observe(&self) -> impl Stream<Item = Result<Leader>> + Send + 'static {
        let observer = Observer { election: self.clone(), last: 0, source: Source::Start, pause: false };
        futures::stream::unfold(observer, |mut observer| async move {
            let item = observer.next().await;
            Some((item, observer))
        })
    }
}

/// Where an observer's leaders come from.
enum Source {
    /// Not decided yet (or the watch ended): ask the store for a watch.
    Start,
    /// The store's watch.
    Watch(HolderWatch),
    /// No watch on this store: read the leader every `poll`.
    Poll,
}

/// The state of an [`Election::observe`] stream.
struct Observer {
    election: Election,
    /// The last term yielded: a leader is yielded only above it.
    last: u64,
    source: Source,
    /// Wait one `poll` before the next store call (after a read, or after
    /// an error, so that a store that keeps failing is not hammered).
    pause: bool,
}

impl Observer {
    async fn next(&mut self) -> Result<Leader> {
        loop {
            if std::mem::take(&mut self.pause) {
                tokio::time::sleep(self.election.poll).await;
            }
            match &mut self.source {
                Source::Start => {
                    let backend = self.election.mutex.core().backend.clone();
                    let key = LockKey::new(self.election.name())?;
                    match backend.watch_holders(&key).await {
                        Ok(Some(watch)) => self.source = Source::Watch(watch),
                        Ok(None) => self.source = Source::Poll,
                        Err(e) => {
                            self.pause = true;
                            return Err(e);
                        }
                    }
                }
                Source::Watch(watch) => match watch.next().await {
                    Some(Ok(holder)) if holder.fence > self.last => {
                        self.last = holder.fence;
                        return Ok(Leader { value: holder.label, term: holder.fence });
                    }
                    Some(Ok(_)) => {}
                    // The watch goes on after an error (it restarts itself).
                    Some(Err(e)) => return Err(e),
                    None => {
                        self.source = Source::Start;
                        self.pause = true;
                    }
                },
                Source::Poll => {
                    self.pause = true;
                    match self.election.leader().await {
                        Ok(Some(leader)) if leader.term > self.last => {
                            self.last = leader.term;
                            return Ok(leader);
                        }
                        Ok(_) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }
}

fn check_value(value: String) -> Result<String> {
    crate::vocabulary::key::check_label(&value, "value")?;
    Ok(value)
}

/// This candidate's leadership: a held grant of the election's key.
/// Dropping it resigns (in the background), as a guard releases.
#[derive(Debug)]
#[must_use = "leadership ends when this is dropped"]
pub struct Leadership {
    guard: MutexGuard,
    value: String,
}

impl Leadership {
    /// The term: the grant's fence, strictly above every earlier leader's.
    /// Hand it to whatever the leader writes to, as a fence.
    pub fn term(&self) -> u64 {
        self.guard.fence()
    }

    /// The value this leader published.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Whether leadership is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Resolves when leadership is lost (see [`Guard::lost`](crate::Guard::lost)):
    /// before the store can elect anyone else.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only observes.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// Publishes a new value without giving up leadership.
    /// [`Error::Lost`] if leadership was lost; [`Error::Unsupported`] on a
    /// store that cannot change a held grant's label.
    ///
    /// # Cancel safety
    ///
    /// One store call: dropped, the value is either published or not (this
    /// handle's [`value`](Self::value) changes only when it returns).
    pub async fn proclaim(&mut self, value: impl Into<String>) -> Result<()> {
        let value = check_value(value.into())?;
        let key = LockKey::new(self.guard.key())?;
        let backend: &dyn Backend = self.guard.backend();
        if !backend.relabel(&key, self.guard.token(), &value).await? || self.guard.is_lost() {
            return Err(Error::Lost { key: key.to_string() });
        }
        self.value = value;
        Ok(())
    }

    /// Gives up leadership (releases the grant).
    ///
    /// # Cancel safety
    ///
    /// As for [`Guard::release`](crate::Guard::release).
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}
