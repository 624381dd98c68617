//! Tests of the waiting policy's turn: retries, and shared waiters side by side.

use super::*;
use crate::vocabulary::key::{LockKey, OwnerToken};

/// A retry is not queued behind the local head: on etcd and ZooKeeper
/// its earlier entry may be ahead of the head's in the store's queue, so
/// waiting for the head's turn would deadlock the two. A first attempt
/// does wait for its turn.
#[tokio::test]
async fn a_retry_does_not_wait_for_the_turn() {
    let waiters = LocalWakeups::default().subscribe("k");
    let first = AcquireRequest::new(LockKey::new("k").expect("key"), OwnerToken::random(), Duration::from_secs(1));
    let head = take_turn(&waiters, &first, Lanes::One).await.expect("the free turn");
    let later = take_turn(&waiters, &first, Lanes::One);
    assert!(tokio::time::timeout(Duration::from_millis(50), later).await.is_err(), "a first attempt passed the head");
    let retry = AcquireRequest { retry: true, ..first.clone() };
    let skipped = tokio::time::timeout(Duration::from_millis(50), take_turn(&waiters, &retry, Lanes::One)).await;
    assert!(matches!(skipped, Ok(None)), "a retry waited for the head's turn");
    drop(head);
}

/// How many waiters of one key ask the store at once: shared ones side
/// by side, as many as their limit admits of their weight, with
/// [`Lanes::Shares`]; one otherwise, and always one for an exclusive
/// request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_ask_side_by_side_as_their_limit_admits_and_others_alone() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let cases = [
        (Lanes::Shares, LeaseMode::Shared { weight: 1, limit: 8 }, 8),
        (Lanes::Shares, LeaseMode::Shared { weight: 2, limit: 8 }, 4),
        (Lanes::Shares, LeaseMode::Shared { weight: 1, limit: 3 }, 2),
        (Lanes::Shares, LeaseMode::Shared { weight: 1, limit: crate::backend::UNLIMITED }, 8),
        (Lanes::Shares, LeaseMode::Exclusive, 1),
        (Lanes::Shares, LeaseMode::Writer, 1),
        (Lanes::One, LeaseMode::Shared { weight: 1, limit: 8 }, 1),
    ];
    for (lanes, mode, expected) in cases {
        let waiters = LocalWakeups::default().subscribe("k");
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let tasks: Vec<_> = (0..12)
            .map(|_| {
                let (waiters, now, most) = (waiters.clone(), now.clone(), most.clone());
                tokio::spawn(async move {
                    let req = AcquireRequest::new(
                        LockKey::new("k").expect("key"),
                        OwnerToken::random(),
                        Duration::from_secs(9),
                    )
                    .with_mode(mode);
                    let poll = PollBounds { min: Duration::from_millis(1), max: Duration::from_millis(1) };
                    until_granted(&waiters, &req, poll, lanes, || {
                        let (now, most) = (now.clone(), most.clone());
                        async move {
                            most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            now.fetch_sub(1, Ordering::SeqCst);
                            Ok(Attempt::Granted(Grant::new(
                                1,
                                tokio::time::Instant::now().into_std(),
                                Duration::from_secs(9),
                            )))
                        }
                    })
                    .await
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task").expect("granted");
        }
        assert_eq!(most.load(Ordering::SeqCst), expected, "{lanes:?} {mode:?}: attempts at once");
        assert!(!waiters.has_waiters(), "{lanes:?} {mode:?}: the turn was not given back");
    }
}

/// The turn of a store that queues waiters itself (etcd): shared waiters
/// hold it side by side with [`Lanes::Shares`], and an exclusive request
/// waits for all of them; with [`Lanes::One`] a shared waiter holds it alone.
#[tokio::test]
async fn a_queued_turn_takes_lanes_as_the_waiting_policy_does() {
    let key = LockKey::new("k").expect("key");
    let share = AcquireRequest::new(key.clone(), OwnerToken::random(), Duration::from_secs(1))
        .with_mode(LeaseMode::Shared { weight: 1, limit: 8 });
    let exclusive = AcquireRequest::new(key, OwnerToken::random(), Duration::from_secs(1));
    let waiters = LocalWakeups::default().subscribe("k");
    let mut held = Vec::new();
    for _ in 0..MAX_LANES {
        let turn = tokio::time::timeout(Duration::from_millis(50), take_turn(&waiters, &share, Lanes::Shares)).await;
        held.push(turn.expect("a share waited beside shares").expect("a turn"));
    }
    let ninth = tokio::time::timeout(Duration::from_millis(50), take_turn(&waiters, &share, Lanes::Shares)).await;
    assert!(ninth.is_err(), "more shares side by side than the lanes");
    held.pop();
    let excl = tokio::time::timeout(Duration::from_millis(50), take_turn(&waiters, &exclusive, Lanes::Shares)).await;
    assert!(excl.is_err(), "an exclusive request went beside shares");
    held.clear();
    let one = take_turn(&waiters, &share, Lanes::One).await.expect("the free turn");
    let beside = tokio::time::timeout(Duration::from_millis(50), take_turn(&waiters, &share, Lanes::One)).await;
    assert!(beside.is_err(), "two shares side by side with one lane");
    drop(one);
}
