//! The statement connections: a few pipelined connections, one per key hash.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio_postgres::Client as PgClient;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::config::Prepared;
use super::error::{map_err, timed_out};
use super::lost::{self, Backend};
use super::{PostgresBackend, STORE};
use crate::vocabulary::error::{Error, Result};

/// A few statement connections. tokio-postgres pipelines concurrent
/// statements on one connection and the server runs them in order; as every
/// statement is a short autocommit one, no caller holds a connection while
/// it waits for a key.
///
/// Statements about one key always use the same connection (chosen by a hash
/// of the key), so the release that cleans up after a dropped acquire runs
/// after that acquire on the server, never before it (on two connections the
/// release could overtake the acquire and leave an orphan grant). A
/// connection that leaves its slot broken has its backend ended before the
/// slot's next connection runs anything (see `lost`), so the order holds
/// across connections too.
pub(super) struct Pool {
    /// Where and how to connect.
    pub(super) pg: tokio_postgres::Config,
    /// The TLS connector (also used by the listener).
    pub(super) tls: MakeRustlsConnect,
    /// One lazily (re)opened connection per slot.
    pub(super) slots: Vec<SlotCell>,
    /// Renewal's own connection: renewals never queue behind the acquires
    /// pipelined on the slots, so a client acquiring at full speed still
    /// renews in time. (A renewal and a release of one key may then run in
    /// either order; a renewal after the release finds no row, and the
    /// client ignores it for a lease it released.)
    pub(super) renewal: SlotCell,
    /// The connection of shared-lease transactions (a transaction needs a
    /// connection to itself; the slots are shared by pipelined statements),
    /// and the turn to use it: held for a whole transaction.
    pub(super) txn: SlotCell,
    pub(super) txn_turn: Arc<tokio::sync::Mutex<()>>,
    /// Transactions whose caller gave up while their `COMMIT` was in flight
    /// (see [`PostgresBackend::transaction`]); a release waits for them.
    pub(super) abandoned_ends: Arc<AtomicUsize>,
    /// Round-robin position for statements about no single key.
    pub(super) next: AtomicUsize,
    /// Where named prepared statements may be used.
    pub(super) prepared: Prepared,
    /// How long a slot waits for a lost connection's backend to end (half
    /// the call's timeout: see `PostgresBackend::open_inner`).
    pub(super) lost_limit: std::time::Duration,
}

/// A slot, and the process id of the lost backend it waits for (0: none),
/// readable without the slot's lock, which the wait holds: a call that gave
/// up while queued behind it says why (see [`Pool::timed_out`]).
#[derive(Default)]
pub(super) struct SlotCell {
    slot: tokio::sync::Mutex<Slot>,
    ending: std::sync::atomic::AtomicI32,
}

/// A connection slot: its connection, or the backend of the connection it
/// lost, still to be ended before the slot's next connection is handed out
/// (never both).
#[derive(Default)]
pub(super) struct Slot {
    conn: Option<Arc<Conn>>,
    unended: Option<Backend>,
}

impl Slot {
    /// Takes the connection out of the slot; its backend is to be ended
    /// before the slot is used again.
    fn lose(&mut self) {
        if let Some(old) = self.conn.take() {
            self.unended = old.backend.clone();
        }
    }
}

/// Sets `client_connection_check_interval` where the server has it
/// (PostgreSQL 14 and later; an older server refuses the name).
const CHECK_CLIENT_CONNECTION: &str = "SELECT set_config('client_connection_check_interval', '250', false) \
     WHERE current_setting('server_version_num')::int >= 140000";

/// One statement connection and the statements prepared on it.
pub(super) struct Conn {
    /// The connection.
    pub(super) client: PgClient,
    /// Whether named prepared statements may be used on it.
    pub(super) named: bool,
    /// The statements prepared on it, indexed by [`Stmt`](super::statements::Stmt).
    pub(super) prepared: [tokio::sync::OnceCell<tokio_postgres::Statement>; super::statements::Stmt::COUNT],
    /// Left inside a transaction by a caller that gave up: not to be used again.
    pub(super) broken: std::sync::atomic::AtomicBool,
    /// Its backend, if the connection is direct (not through a pooler).
    pub(super) backend: Option<Backend>,
}

/// Errors that mean a named prepared statement is not where it was prepared
/// (with `prepared=true` behind a pooler that moved us to another server
/// connection): nothing ran.
pub(super) fn statement_lost(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| matches!(c.code(), "26000" | "42P05" | "08P01"))
}

impl Pool {
    /// The connection for statements about `key`, or any (round-robin) for `None`.
    pub(super) async fn get(&self, key: Option<&str>) -> Result<Arc<Conn>> {
        let i = match key {
            Some(k) => (fnv1a(k.as_bytes()) % self.slots.len() as u64) as usize,
            None => self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len(),
        };
        self.open_in(&self.slots[i], false).await
    }

    /// The error of a statement about `key` that gave up after `after`
    /// (see [`Self::timed_out_in`]).
    pub(super) fn timed_out(&self, what: &str, after: std::time::Duration, key: Option<&str>) -> Error {
        let cell = key.map(|k| &self.slots[(fnv1a(k.as_bytes()) % self.slots.len() as u64) as usize]);
        Self::timed_out_in(cell, what, after)
    }

    /// The error of a transaction that gave up after `after`.
    pub(super) fn txn_timed_out(&self, what: &str, after: std::time::Duration) -> Error {
        Self::timed_out_in(Some(&self.txn), what, after)
    }

    /// If the slot a call needed (when known) waits for a lost connection's
    /// backend to end, its timeout says so, with the pid.
    fn timed_out_in(cell: Option<&SlotCell>, what: &str, after: std::time::Duration) -> Error {
        match cell.map(|c| c.ending.load(Ordering::Relaxed)).filter(|&pid| pid != 0) {
            Some(pid) => Error::backend(
                STORE,
                true,
                format!(
                    "{what} timed out after {after:?} while its connection waits for the backend (pid {pid}) of a \
                     connection lost with a statement in flight to end; nothing is sent on it until that backend \
                     has ended (a statement of it could still be applied): try again"
                ),
            ),
            None => timed_out(what, after),
        }
    }

    /// The renewal connection.
    pub(super) async fn renewal(&self) -> Result<Arc<Conn>> {
        self.open_in(&self.renewal, true).await
    }

    /// Waits (up to `limit`) until no transaction whose caller gave up is
    /// still ending: what such a transaction wrote (a dropped waiting
    /// writer's reservation, say) is then committed or gone, and the
    /// release that cleans up after the caller sees it.
    pub(super) async fn after_abandoned_ends(&self, limit: std::time::Duration) {
        if self.abandoned_ends.load(Ordering::SeqCst) > 0 {
            // The ending transaction holds the turn until its reply.
            let _ = tokio::time::timeout(limit, self.txn_turn.lock()).await;
        }
    }

    /// The transaction connection (hold [`txn_turn`](Self::txn_turn) while using it).
    pub(super) async fn txn(&self) -> Result<Arc<Conn>> {
        self.open_in(&self.txn, false).await
    }

    /// The live connection of `slot`, opened if there is none; `renewal`:
    /// the renewal connection (see the plan settings below).
    ///
    /// A connection that left the slot broken may have had a statement in
    /// flight: its backend is ended first (see `lost`), except the renewal
    /// connection's (a renewal grants nothing, and renewals must not wait).
    async fn open_in(&self, cell: &SlotCell, renewal: bool) -> Result<Arc<Conn>> {
        let mut slot = cell.slot.lock().await;
        if let Some(c) = slot.conn.as_ref().filter(|c| !c.client.is_closed() && !c.broken.load(Ordering::Relaxed)) {
            return Ok(c.clone());
        }
        slot.lose();
        if let Some(lost) = slot.unended.as_ref().filter(|_| !renewal) {
            cell.ending.store(lost.pid, Ordering::Relaxed);
        }
        let conn = self.connect(renewal).await?;
        if let Some(lost) = slot.unended.as_ref().filter(|_| !renewal) {
            lost::end(&conn.client, lost, self.lost_limit).await?;
        }
        slot.unended = None;
        cell.ending.store(0, Ordering::Relaxed);
        slot.conn = Some(conn.clone());
        Ok(conn)
    }

    /// A new connection, with the settings of our sessions.
    async fn connect(&self, renewal: bool) -> Result<Arc<Conn>> {
        let (client, connection) = self.pg.connect(self.tls.clone()).await.map_err(map_err)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "postgres connection ended");
            }
        });
        let backend = lost::backend_of(&client).await.map_err(map_err)?;
        let named = match self.prepared {
            Prepared::Always => true,
            Prepared::Never => false,
            Prepared::Auto => {
                if backend.is_none() {
                    tracing::debug!("postgres connection goes through a pooler: unnamed statements only");
                }
                backend.is_some()
            }
        };
        // A named statement switches to a generic plan after five runs,
        // planned against the table as it is then: after the table was
        // emptied and analysed (autovacuum after any burst), a sequential
        // scan, kept while the table grows to 100k rows (every statement a
        // full scan). Our statements all find rows by primary key, so on a
        // session of our own the planner is told to use the index always;
        // plans stay cached. (Not through a pooler: the setting would reach
        // other clients' sessions; statements there are unnamed and planned
        // for the table as it is at each call.)
        //
        // The renewal connection runs only the renew statement, which joins
        // its batch (a few hundred keys) with their rows. On statistics taken
        // while the table was churned almost empty (issue 34), the planner
        // expects one row on each side and picks a nested loop that compares
        // every row with every key of the batch (65,280 comparisons, 35-55 ms
        // per 256 leases); a hash or merge join of the batch with its rows
        // grows with the batch only, so nested loops are off there.
        //
        // JIT is off on every session of ours: `enable_seqscan = off` makes a
        // plan that must scan (the sweep of expired rows) cost over 10^10,
        // far above `jit_above_cost`, and the server then spent 516 ms
        // compiling a sweep that scans 100,000 rows in 52 ms. Lock
        // statements are short; none gains from compiled expressions.
        //
        // From PostgreSQL 14 on, a backend running a statement checks every
        // 250 ms whether its client's connection is still there, and ends
        // the statement if not: an abandoned statement's row locks (a key's
        // row, which every grant of the key waits for) go within a quarter
        // second even where no slot of ours is reopened to end its backend
        // (`lost`): a client process that died, say.
        if named && backend.is_some() {
            let settings = if renewal {
                "SET enable_seqscan = off; SET enable_nestloop = off; SET jit = off"
            } else {
                "SET enable_seqscan = off; SET jit = off"
            };
            client.batch_execute(&format!("{settings}; {CHECK_CLIENT_CONNECTION}")).await.map_err(map_err)?;
        }
        Ok(Arc::new(Conn { client, named, prepared: Default::default(), broken: Default::default(), backend }))
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Closes the transaction connection unless disarmed: a caller that gave
/// up (timeout, dropped future, failed `ROLLBACK`) may have left it inside a
/// transaction, holding row locks (the key's gate row, and the namespace's
/// fence counter if the key had no row) that every grant of the key waits for.
/// Marking it broken is not enough: the connection would stay open, idle in
/// that transaction, until the next shared call replaced it, and the lock
/// statements queued behind a wait for those row locks would time out until
/// then. So it leaves its slot here and, with the caller's last handle,
/// closes (after the statement in flight, if any, which is cancelled: the
/// connection runs nothing else); the server rolls the transaction back.
struct Spoiled<'a> {
    conn: Option<Arc<Conn>>,
    slot: &'a SlotCell,
    tls: &'a tokio_postgres_rustls::MakeRustlsConnect,
}

impl Drop for Spoiled<'_> {
    fn drop(&mut self) {
        let Some(c) = self.conn.take() else { return };
        c.broken.store(true, Ordering::Relaxed);
        // The caller holds the transaction turn, which every user of the
        // slot takes first: the slot is free.
        if let Ok(mut slot) = self.slot.slot.try_lock() {
            if slot.conn.as_ref().is_some_and(|s| Arc::ptr_eq(s, &c)) {
                slot.lose();
            }
        }
        // A statement still running (waiting for a row lock, say) would
        // keep the connection, and its transaction, open until it ends.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (token, tls) = (c.client.cancel_token(), self.tls.clone());
            rt.spawn(async move {
                if let Err(e) = token.cancel_query(tls).await {
                    tracing::debug!(error = %e, "cancelling an abandoned transaction's statement failed");
                }
            });
        }
    }
}

impl PostgresBackend {
    /// Runs `work` in one transaction on the transaction connection, within
    /// `op_timeout`.
    pub(super) async fn transaction<T>(&self, what: &str, work: impl AsyncFnOnce(&PgClient) -> Result<T>) -> Result<T> {
        let timeout = self.inner.config.op_timeout;
        let run = async {
            let turn = self.inner.pool.txn_turn.clone().lock_owned().await;
            let conn = self.inner.pool.txn().await?;
            let pool = &self.inner.pool;
            let mut spoiled = Spoiled { conn: Some(conn.clone()), slot: &pool.txn, tls: &pool.tls };
            // BEGIN goes out with the work's first statements, in one
            // round trip (the server runs them in order; `join` polls
            // BEGIN first, so it is sent first): the transaction turn and
            // the gate's row lock are held for fewer round trips.
            let (begun, out) = futures::future::join(conn.client.batch_execute("BEGIN"), work(&conn.client)).await;
            begun.map_err(map_err)?;
            // Once sent, a COMMIT may land whatever the caller does, and the
            // release that cleans up after a dropped caller goes on another
            // connection: on the server it could run first and miss what
            // the transaction wrote (a dropped waiting writer's reservation
            // then held the key's readers back for the writer's TTL). So the
            // end runs to its reply on a task of its own that holds the
            // turn, and a caller dropped meanwhile is counted, for releases
            // to wait for (`Pool::after_abandoned_ends`).
            spoiled.conn = None;
            let end = if out.is_ok() { "COMMIT" } else { "ROLLBACK" };
            end_transaction(conn, end, turn, timeout, &self.inner.pool).await?;
            out
        };
        tokio::time::timeout(timeout, run).await.map_err(|_| self.inner.pool.txn_timed_out(what, timeout))?
    }
}

/// Sends `end` (`COMMIT` or `ROLLBACK`) on a task that holds the transaction
/// turn until the reply (or `limit`); the returned future waits for it, and
/// counts itself in `abandoned_ends` if dropped first.
fn end_transaction(
    conn: Arc<Conn>,
    end: &'static str,
    turn: tokio::sync::OwnedMutexGuard<()>,
    limit: std::time::Duration,
    pool: &Pool,
) -> impl Future<Output = Result<()>> + use<> {
    const RUNNING: u8 = 0;
    const DONE: u8 = 1;
    const ABANDONED: u8 = 2;
    let state = Arc::new(std::sync::atomic::AtomicU8::new(RUNNING));
    let (abandoned, tls) = (pool.abandoned_ends.clone(), pool.tls.clone());
    let task = {
        let (state, abandoned) = (state.clone(), abandoned.clone());
        tokio::spawn(async move {
            let ended = tokio::time::timeout(limit, conn.client.batch_execute(end)).await;
            if !matches!(ended, Ok(Ok(()))) {
                // Not known to be out of the transaction: not to be used again.
                conn.broken.store(true, Ordering::Relaxed);
                if ended.is_err() {
                    let _ = conn.client.cancel_token().cancel_query(tls).await;
                }
            }
            drop(turn);
            if state.swap(DONE, Ordering::SeqCst) == ABANDONED {
                abandoned.fetch_sub(1, Ordering::SeqCst);
            }
            ended
        })
    };
    /// Counts the ending as abandoned if the caller drops it before it is done.
    struct Waiting {
        state: Arc<std::sync::atomic::AtomicU8>,
        abandoned: Arc<AtomicUsize>,
    }
    impl Drop for Waiting {
        fn drop(&mut self) {
            self.abandoned.fetch_add(1, Ordering::SeqCst);
            if self.state.compare_exchange(RUNNING, ABANDONED, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                self.abandoned.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
    let waiting = Waiting { state, abandoned };
    async move {
        let ended = task.await;
        drop(waiting);
        match ended {
            Ok(Ok(done)) => done.map_err(map_err),
            Ok(Err(_)) => Err(timed_out(end, limit)),
            Err(e) => Err(crate::vocabulary::error::Error::backend(super::STORE, true, format!("{end} task: {e}"))),
        }
    }
}
