//! MySQL/MariaDB per-key fences (model `mysql_fence`): a key's fence lives
//! in its lease row, which stays after release; only a key without a row
//! draws from the namespace's counter, which every delete of a row raises to
//! the deleted fence. Each test walks one way a key loses its row, or one
//! way a fence is drawn, and checks that the key's next fence is above every
//! fence it had. A namespace of the layout before, with an old client's
//! lease held, is moved at open.
#![cfg(feature = "mysql")]

use std::time::Duration;

use holdfast::backend::{AcquireRequest, Backend, LeaseMode};
use holdfast::stores::mysql::MysqlBackend;
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::servers::mysql::{DATABASE, MysqlServer};

fn req(key: &str) -> AcquireRequest {
    AcquireRequest::new(LockKey::new(key).expect("key"), OwnerToken::random(), Duration::from_secs(30))
        .with_label("fences")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// The lease table as clients before per-key fences made it: the expiry
/// column `expires_at` and an index on it.
fn old_lease_table() -> String {
    format!(
        "CREATE TABLE {DATABASE}.holdfast_leases (lock_key VARBINARY(256) NOT NULL PRIMARY KEY, \
           token BINARY(16) NOT NULL, fence BIGINT UNSIGNED NOT NULL, \
           label VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
           expires_at DATETIME(6) NOT NULL, KEY expires_at (expires_at)) ENGINE=InnoDB;"
    )
}

fn counter(server: &MysqlServer) -> u64 {
    let value = server.sql(&format!("SELECT value FROM {DATABASE}.holdfast_fence WHERE id = 0"));
    value.trim().parse().expect("counter value")
}

/// Grants and releases `key` `n` times; the last fence.
async fn cycles(backend: &MysqlBackend, key: &str, n: usize) -> u64 {
    let mut last = 0;
    for _ in 0..n {
        let r = req(key);
        let grant = backend.try_acquire(&r).await.expect("acquire").expect("free");
        assert!(grant.fence > last, "fence {} after {last}", grant.fence);
        last = grant.fence;
        assert!(backend.release(&r.key, r.token).await.expect("release"));
    }
    last
}

/// A released key is granted again by its row alone: the counter is drawn
/// only for the key's first grant, so grants of different keys never queue
/// on it (the point of the layout).
#[test]
fn grants_of_a_released_key_leave_the_counter_alone() {
    let server = MysqlServer::start();
    runtime().block_on(async {
        let backend = MysqlBackend::open_url(&server.url()).await.expect("open");
        let first = cycles(&backend, "pk/a", 1).await;
        let before = counter(&server);
        let last = cycles(&backend, "pk/a", 5).await;
        assert_eq!(last, first + 5, "each grant is the row's fence + 1");
        assert_eq!(counter(&server), before, "grants of a key with a row drew from the counter");
        let row = server.sql(&format!(
            "SELECT HEX(token), fence, live_until <= UTC_TIMESTAMP(6) FROM {DATABASE}.holdfast_leases \
             WHERE lock_key = 'pk/a'"
        ));
        assert_eq!(row.trim(), format!("{}\t{last}\t1", "F".repeat(32)), "the released marker keeps the fence");
    });
}

/// The sweep deletes rows released over a minute ago and raises the counter
/// to their fences: the key's next grant, drawn from the counter, is above
/// every fence the key had. Without the raise it repeats one.
#[test]
fn a_swept_key_gets_a_higher_fence() {
    let server = MysqlServer::start();
    runtime().block_on(async {
        let backend = MysqlBackend::open_url(&server.url()).await.expect("open");
        let last = cycles(&backend, "sweep/a", 4).await;
        assert!(counter(&server) < last, "the key's fence ran ahead of the counter");
        server.sql(&format!(
            "UPDATE {DATABASE}.holdfast_leases SET live_until = UTC_TIMESTAMP(6) - INTERVAL 2 MINUTE \
             WHERE lock_key = 'sweep/a'"
        ));
        assert_eq!(backend.sweep_expired().await.expect("sweep"), 1, "the released row is swept");
        assert_eq!(counter(&server), last, "the sweep raised the counter to the deleted fence");
        let next = cycles(&backend, "sweep/a", 1).await;
        assert!(next > last, "fence {next} after {last}: a swept key's fence went back");
    });
}

/// A forced release deletes the key's row and raises the counter to its
/// fence, so the next holder's fence is above the forced-out holder's.
#[test]
fn a_forced_release_keeps_the_next_fence_higher() {
    let server = MysqlServer::start();
    runtime().block_on(async {
        let backend = MysqlBackend::open_url(&server.url()).await.expect("open");
        cycles(&backend, "force/a", 3).await;
        let held = req("force/a");
        let grant = backend.try_acquire(&held).await.expect("acquire").expect("free");
        let forced = backend.force_release(&held.key).await.expect("force");
        assert_eq!(forced.fences().collect::<Vec<_>>(), vec![grant.fence], "the holder was forced out");
        let next = cycles(&backend, "force/a", 1).await;
        assert!(next > grant.fence, "fence {next} after the forced-out {}", grant.fence);
    });
}

/// A share of a key whose released row carries a fence above the counter
/// draws above the row's fence, and an exclusive grant after the share's
/// gate expired is above the share's.
#[test]
fn shares_draw_above_the_key_fence() {
    let server = MysqlServer::start();
    runtime().block_on(async {
        let backend = MysqlBackend::open_url(&server.url()).await.expect("open");
        let last = cycles(&backend, "share/a", 4).await;
        let share = req("share/a").with_mode(LeaseMode::Shared { weight: 1, limit: 2 });
        let shared = backend.try_acquire(&share).await.expect("share").expect("free");
        assert!(shared.fence > last, "share fence {} after {last}", shared.fence);
        assert!(backend.release(&share.key, share.token).await.expect("release share"));
        let next = cycles(&backend, "share/a", 1).await;
        assert!(next > shared.fence, "fence {next} after the share's {}", shared.fence);
    });
}

/// The fence floor is the key's: a raise moves that key's next fence above
/// it and leaves other keys' fences where they were.
#[test]
fn a_raised_floor_is_the_key_s_own() {
    let server = MysqlServer::start();
    runtime().block_on(async {
        let backend = MysqlBackend::open_url(&server.url()).await.expect("open");
        let held = req("floor/a");
        backend.try_acquire(&held).await.expect("acquire").expect("free");
        assert!(backend.raise_fence(&held.key, held.token, 1_000_000).await.expect("raise"));
        assert!(backend.release(&held.key, held.token).await.expect("release"));
        assert!(cycles(&backend, "floor/a", 1).await > 1_000_000, "the raised key's next fence");
        assert!(cycles(&backend, "floor/b", 1).await < 1_000_000, "another key's fence moved");
    });
}

/// A namespace of the layout before per-key fences (column `expires_at`),
/// with an old client's lease held: opening renames the column, the old
/// lease is respected until it runs out, a statement of the old layout fails
/// loudly (it would draw from the counter, or delete a row without raising
/// it), and the key's next fence is above the old one.
#[test]
fn a_namespace_of_the_old_layout_is_moved_at_open() {
    let server = MysqlServer::start();
    let db = DATABASE;
    server.sql(&format!(
        "{} \
         CREATE TABLE {db}.holdfast_fence (id TINYINT UNSIGNED NOT NULL PRIMARY KEY, \
           value BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB; \
         INSERT INTO {db}.holdfast_fence VALUES (0, 7); \
         INSERT INTO {db}.holdfast_leases VALUES ('old/a', REPEAT('o', 16), 7, 'old client', \
           UTC_TIMESTAMP(6) + INTERVAL 2 SECOND);",
        old_lease_table()
    ));
    runtime().block_on(async {
        let backend = MysqlBackend::open_url(&server.url()).await.expect("open an old namespace");
        let columns = server.sql(&format!(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{db}' \
             AND TABLE_NAME = 'holdfast_leases' AND COLUMN_NAME IN ('expires_at', 'live_until')"
        ));
        assert_eq!(columns.trim(), "live_until", "the expiry column was renamed");
        let indexes = server.sql(&format!(
            "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = '{db}' \
             AND TABLE_NAME = 'holdfast_leases'"
        ));
        // (The session index comes with session-bound leases.)
        assert!(
            !indexes.contains("expires_at") && indexes.contains("PRIMARY"),
            "the expiry's index was dropped: {indexes}"
        );
        assert!(backend.try_acquire(&req("old/a")).await.expect("acquire").is_none(), "the old lease is held");
        let old_sweep = server.try_sql(&format!(
            "DELETE FROM {db}.holdfast_leases WHERE expires_at < UTC_TIMESTAMP(6) - INTERVAL 60 SECOND"
        ));
        let refused = old_sweep.expect_err("a statement of the old layout ran");
        assert!(refused.contains("expires_at"), "refused for the old column: {refused}");
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let next = cycles(&backend, "old/a", 1).await;
        assert!(next > 7, "fence {next} after the old client's 7");
        let again = MysqlBackend::open_url(&server.url()).await.expect("open a moved namespace");
        assert!(cycles(&again, "old/a", 1).await > next);
    });
}

/// A user with the least privileges the store's page asks for (no `ALTER`)
/// connecting to a namespace of the old layout: the rename fails, and the
/// error names the store and endpoint, gives the statement to run once as a
/// user with `ALTER`, and nothing was changed.
#[test]
fn an_old_layout_without_alter_says_what_to_run() {
    let server = MysqlServer::start();
    let db = DATABASE;
    server.sql(&format!(
        "{} \
         CREATE USER 'narrow'@'127.0.0.1' IDENTIFIED BY 'narrow-pw'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON {db}.* TO 'narrow'@'127.0.0.1';",
        old_lease_table()
    ));
    let url = format!("mysql://narrow:narrow-pw@127.0.0.1:{}/{db}", server.port());
    let err = runtime().block_on(MysqlBackend::open_url(&url)).expect_err("opened without renaming");
    let text = err.to_string();
    for part in ["mysql", &format!("127.0.0.1:{}", server.port()), "ALTER TABLE `holdfast_leases` CHANGE COLUMN"] {
        assert!(text.contains(part), "the error does not name {part:?}: {text}");
    }
    assert!(!text.contains("narrow-pw"), "the error shows the password: {text}");
    let column = server.sql(&format!(
        "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{db}' \
         AND TABLE_NAME = 'holdfast_leases' AND COLUMN_NAME = 'expires_at'"
    ));
    assert_eq!(column.trim(), "1", "the old column is still there");
}

/// Several clients of the new layout starting at once on a namespace of the
/// old one: each tries the rename, one does it, and every one connects.
#[test]
fn clients_starting_at_once_all_move_an_old_layout() {
    let server = MysqlServer::start();
    server.sql(&old_lease_table());
    runtime().block_on(async {
        let url = server.url();
        let opens = (0..4).map(|_| MysqlBackend::open_url(&url));
        for (i, opened) in futures::future::join_all(opens).await.into_iter().enumerate() {
            let backend = opened.unwrap_or_else(|e| panic!("client {i} could not connect: {e}"));
            assert!(cycles(&backend, &format!("at-once/{i}"), 1).await > 0);
        }
    });
}

/// A connection of its own holding the namespace's counter row locked in
/// an open transaction, as a grant of a new key or a sweep holds it.
async fn counter_locked(server: &MysqlServer) -> mysql_async::Conn {
    use mysql_async::prelude::Queryable;
    let mut side = mysql_async::Conn::from_url(server.url()).await.expect("side connection");
    side.query_drop("BEGIN").await.expect("begin");
    side.query_drop(format!("SELECT value FROM {DATABASE}.holdfast_fence WHERE id = 0 FOR UPDATE"))
        .await
        .expect("lock");
    side
}

/// Shares of a key that has a row are fenced from the row alone: with the
/// counter row locked (another key's first grant, a sweep), read locks of
/// the key are granted and released at once, above its fence and without
/// moving the counter. A key without a row still draws from the counter, so
/// it waits for it. (Every shared grant and release locked the counter
/// before: 64 tasks reading keys of their own got 673 grants a second where
/// their mutex cycles ran at 8,060.)
#[test]
fn shares_of_a_key_with_a_row_leave_the_counter_alone() {
    use mysql_async::prelude::Queryable;
    let server = MysqlServer::start();
    runtime().block_on(async {
        let backend = MysqlBackend::open_url(&server.url()).await.expect("open");
        let last = cycles(&backend, "sk/a", 2).await;
        let before = counter(&server);
        let mut side = counter_locked(&server).await;
        let read = |key: &str| req(key).with_mode(LeaseMode::Shared { weight: 1, limit: u32::MAX });
        let (a, b) = (read("sk/a"), read("sk/a"));
        let quick = Duration::from_secs(3);
        let ga = tokio::time::timeout(quick, backend.try_acquire(&a)).await;
        let ga = ga.expect("a share of a key with a row waited for the counter").expect("share").expect("free");
        let gb = tokio::time::timeout(quick, backend.try_acquire(&b)).await.expect("second share waited");
        let gb = gb.expect("share").expect("free");
        assert!(ga.fence > last && gb.fence > ga.fence, "fences {} and {} after {last}", ga.fence, gb.fence);
        for r in [&a, &b] {
            let released = tokio::time::timeout(quick, backend.release(&r.key, r.token)).await;
            assert!(released.expect("a share's release waited for the counter").expect("release"));
        }
        // A key without a row: its share draws from the counter, after it.
        let backend2 = backend.clone();
        let fresh = read("sk/new");
        let waiting = tokio::spawn(async move { backend2.try_acquire(&fresh).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "a key without a row was granted without the counter");
        side.query_drop("ROLLBACK").await.expect("rollback");
        let fresh = tokio::time::timeout(quick, waiting).await.expect("never granted").expect("task");
        assert!(fresh.expect("share").is_some(), "the key without a row is free");
        assert_eq!(counter(&server), before + 1, "only the new key's share drew from the counter");
        let next = cycles(&backend, "sk/a", 1).await;
        assert!(next > gb.fence, "the mutex's next fence {next} is above the shares' {}", gb.fence);
    });
}

/// A share that finds no row takes the counter's lock and reads the row
/// again: a grant of the key that inserted a row meanwhile (holding the
/// counter, as every insert does) is then seen, and the share is refused.
/// Without the second read the share's gate was written over that holder's
/// row: both held the key.
#[test]
fn a_share_that_found_no_row_reads_it_again_under_the_counter() {
    use mysql_async::prelude::Queryable;
    let server = MysqlServer::start();
    runtime().block_on(async {
        let backend = MysqlBackend::open_url(&server.url()).await.expect("open");
        let mut side = counter_locked(&server).await;
        let share = req("race/a").with_mode(LeaseMode::Shared { weight: 1, limit: 2 });
        let backend2 = backend.clone();
        let asking = tokio::spawn(async move { backend2.try_acquire(&share).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!asking.is_finished(), "the share did not wait for the counter");
        // Another client's grant of the new key, as its insert makes it.
        side.query_drop(format!(
            "INSERT INTO {DATABASE}.holdfast_leases (lock_key, token, fence, label, live_until) \
             VALUES ('race/a', X'{}', 7000, 'side holder', UTC_TIMESTAMP(6) + INTERVAL 60 SECOND)",
            "01".repeat(16)
        ))
        .await
        .expect("insert");
        side.query_drop(format!("UPDATE {DATABASE}.holdfast_fence SET value = GREATEST(value, 7000) WHERE id = 0"))
            .await
            .expect("counter");
        side.query_drop("COMMIT").await.expect("commit");
        let got = tokio::time::timeout(Duration::from_secs(5), asking).await.expect("no answer").expect("task");
        assert!(got.expect("share").is_none(), "a share was granted over another client's new grant");
        let row =
            server.sql(&format!("SELECT HEX(token), label FROM {DATABASE}.holdfast_leases WHERE lock_key = 'race/a'"));
        assert_eq!(row.trim(), format!("{}\tside holder", "01".repeat(16)), "the holder's row was written over");
    });
}
