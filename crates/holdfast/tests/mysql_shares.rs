//! MySQL/MariaDB shares beyond the conformance suite: what a read lock's
//! or a permit's cycle sends.
#![cfg(feature = "mysql")]

use std::time::Duration;

use holdfast::OwnerToken;
use holdfast::backend::{Backend, LeaseMode};
use holdfast::stores::mysql::MysqlBackend;
use holdfast_testkit::servers::mysql::MysqlServer;

use crate::mysql::{client, req, rows, rt};

/// A read lock's or permit's release goes to the shares' transaction
/// without the lease row's release statement first, which found nothing
/// for a share, and deletes a granted share without reading its row
/// first: two statements fewer a cycle (the server's `Questions`,
/// the fewest a cycle over three batches of ten cycles, since the client's
/// sweep of expired rows runs once a second; TTL 60 s so that no renewal
/// runs). A writer's release still frees the key.
#[test]
fn a_shares_release_sends_no_statement_for_the_lease_row() {
    let server = MysqlServer::start();
    let questions = || -> f64 {
        let line = server.sql("SHOW GLOBAL STATUS LIKE 'Questions'");
        line.split_whitespace().last().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("Questions: {line:?}"))
    };
    rt().block_on(async {
        let c = client(&server.url(), "a").await;
        let ttl = Duration::from_secs(60);
        let (rw, sem) = (c.rwlock("cycle/read"), c.semaphore("cycle/permit", 4).ttl(ttl));
        let mut fewest = [f64::MAX; 2];
        for _ in 0..4 {
            for (kind, least) in fewest.iter_mut().enumerate() {
                let before = questions();
                for _ in 0..10 {
                    if kind == 0 {
                        rw.read().ttl(ttl).acquire().await.expect("read").release().await.expect("release");
                    } else {
                        sem.acquire().await.expect("permit").release().await.expect("release");
                    }
                }
                // The status query itself is one question.
                *least = least.min((questions() - before - 1.0) / 10.0);
            }
        }
        let [reads, permits] = fewest;
        eprintln!("MySQL statements a cycle: read lock {reads:.2}, permit {permits:.2}");
        assert!(reads <= 12.3 && permits <= 12.3, "statements a cycle: read lock {reads}, permit {permits}");
        let w = rw.write().ttl(ttl).acquire().await.expect("write");
        w.release().await.expect("release the write lock");
        let other = client(&server.url(), "b").await;
        let free = other.rwlock("cycle/read").write().try_acquire().await.expect("try");
        assert!(free.is_some(), "the writer's release did not free the key");
        // A granted share that expired before its release (no renewal on
        // the store's own API): the delete that takes it as live finds
        // nothing, and the release reads the row as it did before: not
        // live, the row gone, the key free.
        let store = MysqlBackend::open_url(&server.url()).await.expect("open");
        let share = req("cycle/expired", OwnerToken::random(), Duration::from_millis(300))
            .with_mode(LeaseMode::Shared { weight: 1, limit: 4 });
        store.try_acquire(&share).await.expect("acquire").expect("granted");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!store.release(&share.key, share.token).await.expect("release"), "an expired share released as live");
        assert_eq!(rows(&server, "holdfast_shares"), 0, "the expired share's row is left");
        let writer = req("cycle/expired", OwnerToken::random(), Duration::from_secs(5)).with_mode(LeaseMode::Writer);
        assert!(store.try_acquire(&writer).await.expect("try").is_some(), "the key is not free");
    });
}
