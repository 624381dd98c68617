//! MySQL/MariaDB: the work that keeps the lease table small must never stand
//! in the way of renewal.
#![cfg(feature = "mysql")]

use std::time::{Duration, Instant};

use holdfast::backend::{AcquireRequest, Backend};
use holdfast::stores::mysql::MysqlBackend;
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::servers::mysql::{DATABASE, MysqlServer};
use mysql_async::prelude::Queryable;

fn sweeps_running(server: &MysqlServer) -> u64 {
    let sql = "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
               WHERE INFO NOT LIKE '%PROCESSLIST%' \
               AND (INFO LIKE '%ORDER BY lock_key LIMIT%' OR INFO LIKE '%AND live_until < UTC%')";
    server.sql(sql).trim().parse().expect("count")
}

/// Releases sweep rows of holders gone for over a minute. A sweep used to be
/// one `DELETE ... WHERE expires_at < ... LIMIT 32`, started in the
/// background by every 64th release and never awaited: its range over the
/// expiry index locked the entry of the oldest live lease, the next one that
/// renewal extends, so sweeps waited on renewal, renewal on them, and they
/// piled up. With 100,000 leases held, releasing them all failed 82,491
/// releases (12,667 leases lost, the rest timed out) and ran the server out
/// of connections.
///
/// Here a transaction that has just extended the live lease (what a renewal
/// does) keeps its locks while the client releases other keys. Must hold: a
/// sweep neither waits for it nor piles up, and still deletes old rows.
#[test]
fn sweeps_never_wait_on_a_live_lease() {
    let server = MysqlServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let backend = MysqlBackend::open_url(&server.url_with("timeout_ms=1000")).await.expect("open");
        let ttl = Duration::from_secs(30);
        let acquire = |key: &str, token| {
            let req = AcquireRequest::new(LockKey::new(key).expect("key"), token, ttl).with_label("sweep");
            let backend = backend.clone();
            async move { backend.try_acquire(&req).await.expect("acquire").expect("free") }
        };
        acquire("live", OwnerToken::random()).await;
        server.sql(&format!(
            "INSERT INTO {DATABASE}.holdfast_leases VALUES ('gone', REPEAT('x', 16), 1, 'gone', UTC_TIMESTAMP(6) - INTERVAL 2 MINUTE, NULL)"
        ));

        let mut renewing = mysql_async::Conn::from_url(server.url()).await.expect("side connection");
        renewing.query_drop("BEGIN").await.expect("begin");
        renewing
            .query_drop(format!(
                "UPDATE {DATABASE}.holdfast_leases SET live_until = live_until + INTERVAL 1 SECOND WHERE lock_key = 'live'"
            ))
            .await
            .expect("extend");

        let start = Instant::now();
        let swept = backend.sweep_expired().await;
        let took = start.elapsed();
        assert!(matches!(swept, Ok(1)), "the sweep must delete the old row: {swept:?} after {took:?}");
        assert!(took < Duration::from_millis(500), "the sweep waited {took:?} on a live lease");

        // Releases start sweeps of their own (in the background).
        let mut most = 0;
        for i in 0..400 {
            let (key, token) = (format!("other/{i}"), OwnerToken::random());
            acquire(&key, token).await;
            assert!(backend.release(&LockKey::new(&key).expect("key"), token).await.expect("release"));
            if i % 50 == 49 {
                most = most.max(tokio::task::block_in_place(|| sweeps_running(&server)));
            }
        }
        renewing.query_drop("ROLLBACK").await.expect("rollback");
        assert_eq!(most, 0, "sweeps stood waiting on the server");
    });
}
