//! MySQL/MariaDB sessions: the isolation level the store's transactions run
//! at, and a server whose binary log is written as statements.
#![cfg(feature = "mysql")]

use std::time::{Duration, Instant};

use holdfast::backend::{AcquireRequest, Backend, RenewRequest};
use holdfast::stores::mysql::MysqlBackend;
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::servers::mysql::{DATABASE, MysqlServer};

fn req(key: &str) -> AcquireRequest {
    AcquireRequest::new(LockKey::new(key).expect("key"), OwnerToken::random(), Duration::from_secs(30))
        .with_label("sessions")
}

/// The store's grant transactions run `READ COMMITTED`, as its page says:
/// under the server's default `REPEATABLE READ`, grants and releases of
/// neighbouring keys take each other's gap locks and deadlock. Seen from the
/// server: another session holds the fence counter's row lock, so a grant
/// waits inside its transaction (until the test ends the blocker's sleep),
/// and `INNODB_TRX` shows that transaction's level.
#[test]
fn grant_transactions_run_read_committed() {
    let server = MysqlServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    // A long call bound (the grant's row lock wait too): under load, the
    // test may take many seconds to see the wait.
    let backend = rt.block_on(MysqlBackend::open_url(&server.url_with("timeout_ms=180000"))).expect("open");
    let blocker = std::thread::scope(|scope| {
        let blocker = scope.spawn(|| {
            server.sql(&format!(
                "BEGIN; SELECT value FROM {DATABASE}.holdfast_fence WHERE id = 0 FOR UPDATE; \
                 DO SLEEP(180); COMMIT;"
            ))
        });
        // The blocker holds the row (it sleeps), then a grant waits for it.
        let started = Instant::now();
        // (`PROCESSLIST`, not `INNODB_TRX`: the latter is a cache refreshed
        // every 100 ms, whose query column can be stale.)
        let holding = "SELECT id FROM information_schema.PROCESSLIST WHERE state = 'User sleep'";
        let mut sleeper = String::new();
        while sleeper.trim().is_empty() {
            assert!(!blocker.is_finished(), "the blocking transaction ended before it was seen");
            assert!(started.elapsed() < Duration::from_secs(30), "the blocking transaction never started");
            std::thread::sleep(Duration::from_millis(20));
            sleeper = server.sql(holding);
        }
        let blocker_seen = started.elapsed();
        let grant = scope.spawn(|| rt.block_on(backend.try_acquire(&req("iso/a"))));
        // Each bound counts from its own start (the CI machine runs every
        // suite at once: a shared clock once ran out while the grant was
        // still on its way to the row).
        let grant_started = Instant::now();
        let mut waiting = String::new();
        while waiting.is_empty() {
            assert!(!grant.is_finished(), "the grant did not wait for the counter row: {:?}", grant.join());
            assert!(
                grant_started.elapsed() < Duration::from_secs(120),
                "the grant never waited for the counter row (blocker seen after {blocker_seen:?}; \
                 transactions: {:?})",
                server.sql("SELECT trx_state, trx_isolation_level, trx_query FROM information_schema.INNODB_TRX; SELECT id, command, state, info FROM information_schema.PROCESSLIST")
            );
            waiting = server
                .sql("SELECT trx_isolation_level FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'");
            // InnoDB refreshes the cache behind `INNODB_TRX` only when it has
            // not been read for 100 ms (each read restarts that wait): polled
            // faster, it showed the view from before the grant forever.
            std::thread::sleep(Duration::from_millis(250));
        }
        assert_eq!(waiting.trim(), "READ COMMITTED", "the grant's transaction level");
        // The sleep interrupted, the blocker commits and the grant goes on.
        server.sql(&format!("KILL QUERY {}", sleeper.trim()));
        let granted = grant.join().expect("grant thread").expect("grant");
        assert!(granted.is_some(), "the key was free");
        blocker.join().expect("blocker thread")
    });
    assert!(blocker.contains('0'), "the blocker read the counter: {blocker:?}");
}

/// A server that logs statements (`binlog_format=STATEMENT`) refuses every
/// write of a `READ COMMITTED` transaction (error 1665): there the store's
/// sessions keep the server's level, and grants, releases and renewals work.
#[test]
fn a_server_logging_statements_still_grants() {
    let server = MysqlServer::start_statement_binlog();
    assert_eq!(server.sql("SELECT @@log_bin, @@binlog_format").trim(), "1\tSTATEMENT");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let backend = MysqlBackend::open_url(&server.url()).await.expect("open");
        let first = req("stmt/a");
        let grant = backend.try_acquire(&first).await.expect("grant").expect("free key");
        let renewal = RenewRequest { key: first.key.clone(), token: first.token, ttl: first.ttl };
        assert_eq!(backend.renew(&[renewal]).await.expect("renew"), vec![true]);
        assert!(backend.try_acquire(&req("stmt/a")).await.expect("second").is_none(), "held");
        assert!(backend.release(&first.key, first.token).await.expect("release"));
        let again = backend.try_acquire(&req("stmt/a")).await.expect("again").expect("released");
        assert!(again.fence > grant.fence, "fences increase: {} then {}", grant.fence, again.fence);
    });
}
