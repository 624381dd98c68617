//! What every connection of the store is: the driver's options (TLS, pool,
//! the statements each new session runs), values as the driver sends and
//! reads them, and what the store reads from the server once, at open.
//!
//! # Isolation
//!
//! Sessions run `READ COMMITTED`. Under InnoDB's default `REPEATABLE READ`,
//! a statement on a key that has no row also locks the gap before the next
//! key in the index, so statements on *neighbouring* keys can wait for each
//! other (and deadlock, each victim retried after a random pause): lock work
//! on distinct keys, which never conflicts, would wait on keys it never
//! names. Every read the store's decisions rest on
//! is a locking read or a write, which sees the latest committed row under
//! either level, and grants and gate changes are serialised by the fence
//! counter's row lock, not by gap locks.
//!
//! The one exception: a server that writes its binary log as statements
//! (`log_bin` on, `binlog_format=STATEMENT`) refuses every write of a
//! `READ COMMITTED` transaction (error 1665). Against such a server the
//! sessions stay at the server's level, which is correct too.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, PoolConstraints, PoolOpts, SslOpts};

use super::config::{MysqlConfig, SslMode};
use crate::vocabulary::capability::FenceDurability;

/// A duration as the microseconds of an `INTERVAL ? MICROSECOND` parameter.
pub(super) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Microseconds the server reported left (none or negative: zero).
pub(super) fn left(us: Option<i64>) -> Duration {
    Duration::from_micros(us.unwrap_or(0).max(0) as u64)
}

/// Rows matched by the last `UPDATE`, from its OK packet's info
/// ("Rows matched: 1  Changed: 0  Warnings: 0"); `None` if it has none.
pub(super) fn rows_matched(conn: &Conn) -> Option<u64> {
    let info = conn.info();
    let rest = info.split("Rows matched:").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

/// The statement that sets a session's isolation level.
pub(super) const READ_COMMITTED: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// Driver options for `config`: `pool_max` connections kept idle for a
/// minute, no reset on return, TLS as asked, and `init` run by every new
/// session.
pub(super) fn driver_opts(config: &MysqlConfig, pool_max: usize, init: Vec<String>) -> OptsBuilder {
    let pool_opts = PoolOpts::default()
        .with_constraints(PoolConstraints::new(0, pool_max).unwrap_or_default())
        // Keep idle connections up to `pool_max` for a minute (with the
        // default of 0 the pool closes every connection above the minimum as
        // soon as it is returned, and each call would reconnect).
        .with_inactive_connection_ttl(Duration::from_secs(60))
        // No session state is kept between calls, so no reset (it would cost
        // a round trip per call and drop the prepared statements). A
        // connection returned inside a transaction is rolled back by the pool
        // before reuse.
        .with_reset_connection(false);
    let ssl = ssl_opts(config);
    OptsBuilder::default()
        .ip_or_hostname(config.host.clone())
        .tcp_port(config.port)
        .user(Some(config.user.clone()))
        .pass(config.password().map(str::to_owned))
        .db_name(Some(config.database.clone()))
        .stmt_cache_size(64)
        .init(init)
        // On loopback the driver would otherwise reconnect through the
        // server's Unix socket; with TLS asked for, stay on TCP.
        .prefer_socket(ssl.is_none())
        .ssl_opts(ssl)
        .pool_opts(pool_opts)
}

fn ssl_opts(config: &MysqlConfig) -> Option<SslOpts> {
    let mode = config.ssl_mode;
    if mode == SslMode::Disabled {
        return None;
    }
    let mut ssl = SslOpts::default();
    if let Some(ca) = &config.ssl_ca {
        ssl = ssl.with_root_certs(vec![ca.clone().into()]);
    }
    Some(match mode {
        SslMode::Required => ssl.with_danger_accept_invalid_certs(true).with_danger_skip_domain_validation(true),
        SslMode::VerifyCa => ssl.with_danger_skip_domain_validation(true),
        _ => ssl,
    })
}

/// The statements every session runs at connect, before the isolation
/// level is known: row lock waits end within the call's own bound (the
/// server's default is 50 s), and a lock wait timeout counts as contention.
pub(super) fn base_init(config: &MysqlConfig) -> Vec<String> {
    vec![format!("SET SESSION innodb_lock_wait_timeout = {}", config.timeout.as_secs().clamp(1, 600))]
}

/// What the store reads from the server once, at open.
#[derive(Debug)]
pub(super) struct ServerFacts {
    /// How far a granted fence survives a crash (`innodb_flush_log_at_trx_commit`).
    pub(super) fence_durability: FenceDurability,
    /// Whether sessions may run `READ COMMITTED` (see the module docs).
    pub(super) read_committed: bool,
}

/// The expiry column of the lease and shares tables before per-key fences
/// (2026-11-29). Opening renames it to `live_until`, so that every statement
/// of a client of the old layout that names it fails: such a client drew
/// every fence from the namespace's counter and deleted rows without raising
/// it, either of which would give a key a fence it had had (model
/// `mysql_fence`, variant `NoRename`).
const OLD_EXPIRY: &str = "expires_at";

/// Whether `table` of the session's database has a column (`view`
/// `COLUMNS`, `name` `COLUMN_NAME`) or an index (`STATISTICS`,
/// `INDEX_NAME`) named [`OLD_EXPIRY`]. `view` and `name` are constants.
async fn has_old_expiry(conn: &mut Conn, view: &str, name: &str, table: &str) -> mysql_async::Result<bool> {
    let sql = format!(
        "SELECT COUNT(*) FROM information_schema.{view} WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND {name} = ?"
    );
    let n: Option<i64> = conn.exec_first(sql, (table, OLD_EXPIRY)).await?;
    Ok(n.unwrap_or(0) > 0)
}

/// Renames the old layout's expiry column of `tables` (see [`OLD_EXPIRY`]),
/// waiting at most `wait` for the metadata lock (transactions of running
/// clients hold it). A rename another client made first is fine.
async fn migrate(conn: &mut Conn, tables: &[String], wait: Duration) -> mysql_async::Result<()> {
    for table in tables {
        if !has_old_expiry(conn, "COLUMNS", "COLUMN_NAME", table).await? {
            continue;
        }
        conn.query_drop(format!("SET SESSION lock_wait_timeout = {}", wait.as_secs().clamp(1, 600))).await?;
        // The lease table's index of the expiry goes too (the sweep walks
        // the primary key; see `sql::sweep`).
        let index = has_old_expiry(conn, "STATISTICS", "INDEX_NAME", table).await?;
        let drop_index = if index { format!(", DROP INDEX {OLD_EXPIRY}") } else { String::new() };
        let rename =
            format!("ALTER TABLE `{table}` CHANGE COLUMN {OLD_EXPIRY} live_until DATETIME(6) NOT NULL{drop_index}");
        match conn.query_drop(&rename).await {
            Ok(()) => tracing::info!(table, "moved to per-key fences: renamed {OLD_EXPIRY} to live_until"),
            // Another client connecting at the same time renamed it first
            // (the server then reports the column or the index unknown,
            // whichever it checks first): look again rather than at codes.
            Err(_) if !has_old_expiry(conn, "COLUMNS", "COLUMN_NAME", table).await? => {}
            Err(e) => {
                return Err(mysql_async::Error::Other(
                    format!(
                        "table {table} has the layout before per-key fences (column {OLD_EXPIRY}), and renaming \
                         the column failed ({e}); run `{rename}` once as a user with ALTER on it, after \
                         stopping clients older than 2026-11-29 (see the store docs, Migration)"
                    )
                    .into(),
                ));
            }
        }
    }
    Ok(())
}

/// Adds the `session` column and its index (see `session_rows`) to a
/// lease table of the layout before session rows (waiting at most `wait_s` seconds for the metadata
/// lock that running clients' transactions hold). A column another client
/// added first is fine. Appending a nullable column changes no row.
pub(super) async fn add_session_column(conn: &mut Conn, table: &str, wait_s: u64) -> mysql_async::Result<()> {
    let has_column = "SELECT COUNT(*) FROM information_schema.COLUMNS
                      WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'session'";
    let present = |n: Option<i64>| n.unwrap_or(0) > 0;
    if present(conn.exec_first(has_column, (table,)).await?) {
        return Ok(());
    }
    conn.query_drop(format!("SET SESSION lock_wait_timeout = {}", wait_s.clamp(1, 600))).await?;
    let alter = format!("ALTER TABLE `{table}` ADD COLUMN session BINARY(16) NULL, ADD INDEX lease_session (session)");
    match conn.query_drop(&alter).await {
        Ok(()) => {
            tracing::info!(table, "added the session column of session-bound leases");
            Ok(())
        }
        Err(_) if present(conn.exec_first(has_column, (table,)).await?) => Ok(()),
        Err(e) => Err(mysql_async::Error::Other(
            format!(
                "table {table} has no session column, and adding it failed ({e}); run `{alter}` once as a user \
                 with ALTER on it (see the store docs, Migration)"
            )
            .into(),
        )),
    }
}

/// Connects once with `opts`, moves `tables` (the lease table, then the
/// shares table) from an older layout if they have one, runs `schema` (idempotent `CREATE
/// TABLE IF NOT EXISTS` statements), creates the shares' procedures where
/// the server lets it, and reads the server's commit durability and binary
/// log format; the connection is closed after.
pub(super) async fn open_once(
    opts: Opts,
    tables: &[String],
    schema: &[&str],
    procs: &super::share_procs::ShareProcs,
    wait: Duration,
) -> mysql_async::Result<ServerFacts> {
    let mut conn = Conn::new(opts).await?;
    migrate(&mut conn, tables, wait).await?;
    for stmt in schema {
        conn.query_drop(*stmt).await?;
    }
    add_session_column(&mut conn, &tables[0], wait.as_secs()).await?;
    procs.install(&mut conn).await?;
    let row: Option<(Option<i64>, Option<i64>, Option<String>)> =
        conn.query_first("SELECT @@innodb_flush_log_at_trx_commit, @@log_bin, @@binlog_format").await?;
    let _ = conn.disconnect().await;
    let (flush, log_bin, format) = row.unwrap_or((None, None, None));
    let fence_durability = match flush {
        // 1: fsync at every commit (the default). 3 (MariaDB): the same.
        Some(1 | 3) => FenceDurability::Durable,
        // 2: written at commit, fsynced once a second: a server crash keeps
        // commits, an OS crash may lose the last second.
        Some(2) => FenceDurability::ProcessCrash,
        // 0: even a server crash may lose the last second of grants.
        _ => FenceDurability::Volatile,
    };
    let statement_log = log_bin == Some(1) && format.is_some_and(|f| f.eq_ignore_ascii_case("STATEMENT"));
    Ok(ServerFacts { fence_durability, read_committed: !statement_log })
}
