//! What the PostgreSQL test modules share: a client with a label, and psql.
#![cfg(feature = "postgres")]

use holdfast::{Client, ClientOptions};
use holdfast_testkit::servers::postgres::PostgresServer;
use tokio::task::block_in_place;

/// A client of `url` whose holders are labelled `label`.
pub(crate) async fn connect(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label))
        .await
        .unwrap_or_else(|e| panic!("connect {label}: {e}"))
}

/// `sql` run by psql as the superuser: its output, trimmed (panics on an error).
pub(crate) fn psql(server: &PostgresServer, sql: &str) -> String {
    block_in_place(|| server.psql(sql))
}
