//! MySQL/MariaDB shares beyond the conformance suite: what a read lock's
//! or a permit's cycle sends.
#![cfg(feature = "mysql")]

use std::time::Duration;

use holdfast::backend::{Backend, LeaseMode};
use holdfast::stores::mysql::MysqlBackend;
use holdfast::{Client, OwnerToken};
use holdfast_testkit::servers::mysql::{DATABASE, MysqlServer};

use crate::mysql::{client, req, rows, rt};

/// A read lock's or permit's cycle on a key nobody else holds or waits for
/// is two calls of the namespace's procedures, the grant and the release:
/// no transaction's statements, no statement for the lease row (which
/// found nothing for a share), no read of the share's row (the server's
/// `Questions`, the fewest a cycle over four batches of ten cycles, since
/// the client's sweep of expired rows runs once a second). Without the
/// procedures it is 12 (the next test); with the release's alone, 7. A
/// writer's release still frees the key.
#[test]
fn an_uncontended_share_cycle_is_two_calls() {
    let server = MysqlServer::start();
    rt().block_on(async {
        let c = client(&server.url(), "a").await;
        let ttl = Duration::from_secs(60);
        let rw = c.rwlock("cycle/read");
        let (reads, permits) = statements_a_cycle(&server, &c).await;
        assert!(reads <= 2.3 && permits <= 2.3, "statements a cycle: read lock {reads}, permit {permits}");
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

/// The fewest statements a read lock's and a permit's cycle sent to the
/// server over four batches of ten (its `Questions`; TTL 60 s, so that no
/// renewal runs; the status query itself is one question).
async fn statements_a_cycle(server: &MysqlServer, c: &Client) -> (f64, f64) {
    let questions = || -> f64 {
        let line = server.sql("SHOW GLOBAL STATUS LIKE 'Questions'");
        line.split_whitespace().last().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("Questions: {line:?}"))
    };
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
            *least = least.min((questions() - before - 1.0) / 10.0);
        }
    }
    let [reads, permits] = fewest;
    eprintln!("MySQL statements a cycle: read lock {reads:.2}, permit {permits:.2}");
    (reads, permits)
}

/// Where the procedures cannot be used, a share's grant and release are the
/// transactions they were: a user without `CREATE ROUTINE` or `EXECUTE`
/// (12 statements a cycle, and no procedure left behind), such a client and
/// one with the procedures sharing a key (the second read lock is granted
/// by the transaction, the writer waits for both read locks and is fenced
/// above both), and a client whose release procedure was dropped while it
/// ran (its next release falls back and frees the key, and it keeps the
/// transactions after).
#[test]
fn shares_keep_the_transactions_without_the_procedures() {
    let server = MysqlServer::start();
    server.sql(&format!(
        "CREATE USER 'plain'@'127.0.0.1' IDENTIFIED BY 'plain-pw'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON {DATABASE}.* TO 'plain'@'127.0.0.1';"
    ));
    let plain_url = format!("mysql://plain:plain-pw@127.0.0.1:{}/{DATABASE}", server.port());
    let procedures = || {
        let q = format!("SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = '{DATABASE}'");
        server.sql(&q).trim().parse::<u32>().expect("count")
    };
    rt().block_on(async {
        let plain = client(&plain_url, "plain").await;
        assert_eq!(procedures(), 0, "a user without CREATE ROUTINE left a procedure");
        let (reads, permits) = statements_a_cycle(&server, &plain).await;
        assert!(reads > 11.5 && permits > 11.5, "not the transaction: {reads}, {permits} statements a cycle");
        assert!(reads <= 12.3 && permits <= 12.3, "statements a cycle: read lock {reads}, permit {permits}");

        let owner = client(&server.url(), "owner").await;
        assert_eq!(procedures(), 2, "the owner's client did not create the procedures");
        // A key with a row, free: the owner's read lock is the procedure's.
        let mine = owner.rwlock("cycle/read").read().acquire().await.expect("owner's read (the procedure)");
        let theirs = plain.rwlock("cycle/read").read().acquire().await.expect("plain's read");
        let highest = mine.fence().max(theirs.fence());
        let writer = owner.rwlock("cycle/read").write();
        mine.release().await.expect("the owner's release (the procedure)");
        assert!(writer.try_acquire().await.expect("try").is_none(), "granted beside plain's read lock");
        theirs.release().await.expect("plain's release (the transaction)");
        let w = writer.try_acquire().await.expect("try").expect("the key is not free");
        assert!(w.fence() > highest, "the writer's fence {} is not above the read locks' {highest}", w.fence());
        w.release().await.expect("release");

        let held = owner.rwlock("dropped").read().acquire().await.expect("read");
        server.sql(&format!("DROP PROCEDURE {DATABASE}.holdfast_share_release1"));
        held.release().await.expect("a release after the procedure was dropped");
        let free = owner.rwlock("dropped").write().try_acquire().await.expect("try");
        assert!(free.is_some(), "the key is not free after the fallback release");
        let (reads, _) = statements_a_cycle(&server, &owner).await;
        assert!(reads > 11.5, "still calling a dropped procedure: {reads} statements a cycle");
    });
}

/// Clients of one application starting at once on a fresh database: each
/// finds the procedures missing and creates them, all but one are told
/// another client did it first, and every client uses them (2 statements
/// a lone read or permit cycle each, not the transactions' 12).
#[test]
fn clients_starting_at_once_all_use_the_procedures() {
    let server = MysqlServer::start();
    rt().block_on(async {
        let url = server.url();
        let (a, b, c, d) = tokio::join!(client(&url, "a"), client(&url, "b"), client(&url, "c"), client(&url, "d"));
        let q = format!("SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = '{DATABASE}'");
        assert_eq!(server.sql(&q).trim(), "2", "the namespace's procedures");
        for (name, c) in [("a", &a), ("b", &b), ("c", &c), ("d", &d)] {
            let (reads, permits) = statements_a_cycle(&server, c).await;
            assert!(reads <= 2.3 && permits <= 2.3, "client {name}: {reads}, {permits} statements a cycle");
        }
    });
}

/// A read lock or permit of a key that other shares hold, with room for it
/// and nobody waiting, is the same one call (the grant procedure finds room
/// beside them; before, only a key nobody held was, and this cycle ran the
/// transaction's 12 statements). The shares granted beside stay what the
/// transaction grants: fenced above the shares that held the key, no more
/// than the limit, a writer kept out until the last one goes and fenced
/// above them all, another limit a conflict.
#[test]
fn a_share_beside_held_shares_is_one_call() {
    let server = MysqlServer::start();
    rt().block_on(async {
        let (a, b) = (client(&server.url(), "a").await, client(&server.url(), "b").await);
        let ttl = Duration::from_secs(60);
        let held_read = b.rwlock("cycle/read").read().ttl(ttl).acquire().await.expect("b's read");
        let sem = b.semaphore("cycle/permit", 4).ttl(ttl);
        let (p1, p2) = (sem.acquire().await.expect("b's permit"), sem.acquire().await.expect("b's second permit"));
        let (reads, permits) = statements_a_cycle(&server, &a).await;
        assert!(reads <= 2.3 && permits <= 2.3, "beside held shares: read lock {reads}, permit {permits}");

        let mine = a.semaphore("cycle/permit", 4).ttl(ttl);
        let p3 = mine.acquire().await.expect("a's permit beside b's two");
        let below = p1.fence().max(p2.fence());
        assert!(p3.fence() > below, "fenced {} beside permits fenced up to {below}", p3.fence());
        let p4 = mine.acquire().await.expect("the fourth permit");
        assert!(mine.try_acquire().await.expect("try").is_none(), "a fifth permit of four granted");
        let other_limit = a.semaphore("cycle/permit", 5).try_acquire().await;
        assert!(other_limit.is_err(), "a permit of a semaphore of 5 beside one of 4: {other_limit:?}");
        let writer = a.rwlock("cycle/permit").write();
        for p in [p1, p2, p3] {
            p.release().await.expect("release");
            assert!(writer.try_acquire().await.expect("try").is_none(), "a writer granted beside a permit");
        }
        let top = p4.fence();
        p4.release().await.expect("the last permit's release");
        let w = writer.try_acquire().await.expect("try").expect("the key is not free after the last permit");
        assert!(w.fence() > top, "the writer's fence {} is not above the permits' {top}", w.fence());
        w.release().await.expect("release");
        held_read.release().await.expect("release");
    });
}
