//! The one connection of an SQLite store and the thread it runs on.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

use rusqlite::Connection;

use super::STORE;
use super::error::map_err;
use crate::vocabulary::error::{Error, Result};

/// A call for the connection; it sends its own answer.
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The connection's own thread, running calls one at a time: renewals first,
/// then every other call in the order it came (FIFO), so that a renewal
/// waits for at most the one call that holds the connection, never behind a
/// queue of acquisitions, and load on the client cannot delay it into lost
/// leases.
///
/// A thread rather than the blocking pool behind a lock: under load it runs
/// queued calls back to back, where a call on the pool woke a task to take
/// the lock and then a pool thread to run (two thread hand-offs per call,
/// one after the other; the uncontended cycle rate was half the raw floor's).
#[derive(Debug)]
pub(super) struct ConnThread {
    /// Shared with the thread, which ends once this handle is dropped.
    pub(super) shared: Arc<Shared>,
}

#[derive(Debug, Default)]
pub(super) struct Shared {
    queues: Mutex<Queues>,
    ready: Condvar,
}

#[derive(Default)]
struct Queues {
    renewals: VecDeque<Job>,
    calls: VecDeque<Job>,
    /// Set when the last handle of the store is dropped: the thread runs
    /// what is queued, closes the connection and ends.
    closed: bool,
}

impl std::fmt::Debug for Queues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queues")
            .field("renewals", &self.renewals.len())
            .field("calls", &self.calls.len())
            .field("closed", &self.closed)
            .finish()
    }
}

impl Shared {
    /// The next call to run, or `None` once the store is dropped and the
    /// queues are empty.
    fn next(&self) -> Option<Job> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(job) = queues.renewals.pop_front().or_else(|| queues.calls.pop_front()) {
                return Some(job);
            }
            if queues.closed {
                return None;
            }
            queues = self.ready.wait(queues).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl ConnThread {
    pub(super) fn start(mut conn: Connection) -> std::io::Result<Arc<Self>> {
        let shared = Arc::new(Shared::default());
        let queues = shared.clone();
        std::thread::Builder::new().name("holdfast-sqlite".into()).spawn(move || {
            while let Some(job) = queues.next() {
                // A call that panics loses its answer (its caller gets an
                // error), not the connection of every later call.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut conn)));
            }
        })?;
        Ok(Arc::new(ConnThread { shared }))
    }

    /// Queues `f` and waits for its answer. The call runs whether or not this
    /// future is still there: a dropped call's cleanup (the release of this
    /// very attempt) queues behind it and never reaches the connection
    /// before it has committed.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        renewal: bool,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let _ = tx.send(f(conn).map_err(map_err));
        });
        {
            let mut queues = self.shared.queues.lock().unwrap_or_else(|p| p.into_inner());
            if renewal { queues.renewals.push_back(job) } else { queues.calls.push_back(job) }
        }
        self.shared.ready.notify_one();
        rx.await.unwrap_or_else(|_| Err(Error::backend(STORE, false, "the SQLite call panicked")))
    }
}

impl Drop for ConnThread {
    fn drop(&mut self) {
        self.shared.queues.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
        self.shared.ready.notify_one();
    }
}
