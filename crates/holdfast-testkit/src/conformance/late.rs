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

use super::faults::{Ask, Proxied, TTL, free_within, target};
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
/// here last 30 s), while its client lives on: a mutex's, and a permit's
/// (a semaphore of one, whose acquire takes its own path on most stores)
/// where the store has shared leases.
pub async fn f6_abandoned_attempt_delivered_late(store: &Store) {
    let Some(target) = target(store, "f6_abandoned_attempt_delivered_late") else { return };
    let b = client(store, "f6-b").await;
    let a = Proxied::start(target, "f6-a").await;
    let asks: &[Ask] = if a.client.capabilities().shared_leases { &[Ask::Mutex, Ask::Permit] } else { &[Ask::Mutex] };
    let mut failures = Vec::new();
    for &ask in asks {
        for how in [Abandon::Dropped, Abandon::Deadline] {
            let key = fresh_key("f6");
            a.warm_up_for(Some(&key), ask).await;
            a.proxy.blackhole();
            abandon(&a, &key, ask, how).await;
            // Meanwhile B takes the key and lets it go, before A's request
            // arrives (unless a part of the lock outside the partition
            // already shows A's attempt, as a layered lock's fast lease does).
            is_free(&b, &key).await;
            tokio::time::sleep(a.op_timeout * PARTITION_TIMEOUTS).await;
            a.proxy.forward();
            tokio::time::sleep(SETTLED_AFTER).await;
            if !free_within(&b, &key, FREE_WITHIN).await {
                failures.push(format!(
                    "{ask:?}, {how:?}: key still held {SETTLED_AFTER:?} + {FREE_WITHIN:?} after the partition healed"
                ));
            }
            a.heal();
        }
    }
    assert!(
        failures.is_empty(),
        "an attempt abandoned in a partition of {PARTITION_TIMEOUTS} operation timeouts ({:?} each), delivered late, TTL {TTL:?}: {}",
        a.op_timeout,
        failures.join("; ")
    );
}

/// Starts `ask` on `key` through the silent network and gives it up `how`.
async fn abandon(a: &Proxied, key: &str, ask: Ask, how: Abandon) {
    let give_up = Duration::from_millis(200);
    let budget = a.op_timeout * 2;
    let answered = match (ask, how) {
        (Ask::Mutex, Abandon::Dropped) => tokio::time::timeout(give_up, a.client.mutex(key).ttl(TTL).try_acquire())
            .await
            .map(|r| r.map(|g| g.map(|g| g.fence())))
            .ok(),
        (Ask::Permit, Abandon::Dropped) => {
            let semaphore = a.client.semaphore(key, 1).ttl(TTL);
            tokio::time::timeout(give_up, semaphore.try_acquire()).await.map(|r| r.map(|p| p.map(|p| p.fence()))).ok()
        }
        (Ask::Mutex, Abandon::Deadline) => {
            let mutex = a.client.mutex(key).ttl(TTL);
            let waited = mutex.acquire_timeout(give_up);
            a.bounded("acquire_timeout in a partition", budget, waited).await.ok().map(|g| Ok(Some(g.fence())))
        }
        (Ask::Permit, Abandon::Deadline) => {
            let semaphore = a.client.semaphore(key, 1).ttl(TTL);
            let waited = semaphore.acquire_timeout(give_up);
            a.bounded("a permit's acquire_timeout in a partition", budget, waited)
                .await
                .ok()
                .map(|p| Ok(Some(p.fence())))
        }
    };
    match answered {
        None => {}
        Some(Ok(Some(fence))) => panic!("{ask:?}, {how:?}: granted (fence {fence}) through a silent network"),
        Some(outcome) => panic!("{ask:?}, {how:?}: answered through a silent network: {outcome:?}"),
    }
}
