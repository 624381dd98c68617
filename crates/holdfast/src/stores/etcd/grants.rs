//! What this client wrote, by lock and token: every attempt's key, the
//! session it lives on, its watch, and whether it was granted. Release and
//! renew answer from here and from the store.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::Equivalent;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::ops::Conn;
use super::session::Session;
use super::watch::{KeyWatch, WatchId};
use crate::backend::RenewRequest;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::{LockKey, OwnerToken};

/// One attempt's key in etcd.
pub(super) struct Entry {
    pub(super) own: Vec<u8>,
    pub(super) session: Arc<Session>,
    /// Cancelled when the key is gone: its session lost (this is a child of
    /// the session's token) or the key deleted (by the key watch).
    pub(super) gone: CancellationToken,
    pub(super) watch: Option<WatchId>,
    pub(super) granted: bool,
    /// Whether the grant was alive when its release was first asked for:
    /// set on the first release call, so that a later call (the client's
    /// retry, after a reply was lost) can tell its own deletion from a loss.
    live_at_release: Option<bool>,
}

impl Entry {
    pub(super) fn new(own: Vec<u8>, session: Arc<Session>) -> Self {
        let gone = session.lost.child_token();
        Entry { own, session, gone, watch: None, granted: false, live_at_release: None }
    }
}

type Id = (String, u128);

/// Leases looked up per hold of the attempts' lock in a renewal: the
/// client's acquires and releases, which need the lock too, never wait for
/// a whole tick of lookups (100,000 at a time at scale), and the renewal
/// yields to the runtime between chunks.
const LOOKUP_CHUNK: usize = 1024;

/// An [`Id`] to look up without building one: renewal looks up every held
/// lease each tick. Hashes as the tuple does (fields in order, `str` as
/// `String`).
#[derive(Hash)]
struct IdRef<'a>(&'a str, u128);

impl Equivalent<Id> for IdRef<'_> {
    fn equivalent(&self, id: &Id) -> bool {
        self.0 == id.0 && self.1 == id.1
    }
}

fn id(key: &LockKey, token: OwnerToken) -> IdRef<'_> {
    IdRef(key.as_str(), token.as_u128())
}

fn owned_id(key: &LockKey, token: OwnerToken) -> Id {
    (key.as_str().to_owned(), token.as_u128())
}

#[derive(Default)]
pub(super) struct Grants {
    entries: Mutex<hashbrown::HashMap<Id, Entry>>,
    /// Queue puts still in flight, by token: a release waits for them, so a
    /// put that lands after an aborted acquire cannot leave a key behind.
    inflight: Mutex<HashMap<u128, watch::Receiver<bool>>>,
    /// Tokens whose first write may have a copy the server applies later:
    /// it was sent more than once (a try timed out and was sent again) or
    /// never answered. etcd serves the streams of one connection side by
    /// side, so a copy whose stream the client gave up on can be applied
    /// after the attempt's release deleted its key, writing it again on the
    /// live session (conformance F6 on etcd, once under a full test run):
    /// such an attempt's release moves the session's epoch in the same
    /// transaction as its delete, and the copy then writes nothing.
    uncertain: Mutex<HashSet<u128>>,
    /// The tokens whose attempts were forgotten last, newest at the back: a
    /// key this client deleted after a queue read was taken is still in that
    /// read, and must not read as another client's ([`Grants::is_own`]).
    removed: Mutex<VecDeque<u128>>,
}

/// How many forgotten tokens [`Grants::is_own`] remembers.
const REMEMBERED: usize = 256;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Grants {
    /// Records an attempt before its first request is sent, replacing an
    /// earlier attempt of the same token (whose watch goes).
    pub(super) fn track(&self, watcher: &KeyWatch, key: &LockKey, token: OwnerToken, entry: Entry) {
        if let Some(old) = lock(&self.entries).insert(owned_id(key, token), entry) {
            if let Some(w) = old.watch {
                watcher.unwatch(w);
            }
        }
    }

    /// Starts watching the attempt's key from revision `from`.
    pub(super) fn watch_from(&self, watcher: &KeyWatch, key: &LockKey, token: OwnerToken, from: i64) {
        let mut entries = lock(&self.entries);
        if let Some(e) = entries.get_mut(&id(key, token)) {
            if let Some(old) = e.watch.replace(watcher.watch(e.own.clone(), from, e.gone.clone())) {
                watcher.unwatch(old);
            }
        }
    }

    /// Marks the attempt granted; `None` if it is not tracked any more.
    pub(super) fn grant(&self, key: &LockKey, token: OwnerToken) -> Option<()> {
        lock(&self.entries).get_mut(&id(key, token)).map(|e| e.granted = true)
    }

    /// The key of `token`'s live grant of `key`, if it has one.
    pub(super) fn granted_key(&self, key: &LockKey, token: OwnerToken) -> Option<Vec<u8>> {
        let entries = lock(&self.entries);
        entries.get(&id(key, token)).filter(|e| e.granted && !e.gone.is_cancelled()).map(|e| e.own.clone())
    }

    /// Forgets an attempt that wrote nothing, as its answer said. If a copy
    /// of its write may still be applied later, it is released instead (the
    /// epoch moved with the delete), and an error is the release's.
    pub(super) async fn forget(
        self: &Arc<Self>,
        conn: &Conn,
        watcher: &KeyWatch,
        key: &LockKey,
        token: OwnerToken,
    ) -> Result<()> {
        if self.may_land_late(token) {
            return self.release(conn, watcher, key, token).await.map(|_| ());
        }
        if let Some(entry) = lock(&self.entries).remove(&id(key, token)) {
            if let Some(w) = entry.watch {
                watcher.unwatch(w);
            }
        }
        self.removed(token);
        Ok(())
    }

    /// Remembers a token whose attempt was forgotten.
    fn removed(&self, token: OwnerToken) {
        let mut removed = lock(&self.removed);
        if removed.len() == REMEMBERED {
            removed.pop_front();
        }
        removed.push_back(token.as_u128());
    }

    /// Whether `token`'s queue key of `key` is this client's: an attempt it
    /// tracks, or one of the last it forgot.
    pub(super) fn is_own(&self, key: &LockKey, token: u128) -> bool {
        lock(&self.entries).contains_key(&IdRef(key.as_str(), token)) || lock(&self.removed).contains(&token)
    }

    /// Whether `token`'s first write may have a copy etcd applies later:
    /// sent more than once, or not answered (still in flight).
    fn may_land_late(&self, token: OwnerToken) -> bool {
        lock(&self.uncertain).contains(&token.as_u128()) || lock(&self.inflight).contains_key(&token.as_u128())
    }

    /// Registers the first write of `token` as in flight until `done` says otherwise.
    pub(super) fn in_flight(&self, token: OwnerToken, done: watch::Receiver<bool>) {
        lock(&self.inflight).insert(token.as_u128(), done);
    }

    /// The first write of `token` is done; `certain` if it was sent once
    /// and answered (no copy of it can be applied later).
    pub(super) fn landed(&self, token: OwnerToken, certain: bool) {
        // An attempt released while its write was in flight was released as
        // uncertain already: nothing to remember for it.
        if !certain && lock(&self.entries).keys().any(|(_, t)| *t == token.as_u128()) {
            lock(&self.uncertain).insert(token.as_u128());
        }
        lock(&self.inflight).remove(&token.as_u128());
    }

    /// Deletes the key of `token`: a grant, a queue entry, or nothing. The
    /// attempt is forgotten only once etcd confirmed the delete, or once its
    /// session is lost (the key went, or goes, with the lease); until then
    /// the error is returned and the client retries. An attempt whose first
    /// write may still be applied later moves its session's epoch in the
    /// same transaction, so that no copy of that write applies after it.
    pub(super) async fn release(
        self: &Arc<Self>,
        conn: &Conn,
        watcher: &KeyWatch,
        key: &LockKey,
        token: OwnerToken,
    ) -> Result<bool> {
        let pending = lock(&self.inflight).get(&token.as_u128()).cloned();
        if let Some(mut done) = pending {
            // Let an aborted attempt's put land (or fail) before deleting.
            let _ = tokio::time::timeout(conn.timeout, done.wait_for(|d| *d)).await;
        }
        let id = id(key, token);
        let tracked = {
            let mut entries = lock(&self.entries);
            entries.get_mut(&id).map(|e| {
                // Our own delete must not read as a loss.
                if let Some(w) = e.watch.take() {
                    watcher.unwatch(w);
                }
                let first_call = e.live_at_release.is_none();
                let live = *e.live_at_release.get_or_insert(e.granted && !e.gone.is_cancelled());
                (e.own.clone(), e.session.clone(), live, first_call)
            })
        };
        // Every key this client writes is tracked from before its request
        // is sent until its deletion is confirmed (or its session is lost):
        // an untracked token (forged, released already, or an attempt that
        // wrote nothing) has no key here, and there is nothing to send.
        let Some((own, session, live, first_call)) = tracked else { return Ok(false) };
        let late = self.may_land_late(token);
        let deleted = if late {
            match conn.delete_in_new_epoch(&own, &session.epoch_key, session.lease).await {
                Ok(Some((deleted, resent, at))) => {
                    session.epoch_seen(at);
                    Ok((deleted, resent))
                }
                Ok(None) => {
                    // The lease is gone, and the key with it; a copy of the
                    // write, on that lease, can write nothing either.
                    tracing::warn!(lease = session.lease, "etcd refused the session lease: session lost");
                    session.lost.cancel();
                    Err(super::session::session_lost())
                }
                Err(e) => Err(e),
            }
        } else {
            conn.delete(&own).await
        };
        match deleted {
            Ok((deleted, resent)) => {
                lock(&self.entries).remove(&id);
                self.removed(token);
                if late {
                    lock(&self.uncertain).remove(&token.as_u128());
                }
                // A resend (within this call, or the client's retry of a call
                // that failed) finds nothing when an earlier try had deleted
                // the key and its reply was lost: a grant that was live, on a
                // session still alive, was deleted by us.
                let ours_earlier = (resent || !first_call) && !session.lost.is_cancelled();
                Ok(live && (deleted > 0 || ours_earlier))
            }
            Err(_) if session.lost.is_cancelled() => {
                lock(&self.entries).remove(&id);
                self.removed(token);
                lock(&self.uncertain).remove(&token.as_u128());
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Renews `leases`: one keep-alive per session lease they live on, then
    /// per lease whether its grant is still held (tracked as granted, its
    /// session alive, its key not deleted).
    pub(super) async fn renew(&self, leases: &[RenewRequest]) -> Result<Vec<bool>> {
        let mut sessions: Vec<Arc<Session>> = Vec::new();
        for chunk in leases.chunks(LOOKUP_CHUNK) {
            {
                let entries = lock(&self.entries);
                for l in chunk {
                    if let Some(e) = entries.get(&id(&l.key, l.token)).filter(|e| e.granted) {
                        if !sessions.iter().any(|s| s.lease == e.session.lease) {
                            sessions.push(e.session.clone());
                        }
                    }
                }
            }
            tokio::task::yield_now().await;
        }
        let confirmed = futures::future::join_all(sessions.iter().map(|s| s.confirm())).await;
        for (s, r) in sessions.iter().zip(&confirmed) {
            if let Err(e) = r {
                if !s.lost.is_cancelled() {
                    return Err(Error::backend(super::STORE, true, e.to_string()));
                }
            }
        }
        let mut held = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(LOOKUP_CHUNK) {
            {
                let entries = lock(&self.entries);
                held.extend(
                    chunk.iter().map(|l| {
                        entries.get(&id(&l.key, l.token)).is_some_and(|e| e.granted && !e.gone.is_cancelled())
                    }),
                );
            }
            tokio::task::yield_now().await;
        }
        Ok(held)
    }
}
