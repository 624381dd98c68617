//! The SQLite file's tables: made on first use, brought up from older
//! layouts, and the switch to WAL mode, all while other processes may be
//! opening the same file.

use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, TransactionBehavior};

const TABLES: &str = "
CREATE TABLE IF NOT EXISTS holdfast_fence (
    id    INTEGER PRIMARY KEY CHECK (id = 0),
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO holdfast_fence (id, value) VALUES (0, 0);
CREATE TABLE IF NOT EXISTS holdfast_grants (
    key            TEXT NOT NULL,
    token          BLOB NOT NULL,
    mode           INTEGER NOT NULL,
    weight         INTEGER NOT NULL,
    limit_n        INTEGER NOT NULL,
    held           INTEGER NOT NULL,
    fence          INTEGER NOT NULL,
    label          TEXT NOT NULL,
    acquired_at_ms INTEGER NOT NULL,
    until_ms       INTEGER NOT NULL,
    session        BLOB,
    PRIMARY KEY (key, token)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS holdfast_sessions (
    id            BLOB PRIMARY KEY,
    expires_at_ms INTEGER NOT NULL,
    removed       INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS holdfast_records (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
";

/// A file of the layout before sessions (`expires_at_ms` on every row):
/// its rows keep their expiry as `until_ms`, without a session. The column
/// is renamed so that an older client fails on the file (`no such column:
/// expires_at_ms`) instead of reading a session-bound row's `until_ms` as
/// its expiry and granting the key while it is held.
const MIGRATE_FROM_ROW_EXPIRY: &str = "
DROP INDEX IF EXISTS holdfast_grants_expiry;
ALTER TABLE holdfast_grants RENAME COLUMN expires_at_ms TO until_ms;
ALTER TABLE holdfast_grants ADD COLUMN session BLOB;
";

/// One index serves both sweeps: rows without a session by their expiry,
/// and a lapsed session's rows.
const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS holdfast_grants_session_until ON holdfast_grants (session, until_ms);
";

/// Creates the tables (or brings an older file's up to this layout) in one
/// `BEGIN IMMEDIATE` transaction, which waits for other processes' locks
/// up to the busy timeout.
pub(super) fn create_schema(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(TABLES)?;
    let old: bool = tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('holdfast_grants') WHERE name = 'expires_at_ms')",
        [],
        |r| r.get(0),
    )?;
    if old {
        tx.execute_batch(MIGRATE_FROM_ROW_EXPIRY)?;
    }
    tx.execute_batch(INDEXES)?;
    tx.commit()
}

/// Switches the file to WAL mode (a no-op if it is already), retrying until
/// `deadline` while other connections hold it; returns the journal mode the
/// file is in afterwards.
///
/// The switch cannot rely on the busy timeout: SQLite makes it as a read
/// transaction that then upgrades to a write (to set the WAL flag in the
/// header), and a connection that already holds a read lock gets
/// `SQLITE_BUSY` at once instead of waiting, since waiting there could
/// deadlock with another reader doing the same. That is exactly what
/// several clients opening a new file at the same moment do, so each backs
/// off (its read lock is gone once the pragma fails) and tries again.
pub(super) fn switch_to_wal(conn: &Connection, deadline: Instant) -> rusqlite::Result<String> {
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0)) {
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) && Instant::now() < deadline => {
                // Jittered, so that two clients that collided do not collide again.
                std::thread::sleep(Duration::from_micros(rand::random_range(200..3000)));
            }
            other => return other,
        }
    }
}
