//! `run` and `elect` without a command: hold the lock (lead) until SIGINT,
//! SIGTERM or SIGHUP, as `etcdctl lock NAME` and `etcdctl elect NAME VALUE`
//! do; then release it and exit 0. A lease lost meanwhile exits 74.

use holdfast::{Guard, GuardKind};

use super::{RELEASE_AFTER_LOSS, Signals, release};
use crate::exit::{Failure, LEASE_LOST, OK};

/// What the holder says on stdout once it holds the lock.
#[derive(Debug, Clone)]
pub(crate) enum Role {
    /// `run` without CMD: `holding "KEY" with fence F`.
    Lock,
    /// `elect`: asks for fair grants where the store queues; without CMD,
    /// `leading "NAME" in term T` (`as "VALUE"` when one was given).
    Leader {
        /// The published value, if given (else the client's default label).
        value: Option<String>,
    },
}

/// Holds `guard` until a signal (released, exit 0) or until its lease is lost (exit 74).
pub(super) async fn hold<K: GuardKind>(
    guard: Guard<K>,
    signals: &mut Signals,
    key: &str,
    role: &Role,
) -> Result<u8, Failure> {
    match role {
        Role::Lock => crate::say!("holding {key:?} with fence {}", guard.fence()),
        Role::Leader { value: Some(value) } => crate::say!("leading {key:?} in term {} as {value:?}", guard.fence()),
        Role::Leader { value: None } => crate::say!("leading {key:?} in term {}", guard.fence()),
    }
    tokio::select! {
        () = guard.lost() => {
            let why = guard.lost_reason().map(|r| format!(" ({r})")).unwrap_or_default();
            eprintln!("holdfast: lease on lock {key:?} lost{why}");
            let _ = tokio::time::timeout(RELEASE_AFTER_LOSS, guard.release()).await;
            Ok(LEASE_LOST)
        }
        signo = signals.recv() => {
            tracing::debug!(signo, "releasing on a signal");
            release(guard, key).await;
            Ok(OK)
        }
    }
}
