//! Metrics, spans and secrets, checked against real stores: the numbers
//! match what happened, spans nest under their callers, and no password
//! reaches a `Debug`, an error, a log line or a panic message.

#[path = "metrics.rs"]
mod metrics;
#[path = "spans.rs"]
mod spans;

#[cfg(feature = "sqlite")]
mod sqlite {
    fn url(dir: &tempfile::TempDir) -> String {
        format!("sqlite://{}", dir.path().join("locks.db").display())
    }

    #[test]
    fn metrics_count_what_happened() {
        let dir = tempfile::tempdir().expect("tempdir");
        super::metrics::scenario_counts_what_happened(&url(&dir), "sqlite");
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

    #[test]
    fn metrics_count_what_happened() {
        let server = RedisServer::start();
        super::metrics::scenario_counts_what_happened(&server.url(), "redis");
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
