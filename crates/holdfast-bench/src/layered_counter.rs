//! The authoritative server's own count of the work it did, for
//! [`run_layered`](crate::run_layered): PostgreSQL's transactions, ZooKeeper's
//! packets received.

use std::time::Duration;

use holdfast::{Error, Result};

/// A server-side counter read on a connection of its own.
pub(crate) enum ServerCounter {
    /// `xact_commit + xact_rollback` of the database in `pg_stat_database`.
    #[cfg(feature = "postgres")]
    Postgres(tokio_postgres::Client),
    /// `zk_packets_received` of `mntr` on this address.
    ZooKeeper(String),
}

fn bench_error(e: impl std::fmt::Display) -> Error {
    Error::backend("holdfast-bench", false, e.to_string())
}

impl ServerCounter {
    /// The counter of the store `url` names, or `None` if it has none here.
    pub(crate) async fn connect(url: &str) -> Result<Option<Self>> {
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase()).unwrap_or_default();
        match scheme.as_str() {
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => {
                let cfg = holdfast::stores::postgres::PostgresConfig::from_url(url)?;
                let (client, connection) =
                    cfg.connection_config().connect(tokio_postgres::NoTls).await.map_err(bench_error)?;
                tokio::spawn(connection);
                Ok(Some(ServerCounter::Postgres(client)))
            }
            "zk" => {
                let rest = url.split_once("://").map(|(_, r)| r).unwrap_or_default();
                let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
                let host = rest.split([',', '/', '?']).next().unwrap_or_default();
                Ok(Some(ServerCounter::ZooKeeper(host.to_owned())))
            }
            _ => Ok(None),
        }
    }

    /// What is counted.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            ServerCounter::Postgres(_) => "PostgreSQL transactions (pg_stat_database xact_commit + xact_rollback)",
            ServerCounter::ZooKeeper(_) => "ZooKeeper packets received (mntr zk_packets_received)",
        }
    }

    /// The count now.
    pub(crate) async fn snapshot(&self) -> Result<u64> {
        match self {
            #[cfg(feature = "postgres")]
            ServerCounter::Postgres(client) => {
                let row = client
                    .query_one(
                        "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database \
                         WHERE datname = current_database()",
                        &[],
                    )
                    .await
                    .map_err(bench_error)?;
                // This query's own transaction is not the clients' work.
                Ok(row.try_get::<_, i64>(0).map_err(bench_error)?.max(0) as u64)
            }
            ServerCounter::ZooKeeper(addr) => {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut s = tokio::net::TcpStream::connect(addr.as_str()).await.map_err(bench_error)?;
                s.write_all(b"mntr").await.map_err(bench_error)?;
                let mut out = String::new();
                s.read_to_string(&mut out).await.map_err(bench_error)?;
                out.lines()
                    .find_map(|l| l.strip_prefix("zk_packets_received"))
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or_else(|| {
                        bench_error(format!("no zk_packets_received in mntr (is mntr whitelisted?): {out:?}"))
                    })
            }
        }
    }

    /// Waits until the counts of the clients that just disconnected are in:
    /// on PostgreSQL, a backend flushes its statistics when it exits.
    pub(crate) async fn settle(&self) -> Result<()> {
        match self {
            #[cfg(feature = "postgres")]
            ServerCounter::Postgres(client) => {
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                loop {
                    let row = client
                        .query_one(
                            "SELECT count(*) FROM pg_stat_activity \
                             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() \
                             AND datname = current_database()",
                            &[],
                        )
                        .await
                        .map_err(bench_error)?;
                    if row.try_get::<_, i64>(0).map_err(bench_error)? == 0 {
                        return Ok(());
                    }
                    if std::time::Instant::now() >= deadline {
                        return Err(bench_error("the bench's PostgreSQL clients did not disconnect within 20 s"));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            ServerCounter::ZooKeeper(_) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                Ok(())
            }
        }
    }
}
