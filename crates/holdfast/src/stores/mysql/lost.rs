//! Lost connections, ended on the server before the client sends anything
//! else.
//!
//! A mutex grant is one autocommit statement. When an operation gives up
//! on its connection (it timed out, or the driver failed on I/O rather
//! than with a server's answer), that statement may still be in the
//! network or waiting in the server for a row lock, and the server's
//! thread for the connection lives on: applied later, it grants the key
//! under the client's live session, after the cleanup's release of the
//! token (on another pooled connection) found nothing. So the client
//! records the connection's id (the server's processlist id), and before
//! its next lock statement, on any pooled connection, it ends every
//! recorded connection on the server (`KILL CONNECTION`) and waits until
//! the server no longer lists it. Once the thread is gone, a statement
//! still in the network can never be read (its socket is closed), one
//! waiting for a lock was rolled back, and one that was committing
//! finished first: the lost statement took effect before every later
//! statement of the client (a later release finds and deletes its grant)
//! or it never will.
//!
//! Renewal takes its connections from its own pool and never fences: a
//! renewal grants nothing, and held behind a fence it could lose leases.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool};

use super::STORE;
use crate::vocabulary::error::Error;

/// How often the fence asks the server whether a killed connection is gone.
const GONE_POLL: Duration = Duration::from_millis(10);

/// MySQL/MariaDB's "Unknown thread id": the connection is gone already.
const UNKNOWN_THREAD: u16 = 1094;

/// MySQL/MariaDB's "You are not owner of thread": KILL refused for privileges.
const NOT_OWNER: u16 = 1095;

/// Whether any of this client's processlist rows has the id.
const LISTED: &str = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?";

/// The connections of one client whose last statement's outcome it does not
/// know, until the server has ended them.
#[derive(Debug, Default)]
pub(super) struct LostConnections {
    /// How many ids are recorded: the only thing an operation reads when
    /// there are none, the common case.
    count: AtomicUsize,
    /// The recorded processlist ids. An id leaves only once the server has
    /// ended its connection, so a fence dropped half-way leaves the rest.
    ids: Mutex<Vec<u32>>,
    /// Held by the operation that ends them: one fence at a time, and the
    /// operations that come meanwhile wait for it rather than kill again.
    turn: tokio::sync::Mutex<()>,
}

impl LostConnections {
    /// The recorded ids (a poisoned lock is taken as it is: the list is
    /// only ever pushed to or removed from whole).
    fn ids(&self) -> std::sync::MutexGuard<'_, Vec<u32>> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records connections that may carry a statement of unknown outcome.
    pub(super) fn record(&self, lost: &[u32]) {
        let mut ids = self.ids();
        for id in lost {
            if !ids.contains(id) {
                ids.push(*id);
            }
        }
        self.count.store(ids.len(), Ordering::Release);
    }

    /// The recorded ids, for an error that names them.
    pub(super) fn recorded(&self) -> Vec<u32> {
        self.ids().clone()
    }

    fn forget(&self, id: u32) {
        let mut ids = self.ids();
        ids.retain(|&i| i != id);
        self.count.store(ids.len(), Ordering::Release);
    }

    /// Ends every recorded connection on the server, using `conn`, and
    /// waits until the server lists none of them. Unbounded itself: it runs
    /// within the operation's timeout (see [`Operation::conn`]).
    ///
    /// # Cancel safety
    ///
    /// An id is forgotten only after its connection is gone: a fence
    /// dropped at any point leaves the ones not yet ended recorded, and the
    /// next operation ends them.
    async fn fence(&self, conn: &mut Conn) -> mysql_async::Result<()> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let _turn = self.turn.lock().await;
        // Those the fence before this one ended are gone from the list.
        let pending = self.recorded();
        for id in pending {
            // The pool hands out only a connection whose last command was
            // answered (one dropped mid-command is closed, never pooled): one
            // recorded while idle between statements carries nothing.
            if id != conn.id() {
                end(conn, id).await?;
            }
            self.forget(id);
        }
        Ok(())
    }
}

/// Kills connection `id` and waits until the server no longer lists it.
async fn end(conn: &mut Conn, id: u32) -> mysql_async::Result<()> {
    // An integer: safe to write into the statement's text.
    match conn.query_drop(format!("KILL CONNECTION {id}")).await {
        Ok(()) => {}
        Err(mysql_async::Error::Server(e)) if e.code == UNKNOWN_THREAD => return Ok(()),
        Err(mysql_async::Error::Server(e)) if e.code == NOT_OWNER => {
            let message = format!(
                "the server refused to end connection {id} of this client, whose last statement's outcome is \
                 unknown ({}); a user may end its own connections, so check that every connection of this client \
                 logs in as the same user, or grant it CONNECTION_ADMIN (MySQL 8) or CONNECTION ADMIN (MariaDB); \
                 nothing is sent until that connection ends",
                e.message
            );
            return Err(mysql_async::Error::Other(Box::new(Error::advised(STORE, false, message))));
        }
        Err(e) => return Err(e),
    }
    loop {
        let listed: Option<u64> = conn.exec_first(LISTED, (id,)).await?;
        if listed.unwrap_or(0) == 0 {
            return Ok(());
        }
        tokio::time::sleep(GONE_POLL).await;
    }
}

/// One store operation's access to the pool (see [`super::MysqlBackend::timed`]):
/// every connection it takes is fenced first and noted, so that the
/// operation's end can record it as lost.
#[derive(Debug)]
pub(super) struct Operation<'a> {
    pool: &'a Pool,
    lost: &'a LostConnections,
    /// The processlist ids of the connections this operation took.
    taken: Mutex<Vec<u32>>,
    /// Set while this operation waits for the fence.
    fencing: AtomicBool,
}

impl<'a> Operation<'a> {
    pub(super) fn new(pool: &'a Pool, lost: &'a LostConnections) -> Self {
        Operation { pool, lost, taken: Mutex::default(), fencing: AtomicBool::new(false) }
    }

    /// A pooled connection, once every lost connection of the client is
    /// ended (on this one: a release takes any pooled connection, so ending
    /// only a lost connection's replacement would not do). Fenced after it
    /// is taken, so that a connection recorded while this operation waited
    /// for the pool is ended too.
    pub(super) async fn conn(&self) -> mysql_async::Result<Conn> {
        let mut conn = self.pool.get_conn().await?;
        self.fencing.store(true, Ordering::Relaxed);
        self.lost.fence(&mut conn).await?;
        self.fencing.store(false, Ordering::Relaxed);
        // Noted after the fence: a KILL or a read lost in flight leaves
        // nothing to end.
        self.taken.lock().unwrap_or_else(|p| p.into_inner()).push(conn.id());
        Ok(conn)
    }

    /// Whether the operation was waiting for the fence.
    pub(super) fn was_fencing(&self) -> bool {
        self.fencing.load(Ordering::Relaxed)
    }

    /// Records the connections this operation took as lost.
    pub(super) fn lose_taken(&self) {
        self.lost.record(&self.taken.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// Whether an operation's failure leaves the outcome of its last statement
/// unknown: the driver failed on I/O or on the protocol, not with the
/// server's answer (after which the statement is known to have failed).
pub(super) fn outcome_unknown(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Io(_) | mysql_async::Error::Driver(_))
}

/// The crate error a fence failed with, carried through the driver's error
/// type (see [`end`]).
pub(super) fn fence_error(e: mysql_async::Error) -> Result<Error, mysql_async::Error> {
    match e {
        mysql_async::Error::Other(other) => match other.downcast::<Error>() {
            Ok(own) => Ok(*own),
            Err(other) => Err(mysql_async::Error::Other(other)),
        },
        e => Err(e),
    }
}
