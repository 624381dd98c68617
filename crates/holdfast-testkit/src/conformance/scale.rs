//! Scale clauses: what must stay true when many tasks wait on one key.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::Store;
use super::clauses::{client, fresh_key};

/// A hot key: 512 tasks over two clients loop acquire, yield, release on one
/// key for 8 s, and on until every task has acquired (at most 40 s: a store
/// whose hand-offs are slow on a loaded machine needs longer to serve 512,
/// one that starves a task never does). Every task acquires at least once
/// (barging may happen, starvation may not), never two at once, and within
/// each client the busiest task is at most about three times ahead of the
/// least busy: one process's waiters take turns.
///
/// Between the two clients no ratio is asserted: on a store that is not
/// fair, processes barge, and on a loaded machine one client's tasks got
/// up to 6.5x the other's (plain Redis 17..19 against 98..99 each, the
/// fallback chain 14..15 against 95..96, with three busy loops on 2
/// cores), while each client's own tasks stayed within 1-2 of each other.
/// Fair modes have their own clause (C7) and tests.
pub async fn s1_hot_key_every_waiter_acquires(store: &Store) {
    const TASKS: usize = 512;
    let run = Duration::from_secs(8);
    let clients = [client(store, "s1-a").await, client(store, "s1-b").await];
    let key = fresh_key("s1");
    let (inside, served) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let start = Instant::now();
    let (stop, limit) = (start + run, start + Duration::from_secs(40));
    let mut joins = Vec::new();
    for t in 0..TASKS {
        let c = clients[t % clients.len()].clone();
        let (key, inside, served) = (key.clone(), inside.clone(), served.clone());
        joins.push(tokio::spawn(async move {
            let (mut acquired, mut longest) = (0u64, Duration::ZERO);
            loop {
                let asked = Instant::now();
                let left = limit.saturating_duration_since(asked);
                match c.mutex(&key).acquire_timeout(left).await {
                    Ok(g) => {
                        longest = longest.max(asked.elapsed());
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders inside at once");
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        g.release().await.expect("release");
                        if acquired == 0 {
                            served.fetch_add(1, Ordering::SeqCst);
                        }
                        acquired += 1;
                    }
                    Err(holdfast::Error::Timeout { .. }) => {
                        longest = longest.max(asked.elapsed());
                        return (acquired, longest);
                    }
                    Err(e) => panic!("acquire failed: {e}"),
                }
                let all_served = served.load(Ordering::SeqCst) as usize == TASKS;
                if (Instant::now() >= stop && all_served) || Instant::now() >= limit {
                    return (acquired, longest);
                }
            }
        }));
    }
    let mut counts = Vec::with_capacity(TASKS);
    let mut longest = Duration::ZERO;
    for j in joins {
        let (n, l) = j.await.expect("task");
        counts.push(n);
        longest = longest.max(l);
    }
    let (total, took): (u64, Duration) = (counts.iter().sum(), start.elapsed());
    let never = counts.iter().filter(|&&n| n == 0).count();
    // Per client (task t ran on client t % 2): its tasks' fewest and most
    // acquisitions, and their sum.
    let per_client: Vec<(u64, u64, u64)> = (0..clients.len())
        .map(|c| {
            let mine = counts.iter().skip(c).step_by(clients.len());
            (mine.clone().min().copied().unwrap_or(0), mine.clone().max().copied().unwrap_or(0), mine.sum())
        })
        .collect();
    let shown: Vec<String> = per_client.iter().map(|(lo, hi, sum)| format!("{sum} in {lo}..{hi}")).collect();
    eprintln!(
        "s1: {total} acquisitions by {TASKS} tasks in {took:?}; per client {}; {never} never; longest wait {longest:?}",
        shown.join(", ")
    );
    assert_eq!(never, 0, "{never} of {TASKS} tasks never acquired in {took:?} ({total} acquisitions)");
    // Waiters of one process take turns: the busiest task is not many times
    // ahead of the least busy (before turns, 17 against 1 on Redis).
    for (c, (lo, hi, _)) in per_client.iter().enumerate() {
        assert!(*hi <= 3 * lo + 2, "client {c}'s tasks acquired {lo}..{hi} times: waiters were passed over");
    }
}

/// Queues `n` tasks of `client` on `key`, 10 ms apart, each acquiring (with
/// `ttl`), recording its index, and releasing. Returns the tasks and the
/// order in which they were granted, for store tests of how a client's
/// waiters queue.
pub async fn queue_tasks_in_order(
    client: &holdfast::Client,
    key: &str,
    ttl: Duration,
    n: usize,
) -> (Vec<tokio::task::JoinHandle<()>>, Arc<std::sync::Mutex<Vec<usize>>>) {
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (c, order, key) = (client.clone(), order.clone(), key.to_owned());
        tasks.push(tokio::spawn(async move {
            let g = c.mutex(key).ttl(ttl).acquire().await.expect("waiter");
            order.lock().expect("order").push(i);
            g.release().await.expect("release");
        }));
        // The order asked is the order the tasks reach the client's queue:
        // 2 ms apart, a task whose worker thread a loaded machine held up
        // was passed by the next (etcd, 2 runs in 16).
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (tasks, order)
}
