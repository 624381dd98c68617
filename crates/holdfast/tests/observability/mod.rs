//! Metrics, spans and secrets, checked against real stores: the numbers
//! match what happened, spans nest under their callers, and no password
//! reaches a `Debug`, an error, a log line or a panic message.

#[path = "metrics.rs"]
mod metrics;
#[path = "secrets.rs"]
mod secrets;
#[path = "spans.rs"]
pub(crate) mod spans;

/// The span recorder sees what it should whatever other tests run beside
/// it (a span missed once made `spans_nest_and_carry_fields` fail).
#[test]
fn the_recorder_sees_spans_first_reached_on_a_thread_without_one() {
    spans::recorder_sees_spans_first_reached_elsewhere();
}

#[cfg(feature = "sqlite")]
mod sqlite {
    fn url(dir: &tempfile::TempDir) -> String {
        format!("sqlite://{}", dir.path().join("locks.db").display())
    }

    #[test]
    fn metrics_count_what_happened() {
        let dir = tempfile::tempdir().expect("tempdir");
        // No fallback poll within the test, as for Redis below: the
        // scenario's waiter must be granted after the release woke it.
        let url = format!("{}?poll_min_ms=20000&poll_max_ms=20000", url(&dir));
        super::metrics::scenario_counts_what_happened(&url, "sqlite");
    }

    #[test]
    fn deadline_losses_count_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        super::metrics::deadline_losses_count_once(&url(&dir), "sqlite");
    }

    #[test]
    fn no_recorder_is_fine() {
        let dir = tempfile::tempdir().expect("tempdir");
        super::metrics::no_recorder_is_fine(&url(&dir));
    }

    #[test]
    fn spans_nest_and_carry_fields() {
        let dir = tempfile::tempdir().expect("tempdir");
        super::spans::spans_nest_and_carry_fields(&url(&dir), "sqlite");
    }
}

#[cfg(feature = "redis")]
mod redis {
    use holdfast_testkit::servers::redis::RedisServer;

    use super::secrets::{PASSWORD, encode, failing, working};

    /// A Redis server that asks for `password`.
    fn with_password(password: &str) -> RedisServer {
        let server = RedisServer::start();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let mut c = redis::Client::open(server.url())
                .expect("client")
                .get_multiplexed_async_connection()
                .await
                .expect("connection");
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("requirepass")
                .arg(password)
                .query_async(&mut c)
                .await
                .expect("set password");
        });
        server
    }

    #[test]
    fn passwords_never_show_redis() {
        let server = with_password(PASSWORD);
        let port = server.port();
        let pw = encode(PASSWORD);
        working(&format!("redis://:{pw}@127.0.0.1:{port}"), &[PASSWORD]);
        failing(&format!("redis://default:{}@127.0.0.1:{port}", encode("Wrong-pw9")), &["Wrong-pw9", PASSWORD]);
        failing(&format!("redis://:{pw}@127.0.0.1:1"), &[PASSWORD]);
        failing(&format!("redis://:{pw}@no-such-host.invalid:6379"), &[PASSWORD]);
    }

    /// Sentinel and Cluster URLs: no sentinel or cluster listens (a plain
    /// server, or nothing), so every connect fails; none shows the password.
    #[test]
    fn passwords_never_show_sentinel_and_cluster_urls() {
        let server = RedisServer::start();
        let pw = encode(PASSWORD);
        for port in [server.port(), 1] {
            failing(&format!("redis+sentinel://u:{pw}@127.0.0.1:{port}/mymaster?timeout_ms=500"), &[PASSWORD]);
            failing(&format!("redis+cluster://u:{pw}@127.0.0.1:{port}?timeout_ms=500"), &[PASSWORD]);
        }
    }

    #[cfg(feature = "redlock")]
    #[test]
    fn passwords_never_show_redlock() {
        let servers: Vec<RedisServer> = (0..3).map(|_| with_password(PASSWORD)).collect();
        let hosts: Vec<String> = servers.iter().map(|s| format!("127.0.0.1:{}", s.port())).collect();
        let pw = encode(PASSWORD);
        working(&format!("redlock://:{pw}@{}", hosts.join(",")), &[PASSWORD]);
        failing(&format!("redlock://:{}@{}", encode("Wrong-pw9"), hosts.join(",")), &["Wrong-pw9", PASSWORD]);
        // Every member down: the client still builds (members are re-connected
        // in the background) and its calls fail retryably; neither the build
        // nor those errors nor the log may show the password.
        working(&format!("redlock://:{pw}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"), &[PASSWORD]);
    }

    #[test]
    fn metrics_count_what_happened() {
        let server = RedisServer::start();
        // No fallback poll within the test: the scenario's waiter must be
        // granted after the release's message (a hand-off), not by a poll
        // that a loaded machine lets reach the server just after the release.
        let url = format!("{}/?poll_min_ms=20000&poll_max_ms=20000", server.url());
        super::metrics::scenario_counts_what_happened(&url, "redis");
    }

    #[test]
    fn deadline_losses_count_once() {
        let server = RedisServer::start();
        super::metrics::deadline_losses_count_once(&server.url(), "redis");
    }

    #[test]
    fn spans_nest_and_carry_fields() {
        let server = RedisServer::start();
        super::spans::spans_nest_and_carry_fields(&server.url(), "redis");
    }
}

#[cfg(feature = "etcd")]
mod etcd {
    use holdfast_testkit::servers::etcd::EtcdTlsServer;

    use super::secrets::{PASSWORD, encode, failing, working};

    #[test]
    fn passwords_never_show_etcd() {
        let server = EtcdTlsServer::start();
        let url = server.url();
        let root = server.root_password.as_str();
        working(&url, &[root]);
        let wrong = url.replace(&encode(root), &encode(PASSWORD));
        assert_ne!(wrong, url);
        failing(&format!("{wrong}&connect_timeout_ms=2000"), &[PASSWORD, root]);
        failing(&format!("etcd://root:{}@127.0.0.1:1?connect_timeout_ms=1000", encode(PASSWORD)), &[PASSWORD]);
    }
}

#[cfg(feature = "zookeeper")]
mod zookeeper {
    use holdfast_testkit::servers::zookeeper::ZkServer;

    use super::secrets::{PASSWORD, encode, working};

    /// Digest auth: ZooKeeper takes any credentials at connect (they only
    /// matter to ACLs), so the password rides along a whole session.
    #[test]
    fn passwords_never_show_zookeeper() {
        let server = ZkServer::start();
        let url = server.url().replacen("zk://", &format!("zk://app:{}@", encode(PASSWORD)), 1);
        working(&url, &[PASSWORD]);
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use holdfast_testkit::servers::postgres::PostgresServer;

    use super::secrets::{PASSWORD, encode, failing, working};

    /// The test server trusts loopback, so a password is accepted and
    /// carried by every connection.
    #[test]
    fn passwords_never_show_postgres() {
        let server = PostgresServer::start();
        let pw = encode(PASSWORD);
        working(&server.url().replacen("postgres@", &format!("postgres:{pw}@"), 1), &[PASSWORD]);
        failing(
            &format!("postgres://postgres:{pw}@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2"),
            &[PASSWORD],
        );
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use holdfast_testkit::servers::mysql::{MysqlServer, PASSWORD as REAL};

    use super::secrets::{PASSWORD, encode, failing, working};

    #[test]
    fn passwords_never_show_mysql() {
        let server = MysqlServer::start();
        working(&server.url(), &[REAL]);
        let wrong = format!("mysql://holdfast:{}@127.0.0.1:{}/holdfast", encode(PASSWORD), server.port());
        failing(&wrong, &[PASSWORD, REAL]);
        failing(&format!("mysql://holdfast:{}@127.0.0.1:1/holdfast", encode(PASSWORD)), &[PASSWORD]);
    }
}
