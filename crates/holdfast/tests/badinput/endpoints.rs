//! Store errors a user can act on: one line naming the store and the
//! endpoint (`127.0.0.1:PORT`, or the file), the cause in plain words and
//! what to do, never a client library's debug dump or a password. One test
//! per store, against real servers: a port nothing listens on, a wrong or
//! missing password, a database that does not exist, and (Redis) a port
//! where something else answers.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use holdfast::{Client, Error};

/// A password planted so that any output showing it is caught.
const PASSWORD: &str = "ep-PLANTED-pw";

/// Text a user must never see in a store error.
const DUMPS: &[&str] = &["Os {", "tonic::", "Error(", "Input/output error: Input/output error", "\n"];

/// A loopback port nothing listens on, for the rest of the process (a
/// port let go after binding could be taken by a fault proxy another test
/// starts, and then the "refused" store would answer).
fn free_port() -> u16 {
    holdfast_testkit::servers::closed_port()
}

/// The first error a client of `url` meets: connecting, or (a store that
/// dials lazily) its first call.
async fn first_error(url: &str) -> Error {
    let client = match Client::connect(url).await {
        Err(e) => return e,
        Ok(client) => client,
    };
    match client.mutex("ep/k").try_acquire().await {
        Err(e) => e,
        Ok(g) => panic!("{url}: expected an error, got a grant: {:?}", g.map(|g| g.fence())),
    }
}

/// `err` is a store error naming `store` at `endpoint`, saying every one of
/// `words` (lower case), on one line without a dump or the password.
fn assert_plain(err: &Error, store: &str, endpoint: &str, words: &[&str]) -> String {
    let text = err.to_string();
    assert!(matches!(err, Error::Backend { .. }), "not a store error: {err:?}");
    assert!(text.starts_with(&format!("{store} at {endpoint}: ")), "must start with the store and endpoint: {text}");
    for w in words {
        assert!(text.to_lowercase().contains(w), "must say {w:?}: {text}");
    }
    for d in DUMPS {
        assert!(!text.contains(d), "shows {d:?}: {text}");
    }
    assert!(!format!("{text} {err:?}").contains(PASSWORD), "shows the password: {text} {err:?}");
    eprintln!("{text}");
    text
}

/// A listener on a free port that answers every connection like an HTTP
/// server refusing the request.
fn http_listener() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
            });
        }
    });
    port
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_names_the_endpoint() {
    let port = free_port();
    let url = format!("etcd://127.0.0.1:{port}?timeout_ms=2000&connect_timeout_ms=500");
    let err = first_error(&url).await;
    assert!(err.is_retryable(), "{err:?}");
    assert_plain(&err, "etcd", &format!("127.0.0.1:{port}"), &["connection refused", "is etcd running"]);
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_names_the_endpoint() {
    let port = free_port();
    let err = first_error(&format!("redis://127.0.0.1:{port}?connect_timeout_ms=500")).await;
    assert!(err.is_retryable(), "{err:?}");
    assert_plain(&err, "redis", &format!("127.0.0.1:{port}"), &["connection refused", "is redis running"]);

    let http = http_listener();
    let err = first_error(&format!("redis://127.0.0.1:{http}?connect_timeout_ms=500&timeout_ms=1000")).await;
    assert_plain(&err, "redis", &format!("127.0.0.1:{http}"), &["does not speak the redis protocol", "right port"]);

    let server = holdfast_testkit::servers::redis::RedisServer::start();
    let mut admin = redis::Client::open(server.url()).expect("url").get_connection().expect("connect");
    let _: () = redis::cmd("CONFIG").arg("SET").arg("requirepass").arg(PASSWORD).query(&mut admin).expect("set");
    let at = format!("127.0.0.1:{}", server.port());
    let err = first_error(&format!("redis://{at}")).await;
    assert!(!err.is_retryable(), "{err:?}");
    assert_plain(&err, "redis", &at, &["authentication required", "password in the url"]);
    let err = first_error(&format!("redis://:{PASSWORD}-wrong@{at}")).await;
    assert!(!err.is_retryable(), "{err:?}");
    assert_plain(&err, "redis", &at, &["authentication failed", "check the user and password"]);
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_names_the_endpoint() {
    let port = free_port();
    let err = first_error(&format!("postgres://u@127.0.0.1:{port}/db?connect_timeout_ms=500")).await;
    assert!(err.is_retryable(), "{err:?}");
    assert_plain(&err, "postgres", &format!("127.0.0.1:{port}"), &["connection refused", "is postgres running"]);

    let server = holdfast_testkit::servers::postgres::PostgresServer::start();
    let hba = server.data_dir().join("pg_hba.conf");
    let rest = std::fs::read_to_string(&hba).expect("pg_hba.conf");
    std::fs::write(&hba, format!("host all bob 127.0.0.1/32 scram-sha-256\n{rest}")).expect("pg_hba.conf");
    let psql = |sql: &str| tokio::task::block_in_place(|| server.psql(sql));
    psql("CREATE ROLE bob LOGIN PASSWORD 'right-one'");
    psql("SELECT pg_reload_conf()");
    let at = format!("127.0.0.1:{}", server.port());
    let err = first_error(&format!("postgres://bob:{PASSWORD}@{at}/postgres")).await;
    assert!(!err.is_retryable(), "{err:?}");
    assert_plain(&err, "postgres", &at, &["password authentication failed for user \"bob\"", "check the user"]);
    let err = first_error(&format!("postgres://postgres@{at}/nosuchdb")).await;
    assert!(!err.is_retryable(), "{err:?}");
    assert_plain(&err, "postgres", &at, &["database \"nosuchdb\" does not exist", "create it"]);
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_names_the_endpoint() {
    let port = free_port();
    let err = first_error(&format!("mysql://root@127.0.0.1:{port}/db?timeout_ms=1000")).await;
    assert!(err.is_retryable(), "{err:?}");
    assert_plain(&err, "mysql", &format!("127.0.0.1:{port}"), &["connection refused", "is mysql running"]);

    let server = tokio::task::block_in_place(holdfast_testkit::servers::mysql::MysqlServer::start);
    tokio::task::block_in_place(|| {
        server.sql(
            "CREATE DATABASE ep; CREATE USER 'bob'@'127.0.0.1' IDENTIFIED BY 'right-one'; \
                    GRANT ALL ON ep.* TO 'bob'@'127.0.0.1';",
        )
    });
    let at = format!("127.0.0.1:{}", server.port());
    let err = first_error(&format!("mysql://bob:{PASSWORD}@{at}/ep")).await;
    assert!(!err.is_retryable(), "{err:?}");
    assert_plain(&err, "mysql", &at, &["access denied for user 'bob'", "check the user and password"]);
    let err = first_error(&format!("mysql://root@{at}/nosuchdb")).await;
    assert!(!err.is_retryable(), "{err:?}");
    assert_plain(&err, "mysql", &at, &["unknown database 'nosuchdb'", "create it"]);
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_names_the_endpoint() {
    let (a, b) = (free_port(), free_port());
    let err = first_error(&format!("zk://127.0.0.1:{a},127.0.0.1:{b}?timeout_ms=1000")).await;
    assert!(err.is_retryable(), "{err:?}");
    assert_plain(&err, "zookeeper", &format!("127.0.0.1:{a},127.0.0.1:{b}"), &["no server answered", "running"]);
    // The long scheme names the same store.
    let err = first_error(&format!("zookeeper://127.0.0.1:{a}?timeout_ms=1000")).await;
    assert_plain(&err, "zookeeper", &format!("127.0.0.1:{a}"), &["no server answered"]);
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_names_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("missing-dir").join("locks.db");
    let err = first_error(&format!("sqlite://{}", path.display())).await;
    assert!(!err.is_retryable(), "{err:?}");
    assert_plain(&err, "sqlite", &path.display().to_string(), &["directory", "does not exist", "create it"]);
}

/// A password with `/` left unencoded: the error says to encode it.
#[tokio::test]
async fn unencoded_slash_in_a_password_is_explained() {
    let err = first_error(&format!("redis://:a/b{PASSWORD}@127.0.0.1:{}", free_port())).await;
    let text = err.to_string();
    assert!(text.contains("%2F"), "must say to percent-encode '/': {text}");
    assert!(!text.contains(PASSWORD), "{text}");
}
