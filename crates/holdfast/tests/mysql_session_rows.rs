//! MySQL/MariaDB readers of session rows (model 11, layer 2): a later
//! version binds mutex leases to a per-client row of `holdfast_sessions`,
//! and this one must read and clean such lease rows before any client
//! writes them. Nothing here writes a session id into a lease row, so each
//! test writes the rows by hand with SQL, as that version will: the lease
//! row names the session, carries its holder's token and a `live_until` far
//! ahead (older clients see it held); it is held while its session row is
//! unexpired, and whoever removes it once the session lapsed (or directly)
//! counts the removal in the session row (`removed`).
#![cfg(feature = "mysql")]

use std::time::Duration;

use holdfast::backend::{AcquireRequest, Backend, LeaseMode, RenewRequest, UNLIMITED};
use holdfast::stores::mysql::MysqlBackend;
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::servers::mysql::{DATABASE, MysqlServer};

/// The token of the hand-written holder.
const HOLDER: u8 = 0x11;
/// The token of the client that asks for the key.
const TAKER: u8 = 0x22;
/// The session id of the hand-written lease rows.
const SESSION: u8 = 0x5A;
/// The fence of the hand-written lease rows.
const FENCE: u64 = 40;
/// The label of the hand-written lease rows.
const LABEL: &str = "session holder";

/// The 16 bytes `[byte; 16]` as SQL hex digits.
fn hex(byte: u8) -> String {
    format!("{byte:02X}").repeat(16)
}

fn token(byte: u8) -> OwnerToken {
    OwnerToken::from_bytes([byte; 16])
}

fn key(key: &str) -> LockKey {
    LockKey::new(key).expect("key")
}

fn req(name: &str, byte: u8) -> AcquireRequest {
    AcquireRequest::new(key(name), token(byte), Duration::from_secs(30)).with_label("taker")
}

async fn open(server: &MysqlServer) -> MysqlBackend {
    MysqlBackend::open_url(&server.url()).await.expect("open")
}

/// Writes session row `id` expiring `secs` seconds from the server's now
/// (negative: lapsed), nothing removed yet.
fn session(server: &MysqlServer, id: u8, secs: i64) {
    server.sql(&format!(
        "INSERT INTO {DATABASE}.holdfast_sessions (id, expires_at, removed) \
         VALUES (X'{}', UTC_TIMESTAMP(6) + INTERVAL {secs} SECOND, 0)",
        hex(id)
    ));
}

/// Writes the lease row of `key` as the later version does: bound to
/// session `id`, held by token `holder`, `live_until` far ahead.
fn bound_row(server: &MysqlServer, key: &str, holder: u8, id: u8, fence: u64) {
    server.sql(&format!(
        "INSERT INTO {DATABASE}.holdfast_leases (lock_key, token, fence, label, live_until, session) \
         VALUES ('{key}', X'{}', {fence}, '{LABEL}', '9999-12-31 00:00:00', X'{}')",
        hex(holder),
        hex(id)
    ));
}

/// The `removed` count of session row `id` (empty if the row is gone).
fn removed(server: &MysqlServer, id: u8) -> String {
    let sql = format!("SELECT removed FROM {DATABASE}.holdfast_sessions WHERE id = X'{}'", hex(id));
    server.sql(&sql).trim().to_owned()
}

/// The lease row of `key`: its token and session in hex, tab-separated
/// (`NULL` for no session; empty if the key has no row).
fn lease_row(server: &MysqlServer, key: &str) -> String {
    server
        .sql(&format!(
            "SELECT HEX(token), IFNULL(HEX(session), 'NULL') FROM {DATABASE}.holdfast_leases WHERE lock_key = '{key}'"
        ))
        .trim()
        .to_owned()
}

/// A row of an unexpired session is held: no grant of any mode, and status
/// and list show the holder with the session's time left (not the row's
/// `live_until`, years ahead). Nothing is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_of_a_live_session_is_held() {
    let server = MysqlServer::start();
    let backend = open(&server).await;
    session(&server, SESSION, 30);
    bound_row(&server, "bound/held", HOLDER, SESSION, FENCE);
    assert!(backend.try_acquire(&req("bound/held", TAKER)).await.expect("try").is_none(), "a mutex was granted");
    let status = backend.status(&key("bound/held")).await.expect("status");
    let holder = status.holder.expect("status shows no holder of a live session's row");
    assert_eq!((holder.label.as_str(), holder.fence), (LABEL, FENCE), "the holder's label and fence");
    let left = holder.ttl_left.expect("the holder's time left");
    assert!(left > Duration::ZERO && left <= Duration::from_secs(30), "time left {left:?}, not the session's 30 s");
    let listed = backend.list("bound/").await.expect("list");
    assert!(
        listed.iter().any(|s| s.key == "bound/held" && s.holder.as_ref().is_some_and(|h| h.fence == FENCE)),
        "list does not show the held key: {listed:?}"
    );
    let modes = [
        ("a semaphore permit", LeaseMode::Shared { weight: 1, limit: 3 }),
        ("a reader", LeaseMode::Shared { weight: 1, limit: UNLIMITED }),
        ("a writer", LeaseMode::Writer),
    ];
    for (what, mode) in modes {
        let asked = req("bound/held", TAKER).with_mode(mode);
        assert!(backend.try_acquire(&asked).await.expect("try").is_none(), "{what} was granted");
    }
    assert_eq!(lease_row(&server, "bound/held"), format!("{}\t{}", hex(HOLDER), hex(SESSION)), "the row changed");
    assert_eq!(removed(&server, SESSION), "0", "a removal was counted for a live session");
}

/// A row whose session lapsed is free: the grant takes it over with a
/// higher fence, under the taker's own session, and counts the removal
/// first, so the old holder's next renewal learns it lost the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_of_a_lapsed_session_is_taken_over_and_counted() {
    let server = MysqlServer::start();
    let backend = open(&server).await;
    session(&server, SESSION, -1);
    bound_row(&server, "bound/lapsed", HOLDER, SESSION, FENCE);
    let grant = backend.try_acquire(&req("bound/lapsed", TAKER)).await.expect("try");
    let grant = grant.expect("the row of a lapsed session was not taken over");
    assert!(grant.fence > FENCE, "fence {} after the row's {FENCE}", grant.fence);
    assert_eq!(removed(&server, SESSION), "1", "the takeover was not counted in the session row");
    assert_eq!(lease_row(&server, "bound/lapsed"), format!("{}\t{}", hex(TAKER), takers_session(&server)));
}

/// The one session row other than the test's own (`SESSION`), in hex:
/// the taker's.
fn takers_session(server: &MysqlServer) -> String {
    let sql = format!("SELECT HEX(id) FROM {DATABASE}.holdfast_sessions WHERE id <> X'{}'", hex(SESSION));
    let ids = server.sql(&sql);
    let ids: Vec<&str> = ids.split_whitespace().collect();
    assert_eq!(ids.len(), 1, "the taker's session rows: {ids:?}");
    ids[0].to_owned()
}

/// A row whose session row is missing (deleted) is free too, and taken
/// over without a session row to count in (none is created for it: the
/// only session row is the taker's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_of_a_missing_session_is_taken_over() {
    let server = MysqlServer::start();
    let backend = open(&server).await;
    bound_row(&server, "bound/missing", HOLDER, SESSION, FENCE);
    let grant = backend.try_acquire(&req("bound/missing", TAKER)).await.expect("try");
    let grant = grant.expect("the row of a missing session was not taken over");
    assert!(grant.fence > FENCE, "fence {} after the row's {FENCE}", grant.fence);
    assert_eq!(lease_row(&server, "bound/missing"), format!("{}\t{}", hex(TAKER), takers_session(&server)));
    assert_eq!(removed(&server, SESSION), "", "a session row appeared for the missing one");
}

/// A semaphore permit on a key whose row's session lapsed is granted above
/// the row's fence, and counts the removal; the key is then the permit's,
/// which holds off a mutex (the lapsed session no longer decides).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_takes_over_a_row_of_a_lapsed_session_and_counts() {
    let server = MysqlServer::start();
    let backend = open(&server).await;
    session(&server, SESSION, -1);
    bound_row(&server, "bound/share", HOLDER, SESSION, FENCE);
    let permit = req("bound/share", TAKER).with_mode(LeaseMode::Shared { weight: 1, limit: 2 });
    let grant = backend.try_acquire(&permit).await.expect("try");
    let grant = grant.expect("a permit was refused on the row of a lapsed session");
    assert!(grant.fence > FENCE, "permit fence {} after the row's {FENCE}", grant.fence);
    assert_eq!(removed(&server, SESSION), "1", "the permit's takeover was not counted");
    let mutex = backend.try_acquire(&req("bound/share", 0x33)).await.expect("try");
    assert!(mutex.is_none(), "a mutex was granted while the permit is held");
}

/// A forced release of a live session's row reports its fence, deletes the
/// row and counts the removal; the key's next grant is above the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_of_a_live_session_row_is_counted() {
    let server = MysqlServer::start();
    let backend = open(&server).await;
    session(&server, SESSION, 30);
    bound_row(&server, "bound/forced", HOLDER, SESSION, FENCE);
    let forced = backend.force_release(&key("bound/forced")).await.expect("force");
    assert_eq!(forced.exclusive, Some(FENCE), "the forced release did not see the holder: {forced:?}");
    assert_eq!(lease_row(&server, "bound/forced"), "", "the row was not deleted");
    assert_eq!(removed(&server, SESSION), "1", "the forced release was not counted");
    let next = backend.try_acquire(&req("bound/forced", TAKER)).await.expect("try").expect("free after force");
    assert!(next.fence > FENCE, "fence {} after the forced-out {FENCE}", next.fence);
}

/// A release by the row's token (a holder whose process handed its token
/// on) releases a live session's row and counts the removal; the key is
/// then free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_by_token_of_a_live_session_row_is_counted() {
    let server = MysqlServer::start();
    let backend = open(&server).await;
    session(&server, SESSION, 30);
    bound_row(&server, "bound/released", HOLDER, SESSION, FENCE);
    assert!(backend.release(&key("bound/released"), token(HOLDER)).await.expect("release"), "the token held nothing");
    assert_eq!(removed(&server, SESSION), "1", "the release was not counted");
    let next = backend.try_acquire(&req("bound/released", TAKER)).await.expect("try");
    let next = next.expect("the released key is still held");
    assert!(next.fence > FENCE, "fence {} after the released {FENCE}", next.fence);
}

/// The sweep deletes a row whose session lapsed over a minute ago and
/// counts it, and leaves a row whose session lapsed a second ago (its taker
/// may still come) and a row of a live session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_deletes_rows_of_long_lapsed_sessions_and_counts() {
    let server = MysqlServer::start();
    let backend = open(&server).await;
    let (old, recent, live) = (0x01, 0x02, 0x03);
    session(&server, old, -120);
    session(&server, recent, -1);
    session(&server, live, 30);
    bound_row(&server, "sweep/old", HOLDER, old, FENCE);
    bound_row(&server, "sweep/recent", HOLDER, recent, FENCE);
    bound_row(&server, "sweep/live", HOLDER, live, FENCE);
    assert_eq!(backend.sweep_expired().await.expect("sweep"), 1, "rows swept");
    let left = server.sql(&format!(
        "SELECT GROUP_CONCAT(lock_key ORDER BY lock_key) FROM {DATABASE}.holdfast_leases WHERE lock_key LIKE 'sweep/%'"
    ));
    assert_eq!(left.trim(), "sweep/live,sweep/recent", "rows left after the sweep");
    // The old session's row goes in the same step, once its row is counted.
    assert_eq!(removed(&server, old), "", "a session lapsed two minutes ago was not swept");
    assert_eq!(removed(&server, recent), "0", "a row lapsed a second ago was counted");
    assert_eq!(removed(&server, live), "0", "a live session's row was counted");
    let next = backend.try_acquire(&req("sweep/old", TAKER)).await.expect("try").expect("free after the sweep");
    assert!(next.fence > FENCE, "fence {} after the swept {FENCE}", next.fence);
}

/// Raising the fence floor and writing the key's record need a held lease:
/// the token of a live session's row holds, and once the session lapsed it
/// holds nothing (nothing raised, nothing written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_session_row_holds_for_fences_and_records_until_it_lapses() {
    let server = MysqlServer::start();
    let backend = open(&server).await;
    session(&server, SESSION, 30);
    bound_row(&server, "bound/rec", HOLDER, SESSION, FENCE);
    let (k, t) = (key("bound/rec"), token(HOLDER));
    assert!(backend.raise_fence(&k, t, 1_000).await.expect("raise"), "the live session's token did not hold");
    assert!(backend.write_record(&k, t, 7).await.expect("write"), "the live session's token did not hold");
    assert_eq!(backend.read_record(&k).await.expect("read"), Some(7), "the record written");
    server.sql(&format!(
        "UPDATE {DATABASE}.holdfast_sessions SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = X'{}'",
        hex(SESSION)
    ));
    assert!(!backend.raise_fence(&k, t, 2_000).await.expect("raise"), "a lapsed session's token raised the fence");
    assert!(!backend.write_record(&k, t, 8).await.expect("write"), "a lapsed session's token wrote the record");
    assert_eq!(backend.read_record(&k).await.expect("read"), Some(7), "the record after the lapse");
    let fence = server.sql(&format!("SELECT fence FROM {DATABASE}.holdfast_leases WHERE lock_key = 'bound/rec'"));
    assert_eq!(fence.trim(), "1000", "the row's fence after a raise while live and one after the lapse");
}

/// The lease table of the layout before session rows, as
/// `stores/mysql/sql.rs` created it.
fn previous_lease_table() -> String {
    format!(
        "CREATE TABLE {DATABASE}.holdfast_leases (lock_key VARBINARY(256) NOT NULL, \
           token BINARY(16) NOT NULL, fence BIGINT UNSIGNED NOT NULL, \
           label VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
           live_until DATETIME(6) NOT NULL, PRIMARY KEY (lock_key)) ENGINE=InnoDB;"
    )
}

/// The `session` column of the lease table (type and nullability) and how
/// many indexes cover it.
fn session_column(server: &MysqlServer) -> (String, String) {
    let column = server.sql(&format!(
        "SELECT COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{DATABASE}' \
         AND TABLE_NAME = 'holdfast_leases' AND COLUMN_NAME = 'session'"
    ));
    let indexes = server.sql(&format!(
        "SELECT COUNT(DISTINCT INDEX_NAME) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = '{DATABASE}' \
         AND TABLE_NAME = 'holdfast_leases' AND COLUMN_NAME = 'session'"
    ));
    (column.trim().to_owned(), indexes.trim().to_owned())
}

/// Opening a namespace whose lease table has the previous layout adds the
/// session column (nullable) and its index and the sessions table; a lease
/// an older client holds stays held, and its holder renews and releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_a_previous_layout_adds_the_session_column_and_keeps_its_leases() {
    let server = MysqlServer::start();
    server.sql(&format!(
        "{} INSERT INTO {DATABASE}.holdfast_leases VALUES ('old/a', X'{}', 7, 'old client', \
           UTC_TIMESTAMP(6) + INTERVAL 30 SECOND);",
        previous_lease_table(),
        hex(HOLDER)
    ));
    let backend = MysqlBackend::open_url(&server.url()).await.expect("open a previous layout");
    let (column, indexes) = session_column(&server);
    assert_eq!(column, "binary(16)\tYES", "the session column after open");
    assert_eq!(indexes, "1", "indexes on the session column");
    let sessions = server.sql(&format!(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{DATABASE}' \
         AND TABLE_NAME = 'holdfast_sessions'"
    ));
    assert_eq!(sessions.trim(), "1", "the sessions table after open");
    assert_eq!(lease_row(&server, "old/a"), format!("{}\tNULL", hex(HOLDER)), "the old row after open");
    assert!(backend.try_acquire(&req("old/a", TAKER)).await.expect("try").is_none(), "the old lease was taken");
    let renewal = RenewRequest { key: key("old/a"), token: token(HOLDER), ttl: Duration::from_secs(30) };
    assert_eq!(backend.renew(&[renewal]).await.expect("renew"), vec![true], "the old holder could not renew");
    assert!(backend.release(&key("old/a"), token(HOLDER)).await.expect("release"), "the old holder held nothing");
    let next = backend.try_acquire(&req("old/a", TAKER)).await.expect("try").expect("free after release");
    assert!(next.fence > 7, "fence {} after the old client's 7", next.fence);
}

/// Two clients opening a namespace of the previous layout at once both
/// connect, and the table ends with one session column and one index on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_opens_at_once_of_a_previous_layout_both_succeed() {
    let server = MysqlServer::start();
    server.sql(&previous_lease_table());
    let url = server.url();
    let (a, b) = tokio::join!(MysqlBackend::open_url(&url), MysqlBackend::open_url(&url));
    let a = a.unwrap_or_else(|e| panic!("the first client could not open: {e}"));
    let b = b.unwrap_or_else(|e| panic!("the second client could not open: {e}"));
    assert_eq!(session_column(&server), ("binary(16)\tYES".to_owned(), "1".to_owned()), "column and index count");
    assert!(a.try_acquire(&req("both/a", TAKER)).await.expect("try").is_some(), "the first client's grant");
    assert!(b.try_acquire(&req("both/a", 0x33)).await.expect("try").is_none(), "the second client took a held key");
}

/// A takeover that saw the session lapsed waits for a renewal of it in
/// flight and then finds it extended: busy, nothing counted, the holder's
/// row untouched (model 11's `ConsistentReadTakeover`: with the count
/// taken without re-checking the lapse on the session row's latest
/// version, the key was granted while its holder's renewal kept it). The
/// renewal is played by a transaction that extends the session row and
/// sleeps until the takeover is seen waiting for that row.
#[test]
fn a_takeover_waits_for_a_renewal_in_flight_and_finds_the_session_extended() {
    let server = MysqlServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let backend = rt.block_on(MysqlBackend::open_url(&server.url_with("timeout_ms=120000"))).expect("open");
    session(&server, SESSION, -1);
    bound_row(&server, "race/a", HOLDER, SESSION, FENCE);
    let before = lease_row(&server, "race/a");
    let granted = std::thread::scope(|scope| {
        let renewal = scope.spawn(|| {
            server.sql(&format!(
                "BEGIN; UPDATE {DATABASE}.holdfast_sessions SET expires_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND \
                 WHERE id = X'{}'; DO SLEEP(120); COMMIT;",
                hex(SESSION)
            ))
        });
        let sleeping = "SELECT id FROM information_schema.PROCESSLIST WHERE state = 'User sleep'";
        let started = std::time::Instant::now();
        let mut sleeper = String::new();
        while sleeper.trim().is_empty() {
            assert!(!renewal.is_finished(), "the renewal ended before it was seen");
            assert!(started.elapsed() < Duration::from_secs(60), "the renewal never started");
            std::thread::sleep(Duration::from_millis(20));
            sleeper = server.sql(sleeping);
        }
        let take = scope.spawn(|| rt.block_on(backend.try_acquire(&req("race/a", TAKER))));
        // The takeover's count of the removal waits for the session row.
        let counting = "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                        WHERE info LIKE 'UPDATE `holdfast_sessions` SET removed%'";
        let waiting = std::time::Instant::now();
        while server.sql(counting).trim() != "1" {
            assert!(!take.is_finished(), "the takeover did not wait for the renewal: {:?}", take.join());
            assert!(waiting.elapsed() < Duration::from_secs(60), "the takeover never counted");
            std::thread::sleep(Duration::from_millis(20));
        }
        server.sql(&format!("KILL QUERY {}", sleeper.trim()));
        renewal.join().expect("renewal thread");
        take.join().expect("takeover thread").expect("takeover")
    });
    assert!(granted.is_none(), "the key was granted while its session had been renewed");
    assert_eq!(removed(&server, SESSION), "0", "a removal was counted that did not happen");
    assert_eq!(lease_row(&server, "race/a"), before, "the holder's row changed");
}

/// A waiting acquire of a row whose session lapses while it waits gets the
/// key soon after the lapse (its first attempt is the grant statement
/// alone; a later one reads the row, finds the session lapsed and takes
/// the row over), and the removal is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_takes_over_a_row_whose_session_lapses_meanwhile() {
    let server = MysqlServer::start();
    let backend = open(&server).await;
    session(&server, SESSION, 1);
    bound_row(&server, "bound/wait", HOLDER, SESSION, FENCE);
    let started = std::time::Instant::now();
    let asked = req("bound/wait", TAKER);
    let grant = tokio::time::timeout(Duration::from_secs(20), backend.acquire(&asked)).await;
    let grant = grant.expect("the waiting acquire still waits after 20 s").expect("the waiting acquire failed");
    let waited = started.elapsed();
    assert!(grant.fence > FENCE, "fence {} after the row's {FENCE}", grant.fence);
    assert!(waited < Duration::from_secs(10), "the takeover came {waited:?} after the wait began (session: 1 s)");
    assert_eq!(removed(&server, SESSION), "1", "the takeover was not counted");
}
