//! The SQL stores as a user with the least privileges the store needs (the
//! grants the stores' docs list), authenticated the way production servers
//! demand it: PostgreSQL with `scram-sha-256`, MariaDB with a password. Every
//! kind of lock works; a wrong password and a missing privilege are each a
//! non-retryable typed error that never shows the password.

use std::time::Duration;

use holdfast::{Client, ClientOptions, Error};
use holdfast_testkit::servers::mysql::MysqlServer;
use holdfast_testkit::servers::postgres::PostgresServer;
use tokio::task::block_in_place;

/// A password with characters a URL must percent-encode, planted so that any
/// output showing it is caught.
const PASSWORD: &str = "lp-PLANTED/pw@9:";
const PASSWORD_IN_URL: &str = "lp-PLANTED%2Fpw%409%3A";

async fn connect(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label))
        .await
        .unwrap_or_else(|e| panic!("connect {label}: {e}"))
}

/// Mutex (with a waiter woken by the release), semaphore and read-write lock
/// as `a` and `b`, both connected as the least-privileged user.
async fn every_kind_of_lock(a: &Client, b: &Client) {
    let g = a.mutex("lp/m").ttl(Duration::from_secs(2)).acquire().await.expect("acquire");
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let g = b.mutex("lp/m").acquire_timeout(Duration::from_secs(20)).await.expect("wait");
            let fence = g.fence();
            g.release().await.expect("release");
            fence
        })
    };
    assert_eq!(b.status("lp/m").await.expect("status").holder.map(|h| h.label), Some("lp-a".to_owned()));
    // Longer than the TTL: renewal runs as this user too.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!g.is_lost(), "renewal failed as the least-privileged user");
    let first = g.fence();
    g.release().await.expect("release");
    let second = tokio::time::timeout(Duration::from_secs(20), waiter).await.expect("waiter stuck").expect("task");
    assert!(second > first, "fences {first} then {second}");

    let permits = a.semaphore("lp/s", 2);
    let (p1, p2) = (permits.acquire().await.expect("permit"), permits.acquire().await.expect("permit"));
    assert!(b.semaphore("lp/s", 2).try_acquire().await.expect("try").is_none(), "a third permit of two");
    p1.release().await.expect("release");
    p2.release().await.expect("release");
    let r = a.rwlock("lp/rw").read().acquire().await.expect("read");
    let r2 = b.rwlock("lp/rw").read().try_acquire().await.expect("try").expect("readers share");
    assert!(a.rwlock("lp/rw").write().try_acquire().await.expect("try").is_none(), "a writer among readers");
    r.release().await.expect("release");
    r2.release().await.expect("release");
}

/// A typed, non-retryable error whose text and `Debug` never show the password.
fn refused(what: &str, outcome: holdfast::Result<Client>, expect: &str) {
    match outcome {
        Err(e @ Error::Backend { .. }) => {
            let text = format!("{e} {e:?}");
            assert!(!e.is_retryable(), "{what}: retryable: {text}");
            assert!(!text.contains("PLANTED"), "{what}: the error shows the password: {text}");
            assert!(text.to_lowercase().contains(expect), "{what}: {text} does not say {expect:?}");
        }
        other => panic!("{what}: expected a Backend error, got {:?}", other.map(|_| ())),
    }
}

/// PostgreSQL: a role that logs in with `scram-sha-256` and holds only
/// `USAGE` on the schema and `SELECT, INSERT, UPDATE, DELETE` on holdfast's
/// three tables, which an administrator created (`create=false`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_scram_user_with_least_privileges() {
    let server = PostgresServer::start();
    let psql = |sql: &str| block_in_place(|| server.psql(sql));
    // scram-sha-256 for the role over TCP, ahead of the testkit's trust lines.
    let hba = server.data_dir().join("pg_hba.conf");
    let rest = std::fs::read_to_string(&hba).expect("pg_hba.conf");
    std::fs::write(&hba, format!("host all locker 127.0.0.1/32 scram-sha-256\n{rest}")).expect("pg_hba.conf");
    psql("SET password_encryption = 'scram-sha-256'");
    psql(&format!("CREATE ROLE locker LOGIN PASSWORD '{PASSWORD}'"));
    psql("SELECT pg_reload_conf()");
    // The administrator creates the namespace (holdfast as the superuser).
    let admin_url = format!("{}&schema=locks", server.url());
    drop(connect(&admin_url, "admin").await);
    psql("GRANT USAGE ON SCHEMA locks TO locker");
    psql("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA locks TO locker");
    assert!(psql("SELECT rolpassword FROM pg_authid WHERE rolname = 'locker'").starts_with("SCRAM-SHA-256$"));

    let base = format!("postgres://locker:{PASSWORD_IN_URL}@127.0.0.1:{}/postgres", server.port());
    let url = format!("{base}?schema=locks&create=false");
    let (a, b) = (connect(&url, "lp-a").await, connect(&url, "lp-b").await);
    assert!(!format!("{a:?}").contains("PLANTED"), "Debug shows the password");
    every_kind_of_lock(&a, &b).await;
    let scram = psql(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = 'locker' AND client_addr IS NOT NULL \
         AND backend_type = 'client backend'",
    );
    assert_ne!(scram, "0", "no session of the role seen");
    // A namespace of an earlier version (no functions of shared leases) and
    // the role's clients with `create` left at its default: they may not
    // add the functions, and work without them (before: the connect failed).
    psql("DROP FUNCTION locks.holdfast_leases_gate; DROP FUNCTION locks.holdfast_leases_share");
    let default_create = format!("{base}?schema=locks");
    let (c, d) = (connect(&default_create, "lp-a").await, connect(&default_create, "lp-d").await);
    every_kind_of_lock(&c, &d).await;
    assert_eq!(psql("SELECT count(*) FROM pg_proc WHERE proname = 'holdfast_leases_share'"), "0");

    let wrong = url.replace(PASSWORD_IN_URL, "lp-PLANTED-wrong");
    refused("wrong password", Client::connect(&wrong).await, "password");
    // A missing privilege: the tables of another namespace, created by the
    // administrator, without grants to the role.
    drop(connect(&format!("{}&schema=other", server.url()), "admin").await);
    psql("GRANT USAGE ON SCHEMA other TO locker");
    let other = connect(&format!("{base}?schema=other&create=false"), "lp-c").await;
    match other.mutex("lp/m").try_acquire().await {
        Err(e @ Error::Backend { .. }) => {
            let text = format!("{e} {e:?}");
            assert!(!e.is_retryable(), "retryable: {text}");
            assert!(text.contains("permission denied"), "{text}");
            assert!(!text.contains("PLANTED"), "{text}");
        }
        other => panic!("no privileges on the tables: expected a Backend error, got {:?}", other.map(|_| ())),
    }
}

/// MariaDB: a user with `SELECT, INSERT, UPDATE, DELETE, CREATE` on its
/// database and nothing else. Without `CREATE` the first connect is refused
/// (holdfast creates its tables if missing, and MariaDB checks the privilege
/// even when they exist).
#[test]
fn mysql_user_with_least_privileges() {
    let server = MysqlServer::start();
    server.sql(&format!(
        "CREATE DATABASE lp; \
         CREATE USER 'locker'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON lp.* TO 'locker'@'127.0.0.1'; \
         CREATE DATABASE lp_no_create; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON lp_no_create.* TO 'locker'@'127.0.0.1';"
    ));
    let base = format!("mysql://locker:{PASSWORD_IN_URL}@127.0.0.1:{}", server.port());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime");
    rt.block_on(async {
        let url = format!("{base}/lp");
        let (a, b) = (connect(&url, "lp-a").await, connect(&url, "lp-b").await);
        assert!(!format!("{a:?}").contains("PLANTED"), "Debug shows the password");
        every_kind_of_lock(&a, &b).await;
        let wrong = url.replace(PASSWORD_IN_URL, "lp-PLANTED-wrong");
        refused("wrong password", Client::connect(&wrong).await, "access denied");
        refused("no CREATE privilege", Client::connect(&format!("{base}/lp_no_create")).await, "denied");
    });
}
