//! How etcd's errors become holdfast's: which are retryable (a dropped
//! connection, a failover, a busy server) and which are not.

use super::STORE;
use crate::vocabulary::error::Error;

pub(super) fn is_retryable(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => true,
        // gRPC codes: 1 Cancelled, 2 Unknown, 4 DeadlineExceeded, 10 Aborted, 14 Unavailable.
        E::GRpcStatus(s) => matches!(s.code() as i32, 1 | 2 | 4 | 10 | 14) || s.message().contains("leader"),
        _ => false,
    }
}

/// Maps an etcd client error: transport trouble and the gRPC codes of a
/// busy or leaderless cluster are retryable.
pub(super) fn map_err(e: etcd_client::Error) -> Error {
    Error::backend(STORE, is_retryable(&e), e)
}

/// Whether etcd refused a request because the lease it names is gone
/// (revoked, or expired while this client could not tell).
pub(super) fn is_lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => s.message().contains("requested lease not found"),
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("lease not found"),
        _ => false,
    }
}
