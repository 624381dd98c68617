//! How ZooKeeper's errors become holdfast's: which are retryable (a dropped
//! connection, a failover, a busy server) and which are not.

use super::STORE;
use crate::vocabulary::error::Error;
use zookeeper_client as zk;

/// Maps a ZooKeeper client error: a lost connection or session, a timeout
/// or throttling is retryable.
pub(super) fn map_err(e: zk::Error) -> Error {
    use zk::Error as E;
    // `Custom` carries transport failures (a reset connection, a server
    // that stopped answering) to the requests that were in flight.
    let retryable = matches!(
        e,
        E::ConnectionLoss
            | E::Timeout
            | E::SessionExpired
            | E::SessionMoved
            | E::Throttled
            | E::NoHosts
            | E::ClientClosed
            | E::NotReadOnly
            | E::Custom(_)
    );
    Error::backend(STORE, retryable, e)
}
