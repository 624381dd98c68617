//! F6: a partition that heals. An attempt is abandoned while the network
//! between its client and the store is silent (its future dropped by the
//! caller's timeout, or its own deadline passed); the client's request, and
//! the cleanup's release of it, wait in the network meanwhile. Then the
//! partition heals without the connections being cut, as TCP heals one: the
//! bytes sent during it reach the store late, in whatever order the store
//! serves its connections. Whatever order that is, the abandoned attempt must
//! leave nothing behind once the network is back: not a grant until the TTL,
//! and not a key kept on a live session.

use std::time::Duration;

use super::faults::{Proxied, TTL, free_within, target};
use super::{Store, client, fresh_key, is_free};

/// How long the network stays silent, in store operation timeouts: every
/// call of the client (its attempt, the first tries of the cleanup's
/// release) has given up or been sent again by then.
const PARTITION_TIMEOUTS: u32 = 3;
/// How long after the partition healed the key is first looked at: the
/// bytes the partition held reach the store within milliseconds, so a key
/// free from then on was not taken again by a late request.
const SETTLED_AFTER: Duration = Duration::from_secs(1);
/// How soon, then, another client must get the key: the cleanup's release
/// is retried with a backoff of up to 2 s.
const FREE_WITHIN: Duration = Duration::from_secs(4);

/// How the attempt is abandoned.
#[derive(Debug, Clone, Copy)]
enum Abandon {
    /// `try_acquire` under the caller's `tokio::time::timeout`, dropped.
    Dropped,
    /// `acquire_timeout` whose deadline passes (the core's own cleanup).
    Deadline,
}

/// F6 (C9, C11): an attempt abandoned during a partition, delivered late
/// once the partition heals, leaves nothing behind within seconds (leases
/// here last 30 s), while its client lives on.
pub async fn f6_abandoned_attempt_delivered_late(store: &Store) {
    let Some(target) = target(store, "f6_abandoned_attempt_delivered_late") else { return };
    let b = client(store, "f6-b").await;
    let a = Proxied::start(target, "f6-a").await;
    let mut failures = Vec::new();
    for how in [Abandon::Dropped, Abandon::Deadline] {
        let key = fresh_key("f6");
        a.warm_up(Some(&key)).await;
        a.proxy.blackhole();
        let mutex = a.client.mutex(&key).ttl(TTL);
        let give_up = Duration::from_millis(200);
        match how {
            Abandon::Dropped => {
                if let Ok(outcome) = tokio::time::timeout(give_up, mutex.try_acquire()).await {
                    panic!("try_acquire answered through a silent network: {outcome:?}");
                }
            }
            Abandon::Deadline => {
                let outcome =
                    a.bounded("acquire_timeout in a partition", a.op_timeout * 2, mutex.acquire_timeout(give_up));
                if let Ok(guard) = outcome.await {
                    panic!("{how:?}: granted (fence {}) through a silent network", guard.fence());
                }
            }
        }
        // Meanwhile B takes the key and lets it go, before A's request
        // arrives (unless a part of the lock outside the partition already
        // shows A's attempt, as a layered lock's fast lease does).
        is_free(&b, &key).await;
        tokio::time::sleep(a.op_timeout * PARTITION_TIMEOUTS).await;
        a.proxy.forward();
        tokio::time::sleep(SETTLED_AFTER).await;
        if !free_within(&b, &key, FREE_WITHIN).await {
            failures.push(format!(
                "{how:?}: key still held {SETTLED_AFTER:?} + {FREE_WITHIN:?} after the partition healed"
            ));
        }
        a.heal();
    }
    assert!(
        failures.is_empty(),
        "an attempt abandoned in a partition of {PARTITION_TIMEOUTS} operation timeouts ({:?} each), delivered late, TTL {TTL:?}: {}",
        a.op_timeout,
        failures.join("; ")
    );
}
