//! The fault clauses of lost replies, F1 and F2 (for a mutex, and for a
//! permit, whose acquire and release take their own path on most stores):
//! a store applied the call but its reply was lost; the key must come free
//! within seconds, released by its token, not at its 30 s TTL.

use std::time::Duration;

use holdfast::{Client, Error};

use super::faults::{Ask, FREED_WITHIN, Held, Proxied, StatusProbe, TTL, free_within, freed, shared_target, target};
use super::{ProxyTarget, Store, client, fresh_key};

/// F1 (C9, lost reply): an acquire the store applied but whose reply was lost
/// is released by its token, so another client gets the key within seconds,
/// not after the 30 s TTL. For `try_acquire` and for a waiting
/// `acquire_timeout`; the call itself must fail within about the store's
/// operation timeout.
pub async fn f1_lost_acquire_reply(store: &Store) {
    let Some(target) = target(store, "f1_lost_acquire_reply") else { return };
    let b = client(store, "f1-b").await;
    let a = Proxied::start(target, "f1-a").await;
    let failures: Vec<String> = [
        acquire_with_replies_lost(&a, &b, Ask::Mutex, None).await,
        acquire_with_replies_lost(&a, &b, Ask::Mutex, Some(Duration::from_secs(1))).await,
    ]
    .into_iter()
    .filter_map(Result::err)
    .collect();
    assert!(failures.is_empty(), "acquire whose reply was lost, TTL 30 s: {}", failures.join("; "));
}

/// F1 for a permit (C12, C9): a shared acquire the store applied but whose
/// reply was lost (a permit of a semaphore of one) is released by its
/// token, so another client gets the key within seconds, not after the
/// 30 s TTL; for `try_acquire` and a waiting `acquire_timeout`. A shared
/// acquire takes its own path on most stores (PostgreSQL's function of
/// shared leases, Redis's admission script, the queue of shares on etcd
/// and ZooKeeper), so F1's mutex sweep does not cover it.
pub async fn f1_lost_shared_acquire_reply(store: &Store) {
    let Some(target) = shared_target(store, "f1_lost_shared_acquire_reply").await else { return };
    let b = client(store, "f1s-b").await;
    let a = Proxied::start(target, "f1s-a").await;
    let failures: Vec<String> = [
        acquire_with_replies_lost(&a, &b, Ask::Permit, None).await,
        acquire_with_replies_lost(&a, &b, Ask::Permit, Some(Duration::from_secs(1))).await,
    ]
    .into_iter()
    .filter_map(Result::err)
    .collect();
    assert!(failures.is_empty(), "acquire whose reply was lost, TTL 30 s: {}", failures.join("; "));
}

/// The most replies F1 lets through before losing the rest.
const MAX_REPLIES_LET_THROUGH: u64 = 8;

/// F1 for `try_acquire` (`wait` None) or `acquire_timeout(wait)`. The case
/// exists only if the store applied the acquire, which B watches for. An
/// acquire may take several round trips (a transaction, a read before a
/// create): losing every reply from the first one on leaves the change
/// unsent. So the proxy lets 0, 1, 2, ... replies through before losing the
/// rest, until the store shows the key held by an acquire that failed: the
/// reply of the step that applied it was lost.
async fn acquire_with_replies_lost(a: &Proxied, b: &Client, ask: Ask, wait: Option<Duration>) -> Result<(), String> {
    let call = wait.map_or("try_acquire".to_owned(), |w| format!("acquire_timeout({w:?})"));
    let what = match ask {
        Ask::Mutex => call,
        Ask::Permit => format!("a permit's {call}"),
    };
    // B's probe may miss the held window (about the op timeout) on a loaded
    // machine, and a sweep then finds nothing to test: sweep again.
    for _ in 0..SWEEPS {
        if let Some(outcome) = acquire_sweep(a, b, ask, wait, &what).await {
            return outcome;
        }
    }
    panic!("f1: {what}: no lost reply left the store holding the key for a failed acquire: nothing was tested");
}

/// Sweeps of F1 before it says nothing was tested.
const SWEEPS: usize = 3;

/// One sweep of F1 over the replies let through; `None` if no acquire was
/// seen applied with its reply lost.
async fn acquire_sweep(
    a: &Proxied,
    b: &Client,
    ask: Ask,
    wait: Option<Duration>,
    what: &str,
) -> Option<Result<(), String>> {
    for replies in 0..=MAX_REPLIES_LET_THROUGH {
        let key = fresh_key("f1");
        a.warm_up_for(Some(&key), ask).await;
        let probe = match ask {
            Ask::Mutex => StatusProbe::start(b, &key, |s| s.holder.is_some()),
            Ask::Permit => StatusProbe::start(b, &key, |s| !s.shared.is_empty()),
        };
        a.proxy.drop_replies_after(replies);
        let (mutex, semaphore) = (a.client.mutex(&key).ttl(TTL), a.client.semaphore(&key, 1).ttl(TTL));
        // Whether it was granted (the guard, dropped here, is lost with the proxy's cut).
        let call = async {
            match (ask, wait) {
                (Ask::Mutex, None) => mutex.try_acquire().await.map(|g| g.is_some()),
                (Ask::Mutex, Some(wait)) => mutex.acquire_timeout(wait).await.map(|_| true),
                (Ask::Permit, None) => semaphore.try_acquire().await.map(|p| p.is_some()),
                (Ask::Permit, Some(wait)) => semaphore.acquire_timeout(wait).await.map(|_| true),
            }
        };
        let budget = wait.unwrap_or_default() + a.op_timeout * 2;
        let outcome = a.bounded(&format!("{what} with its replies lost"), budget, call).await;
        let applied = probe.seen();
        a.heal();
        match outcome {
            Ok(false) => panic!("{what} said a free key was busy"),
            // Every reply it needed got through: no later step is left whose reply could be lost.
            Ok(true) => break,
            Err(_) if applied => {
                eprintln!("f1: {what}: applied by the store, its replies lost after the first {replies}");
                if free_within(b, &key, FREED_WITHIN).await {
                    return Some(Ok(()));
                }
                let lost = format!("replies lost after the first {replies}");
                return Some(Err(format!("{what} ({lost}): key still held by its token {FREED_WITHIN:?} later")));
            }
            Err(_) => {}
        }
    }
    None
}

/// F2 (C4, C9): a release the store applied but whose reply was lost freed
/// the key, and does not report [`Error::Lost`] for a lease that was alive
/// (`Ok` or a store error are both honest answers).
pub async fn f2_lost_release_reply(store: &Store) {
    let Some(target) = target(store, "f2_lost_release_reply") else { return };
    release_with_reply_lost(store, target, Ask::Mutex).await;
}

/// F2 for a permit (a semaphore of one): its release takes its own path on
/// most stores (on PostgreSQL the share's delete and then its key's gate).
pub async fn f2_lost_shared_release_reply(store: &Store) {
    let Some(target) = shared_target(store, "f2_lost_shared_release_reply").await else { return };
    release_with_reply_lost(store, target, Ask::Permit).await;
}

async fn release_with_reply_lost(store: &Store, target: &ProxyTarget, ask: Ask) {
    let b = client(store, "f2-b").await;
    let a = Proxied::start(target, "f2-a").await;
    let key = fresh_key("f2");
    a.warm_up_for(Some(&key), ask).await;
    let held = a.hold_as(&key, ask).await;
    let probe = match ask {
        Ask::Mutex => StatusProbe::start(&b, &key, |s| s.holder.is_none()),
        Ask::Permit => StatusProbe::start(&b, &key, |s| s.shared.is_empty()),
    };
    a.proxy.drop_replies();
    let release = async {
        match held {
            Held::Guard(g) => g.release().await,
            Held::Permit(p) => p.release().await,
        }
    };
    match a.bounded("release with its reply lost", a.op_timeout * 2, release).await {
        Ok(()) | Err(Error::Backend { .. }) => {}
        Err(e @ Error::Lost { .. }) => panic!("release of a live lease whose reply was lost said: {e}"),
        Err(e) => panic!("release with its reply lost: unexpected error {e:?}"),
    }
    // Either way the key must come free: applied, or (died unsent) retried.
    let applied = probe.seen();
    eprintln!("f2: the release {} applied while its replies were lost", if applied { "was" } else { "was not" });
    a.heal();
    freed(&b, &key, FREED_WITHIN, "after a release whose reply was lost").await;
}

/// F2 for a permit whose release's connection is cut part-way: the proxy
/// lets 0, 1, 2, ... reply chunks through and then closes the connection,
/// so every step of a release that takes several (PostgreSQL: the share's
/// delete, then its gate's shrink in a second call) is cut at some point.
/// Whatever the release answers, the key must come free for another client
/// within seconds of the network's return: a step that never ran is the
/// release's retry's to do, not the share's 30 s TTL's.
pub async fn f2_shared_release_cut_part_way(store: &Store) {
    let Some(target) = shared_target(store, "f2_shared_release_cut_part_way").await else { return };
    let b = client(store, "f2c-b").await;
    let a = Proxied::start(target, "f2c-a").await;
    let mut failures = Vec::new();
    for replies in 0..=MAX_REPLIES_LET_THROUGH {
        let key = fresh_key("f2c");
        a.warm_up_for(Some(&key), Ask::Permit).await;
        let Held::Permit(permit) = a.hold_as(&key, Ask::Permit).await else { unreachable!("a permit was asked for") };
        a.proxy.cut_after_replies(replies);
        match a.bounded("release with its connection cut", a.op_timeout * 2, permit.release()).await {
            Ok(()) | Err(Error::Backend { .. }) => {}
            Err(e) => panic!("release cut after {replies} replies: unexpected error {e:?}"),
        }
        a.heal();
        if !free_within(&b, &key, FREED_WITHIN).await {
            failures.push(format!("cut after {replies} replies: key still held {FREED_WITHIN:?} later"));
        }
    }
    assert!(failures.is_empty(), "a permit's release cut part-way, TTL 30 s: {}", failures.join("; "));
}
