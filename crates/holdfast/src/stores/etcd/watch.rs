//! The key watch: one etcd watch stream per client over which every key this
//! client wrote (a waiter's or a holder's) is watched for its deletion, so
//! that a key deleted behind the client's back (its session lease revoked or
//! expired, or the key deleted by hand) cancels that attempt's token in
//! milliseconds, rather than at the next keep-alive or never.
//!
//! Each key is one watcher on the stream, with an id of ours, starting at the
//! revision after the one that wrote it (so no deletion falls in a gap) and
//! filtering out puts; a client holding many keys keeps one stream. When the
//! stream breaks, it is reopened and every watcher resumes from the revision
//! after the last one it saw; a watcher whose start was compacted away reads
//! its key once instead.
//!
//! A watcher goes on the stream [`DEFER`] after it was asked for, not at
//! once: most grants are released sooner, and a watcher that never reaches
//! the stream costs neither its creation nor its cancellation (two stream
//! messages and two answers, which were most of what an uncontended cycle
//! cost beyond its two writes). Nothing is missed by the wait: the watcher
//! starts at the revision after the one that wrote its key, so a deletion in
//! the meantime is replayed by the server once it is created. Only how soon
//! `lost()` hears of it moves: by [`DEFER`], plus up to the 100 ms etcd
//! takes to replay past events to a new watcher (its catch-up loop).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponse, WatchResponseStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::ops::Conn;

/// The id of one watched key, on this client's watch stream.
pub(super) type WatchId = i64;

/// How long a key is held before its watcher goes on the stream: how much
/// later, at most, `lost()` hears of a deletion behind the client's back
/// (besides etcd's catch-up of a watcher that starts in the past).
pub(super) const DEFER: Duration = Duration::from_millis(50);

enum Command {
    Watch {
        id: WatchId,
        key: Vec<u8>,
        from: i64,
        gone: CancellationToken,
    },
    Unwatch {
        id: WatchId,
    },
    /// The outcome of reading a key whose watcher was cancelled by the
    /// server: whether it exists, at which revision.
    Checked {
        id: WatchId,
        exists: bool,
        revision: i64,
    },
}

/// The handle of the watch task; the task ends when `shutdown` is cancelled.
pub(super) struct KeyWatch {
    tx: mpsc::UnboundedSender<Command>,
    next_id: AtomicI64,
}

impl KeyWatch {
    pub(super) fn start(conn: Conn, shutdown: CancellationToken) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = Task { conn, tx: tx.clone(), rx, watched: HashMap::new(), due: VecDeque::new(), stream: None };
        tokio::spawn(task.run(shutdown));
        KeyWatch { tx, next_id: AtomicI64::new(1) }
    }

    /// Cancels `gone` when `key` is deleted at `from` or any later revision.
    pub(super) fn watch(&self, key: Vec<u8>, from: i64, gone: CancellationToken) -> WatchId {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let _ = self.tx.send(Command::Watch { id, key, from, gone });
        id
    }

    /// Stops watching: a deletion from now on cancels nothing.
    pub(super) fn unwatch(&self, id: WatchId) {
        let _ = self.tx.send(Command::Unwatch { id });
    }
}

struct Watched {
    key: Vec<u8>,
    /// The revision to resume from if the stream has to be reopened.
    from: i64,
    gone: CancellationToken,
    /// The server cancelled the watcher and its key is being read: not on
    /// the stream until the read answers.
    checking: bool,
    /// Not on the stream yet: its [`DEFER`] has not passed.
    deferred: bool,
}

impl Watched {
    /// Whether the watcher is (or, once a stream opens, will be) on the stream.
    fn on_stream(&self) -> bool {
        !self.checking && !self.deferred
    }
}

/// A request for the stream, sent by a task of its own so that the watch
/// task never blocks on a full request channel while responses wait.
enum Out {
    Watch(WatchId, Vec<u8>, i64),
    Cancel(WatchId),
}

struct Stream {
    out: mpsc::UnboundedSender<Out>,
    responses: WatchResponseStream,
}

struct Task {
    conn: Conn,
    tx: mpsc::UnboundedSender<Command>,
    rx: mpsc::UnboundedReceiver<Command>,
    watched: HashMap<WatchId, Watched>,
    /// Deferred watchers by when they go on the stream (in order: every
    /// watcher waits the same [`DEFER`]); an id unwatched meanwhile is
    /// skipped when its turn comes.
    due: VecDeque<(tokio::time::Instant, WatchId)>,
    stream: Option<Stream>,
}

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const LAST_BACKOFF: Duration = Duration::from_secs(1);

/// A watcher of one key from `from`, deletions only; with progress
/// notifications, so that `from` advances while nothing happens and a
/// reopened stream has little history to catch up on.
fn options(id: WatchId, from: i64) -> WatchOptions {
    WatchOptions::new()
        .with_watch_id(id)
        .with_start_revision(from)
        .with_filters([WatchFilterType::NoPut])
        .with_progress_notify()
}

enum Event {
    Command(Option<Command>),
    Response(Result<Option<WatchResponse>, etcd_client::Error>),
    Reopen,
    Due,
}

async fn forward(mut requests: WatchRequestSender, mut out: mpsc::UnboundedReceiver<Out>) {
    while let Some(request) = out.recv().await {
        let sent = match request {
            Out::Watch(id, key, from) => requests.watch(key, Some(options(id, from))).await,
            Out::Cancel(id) => requests.cancel(id).await,
        };
        if sent.is_err() {
            return;
        }
    }
}

impl Task {
    async fn run(mut self, shutdown: CancellationToken) {
        // When to (re)open the stream: at once for the first watcher, after a
        // backoff once a stream failed.
        let mut reopen_at: Option<tokio::time::Instant> = None;
        let mut backoff = FIRST_BACKOFF;
        loop {
            if self.stream.is_none() && reopen_at.is_none() && self.watched.values().any(Watched::on_stream) {
                reopen_at = Some(tokio::time::Instant::now());
            }
            let event = {
                let (rx, stream) = (&mut self.rx, &mut self.stream);
                let reopen = async {
                    match reopen_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                let response = async {
                    match stream.as_mut() {
                        Some(s) => s.responses.message().await,
                        None => std::future::pending().await,
                    }
                };
                let due = async {
                    match self.due.front() {
                        Some((at, _)) => tokio::time::sleep_until(*at).await,
                        None => std::future::pending().await,
                    }
                };
                // Commands first: an unwatch queued before a release's delete
                // was sent is applied before that delete's event is read.
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return,
                    command = rx.recv() => Event::Command(command),
                    response = response => Event::Response(response),
                    _ = reopen => Event::Reopen,
                    _ = due => Event::Due,
                }
            };
            let failed = match event {
                Event::Command(None) => return,
                Event::Command(Some(command)) => {
                    let had_stream = self.stream.is_some();
                    self.command(command);
                    had_stream && self.stream.is_none()
                }
                Event::Response(Ok(Some(resp))) => {
                    backoff = FIRST_BACKOFF;
                    self.response(resp);
                    false
                }
                Event::Response(other) => {
                    tracing::debug!(?other, "etcd key watch stream ended; reopening it");
                    self.stream = None;
                    true
                }
                Event::Reopen => {
                    reopen_at = None;
                    self.open().await;
                    self.stream.is_none()
                }
                Event::Due => {
                    let had_stream = self.stream.is_some();
                    self.start_due(tokio::time::Instant::now());
                    had_stream && self.stream.is_none()
                }
            };
            if failed && self.stream.is_none() && self.watched.values().any(Watched::on_stream) {
                reopen_at = Some(tokio::time::Instant::now() + backoff);
                backoff = (backoff * 2).min(LAST_BACKOFF);
            }
        }
    }

    fn send(&mut self, out: Out) {
        if let Some(s) = &self.stream {
            if s.out.send(out).is_err() {
                self.stream = None;
            }
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Watch { id, key, from, gone } => {
                if gone.is_cancelled() {
                    return;
                }
                self.watched.insert(id, Watched { key, from, gone, checking: false, deferred: true });
                self.due.push_back((tokio::time::Instant::now() + DEFER, id));
            }
            Command::Unwatch { id } => {
                // A deferred watcher never reached the server: nothing to cancel.
                if self.watched.remove(&id).is_some_and(|w| w.on_stream()) {
                    self.send(Out::Cancel(id));
                }
            }
            Command::Checked { id, exists, revision } => {
                let Some(w) = self.watched.get_mut(&id) else { return };
                if !exists {
                    w.gone.cancel();
                    self.watched.remove(&id);
                    return;
                }
                w.checking = false;
                w.from = w.from.max(revision + 1);
                let (key, from) = (w.key.clone(), w.from);
                self.send(Out::Watch(id, key, from));
            }
        }
    }

    /// Puts on the stream every deferred watcher whose [`DEFER`] has passed
    /// by `now` and that is still watched. Without a stream, the reopen
    /// timer opens one with these keys on it.
    fn start_due(&mut self, now: tokio::time::Instant) {
        while let Some(&(at, id)) = self.due.front() {
            if at > now {
                break;
            }
            self.due.pop_front();
            let Some(w) = self.watched.get_mut(&id) else { continue };
            w.deferred = false;
            if w.checking {
                continue;
            }
            let (key, from) = (w.key.clone(), w.from);
            self.send(Out::Watch(id, key, from));
        }
    }

    /// Opens a stream with every watched key on it, each from where it was.
    async fn open(&mut self) {
        self.watched.retain(|_, w| !w.gone.is_cancelled());
        let mut all = self.watched.iter().filter(|(_, w)| w.on_stream()).map(|(id, w)| (*id, w.key.clone(), w.from));
        let Some((id, key, from)) = all.next() else { return };
        let rest: Vec<_> = all.collect();
        let mut client = self.conn.client.clone();
        let opened = tokio::time::timeout(self.conn.timeout, client.watch(key, Some(options(id, from)))).await;
        let (requests, responses) = match opened {
            Ok(Ok(stream)) => stream.split(),
            other => {
                tracing::debug!(?other, "etcd key watch stream failed to open; retrying");
                return;
            }
        };
        let (out, out_rx) = mpsc::unbounded_channel();
        tokio::spawn(forward(requests, out_rx));
        for (id, key, from) in rest {
            let _ = out.send(Out::Watch(id, key, from));
        }
        self.stream = Some(Stream { out, responses });
    }

    fn response(&mut self, resp: WatchResponse) {
        let id = resp.watch_id();
        let revision = resp.header().map_or(0, |h| h.revision());
        let Some(w) = self.watched.get_mut(&id) else { return };
        if resp.events().iter().any(|e| e.event_type() == EventType::Delete) {
            w.gone.cancel();
            self.watched.remove(&id);
            self.send(Out::Cancel(id));
            return;
        }
        if resp.canceled() {
            // Its start revision was compacted away (or the server dropped
            // it): read the key once, then watch again from that read.
            tracing::debug!(id, reason = resp.cancel_reason(), "etcd key watcher cancelled; reading its key");
            w.checking = true;
            let (conn, tx, key) = (self.conn.clone(), self.tx.clone(), w.key.clone());
            tokio::spawn(async move {
                loop {
                    match conn.exists(&key).await {
                        Ok((exists, revision)) => {
                            let _ = tx.send(Command::Checked { id, exists, revision });
                            return;
                        }
                        Err(_) if tx.is_closed() => return,
                        Err(_) => tokio::time::sleep(LAST_BACKOFF).await,
                    }
                }
            });
            return;
        }
        // A creation answers with the current revision before a watcher that
        // starts in the past has caught up; any later answer (a progress
        // notification) vouches for every revision up to its own.
        if !resp.created() {
            w.from = w.from.max(revision + 1);
        }
    }
}
