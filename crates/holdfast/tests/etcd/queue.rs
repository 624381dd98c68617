//! The queue: fairness, status, renewal batching, cleanup, write and request counts.

use super::*;

/// Eight waiters on eight clients are granted in request order, with strictly
/// increasing fences; status counts the waiters and names the holder.
#[test]
fn fair_across_clients_and_status() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let holder = client(&url, "holder-label").await;
        let key = "fair/orders";
        let g = holder.mutex(key).ttl(Duration::from_secs(10)).acquire().await.expect("acquire");
        let order = Arc::new(StdMutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..8 {
            let c = client(&url, &format!("w{i}")).await;
            let order = order.clone();
            waiters.push(tokio::spawn(async move {
                let g = c.mutex(key).ttl(Duration::from_secs(10)).acquire().await.expect("waiter");
                order.lock().expect("order").push((i, g.fence()));
                g.release().await.expect("release");
            }));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let status = holder.status(key).await.expect("status");
        let h = status.holder.expect("a holder");
        assert_eq!(h.label, "holder-label");
        assert_eq!(h.fence, g.fence());
        assert!(h.ttl_left.is_some_and(|t| t > Duration::ZERO && t <= Duration::from_secs(10)), "{h:?}");
        assert_eq!(status.waiters, Some(8));
        g.release().await.expect("release");
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(30), w).await.expect("waiter stuck").expect("task");
        }
        let order = order.lock().expect("order").clone();
        assert_eq!(order.iter().map(|(i, _)| *i).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
        let mut last = 0;
        for (_, fence) in order {
            assert!(fence > last, "fences not increasing");
            last = fence;
        }
        let status = holder.status(key).await.expect("status");
        assert_eq!((status.holder, status.waiters), (None, Some(0)));
        assert!(holdfast_keys(&url).await.is_empty(), "keys left behind");
    });
}

/// A waiter that waited longer than its TTL holds a full TTL once granted
/// (the TTL runs from the read that found it first, not from the request).
#[test]
fn long_wait_then_full_lease() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let (a, b) = (client(&url, "a").await, client(&url, "b").await);
        let ttl = Duration::from_secs(1);
        let g = a.mutex("long-wait").ttl(ttl).acquire().await.expect("acquire");
        let waiter = tokio::spawn(async move { b.mutex("long-wait").ttl(ttl).acquire().await.map(|g| (g, b)) });
        tokio::time::sleep(ttl * 3).await;
        g.release().await.expect("release");
        let (g, b) = waiter.await.expect("task").expect("waiter granted");
        let lost = g.lost();
        tokio::select! {
            _ = lost => panic!("a granted waiter lost its lease"),
            _ = tokio::time::sleep(ttl * 3) => {}
        }
        assert!(a.mutex("long-wait").try_acquire().await.expect("try").is_none());
        g.release().await.expect("release");
        drop(b);
    });
}

/// Many locks on one client renew through their shared session lease; after
/// release, and after aborted waiters, nothing is left in etcd; a dropped
/// client revokes its leases.
#[test]
fn many_locks_renew_and_nothing_accumulates() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let a = client(&url, "a").await;
        let mut guards = Vec::new();
        for i in 0..50 {
            guards.push(a.mutex(format!("many/{i}")).ttl(Duration::from_secs(1)).acquire().await.expect("acquire"));
        }
        let member = &server.members[0];
        let keep_alives = || member.metric(&["grpc_server_msg_received_total", "grpc_method=\"LeaseKeepAlive\""]);
        let txns = || member.metric(&["grpc_server_handled_total", "grpc_method=\"Txn\""]);
        let (ka0, txn0) = (keep_alives(), txns());
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (ka, txn) = (keep_alives() - ka0, txns() - txn0);
        assert!(guards.iter().all(|g| !g.is_lost()), "a renewed lock was lost");
        // 50 locks renewed every 333 ms for 3 s: about 9 renewal ticks, each
        // one keep-alive message for all 50 (plus a background one per TTL/3),
        // and no request per lock.
        eprintln!("renewing 50 locks for 3 s: {ka} keep-alive messages, {txn} transactions");
        assert_eq!(txn, 0.0, "renewal sent transactions");
        assert!(ka <= 40.0, "{ka} keep-alive messages for 50 locks in 3 s: not batched");
        let b = client(&url, "b").await;
        assert!(b.mutex("many/7").try_acquire().await.expect("try").is_none());
        for _ in 0..10 {
            let r = b.mutex("many/7").acquire_timeout(Duration::from_millis(30)).await;
            assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        }
        for g in guards {
            g.release().await.expect("release");
        }
        holdfast_testkit::conformance::eventually("no keys left", Duration::from_secs(5), || async {
            holdfast_keys(&url).await.is_empty()
        })
        .await;
        let mut etcd = raw(&url).await;
        let before = etcd.leases().await.expect("leases").leases().len();
        assert!(before >= 2, "two clients, two session leases at least");
        drop(a);
        drop(b);
        holdfast_testkit::conformance::eventually("leases revoked on drop", Duration::from_secs(5), || {
            let mut etcd = etcd.clone();
            async move { etcd.leases().await.expect("leases").leases().is_empty() }
        })
        .await;
    });
}

/// An uncontended cycle is two writes to etcd (the queue put and the delete):
/// consecutive fences, which are etcd revisions, differ by exactly two.
#[test]
fn uncontended_cycle_is_two_writes() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let a = client(&url, "a").await;
        let m = a.mutex("two-writes").ttl(Duration::from_secs(30));
        assert_two_writes_a_cycle(|| async {
            let g = m.acquire().await.expect("acquire");
            let fence = g.fence();
            g.release().await.expect("release");
            fence
        })
        .await;
    });
}

/// An uncontended permit's cycle is two writes too: the share's put and its
/// delete. A share admitted with nobody behind it does not rewrite its key
/// (the mark that wakes a waiting share): it did on every grant, as etcd's
/// count of the keys created after it counted the share's own key.
#[test]
fn uncontended_share_cycle_is_two_writes() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let a = client(&url, "a").await;
        let sem = a.semaphore("two-writes-shared", 4).ttl(Duration::from_secs(30));
        assert_two_writes_a_cycle(|| async {
            let p = sem.acquire().await.expect("acquire");
            let fence = p.fence();
            p.release().await.expect("release");
            fence
        })
        .await;
    });
}

/// An uncontended share's cycle is two requests: the join, whose own read
/// shows the share alone in the queue, and the release; the join was
/// followed by a read of the queue ahead (three requests, against the raw
/// floor's two). For a permit and a read lock.
#[test]
fn uncontended_share_cycle_is_two_requests() {
    let server = EtcdCluster::start();
    let url = server.url();
    let member = &server.members[0];
    let requests = || member.metric(&["grpc_server_handled_total", "grpc_type=\"unary\""]);
    rt().block_on(async {
        let a = client(&url, "a").await;
        let sem = a.semaphore("two-requests-permit", 4).ttl(Duration::from_secs(30));
        let rw = a.rwlock("two-requests-read");
        // The session lease is granted by the first acquire.
        sem.acquire().await.expect("acquire").release().await.expect("release");
        let before = requests();
        for _ in 0..20 {
            sem.acquire().await.expect("acquire").release().await.expect("release");
            rw.read().ttl(Duration::from_secs(30)).acquire().await.expect("read").release().await.expect("release");
        }
        let per_cycle = (requests() - before) / 40.0;
        eprintln!("etcd requests per uncontended share cycle: {per_cycle:.2}");
        assert!(per_cycle <= 2.05, "an uncontended share cycle took {per_cycle:.2} requests");
    });
}

/// Runs 20 cycles (each answers its grant's fence, an etcd revision) and
/// asserts that consecutive fences differ by exactly two: two writes a cycle.
async fn assert_two_writes_a_cycle<F, Fut>(mut cycle: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    let mut fences = Vec::new();
    for _ in 0..20 {
        fences.push(cycle().await);
    }
    let gaps: Vec<u64> = fences.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|&g| g == 2), "writes per cycle: {gaps:?}");
}

/// A guard's release, whatever the guard's kind.
type Releasing = std::pin::Pin<Box<dyn std::future::Future<Output = holdfast::Result<()>> + Send>>;

/// Queues `n` waiters behind a holder, releases, and returns etcd requests
/// per hand-off until all are through. With `permits`, the lock is a
/// semaphore of that many permits, all held by the holder, and each waiter
/// asks for one.
async fn requests_per_handoff(
    url: &str,
    member: &holdfast_testkit::servers::etcd::EtcdMember,
    n: u64,
    permits: Option<u32>,
) -> f64 {
    let requests = || {
        member.metric(&["grpc_server_handled_total", "grpc_type=\"unary\""])
            + member.metric(&["grpc_server_msg_received_total", "grpc_method=\"Watch\""])
    };
    let key = format!("herd/{n}/{permits:?}");
    let holder = client(url, "holder").await;
    let ttl = Duration::from_secs(30);
    let release_held: Releasing = match permits {
        None => {
            let g = holder.mutex(&key).ttl(ttl).acquire().await.expect("acquire");
            Box::pin(g.release())
        }
        Some(p) => {
            let g = holder.semaphore(&key, p).ttl(ttl).acquire_many(p).await.expect("acquire");
            Box::pin(g.release())
        }
    };
    let mut waiters = Vec::new();
    for i in 0..n {
        let (c, key) = (client(url, &format!("w{i}")).await, key.clone());
        waiters.push(tokio::spawn(async move {
            let release: Releasing = match permits {
                None => Box::pin(c.mutex(&key).ttl(ttl).acquire().await.expect("waiter").release()),
                Some(p) => Box::pin(c.semaphore(&key, p).ttl(ttl).acquire().await.expect("waiter").release()),
            };
            tokio::time::sleep(Duration::from_millis(10)).await;
            release.await.expect("release");
        }));
    }
    holdfast_testkit::conformance::eventually("all queued", Duration::from_secs(10), || async {
        holder.status(&key).await.expect("status").waiters == Some(n)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = requests();
    release_held.await.expect("release");
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(30), w).await.expect("stuck").expect("task");
    }
    (requests() - before) / n as f64
}

/// No herd: each hand-off costs the same few requests with 4 or 24 waiters
/// queued: the releaser's delete and the cancel of its key's watcher, the
/// next waiter's position read (and here, where every waiter is a client of
/// its own that ends after its release, that client's lease revoke); a herd
/// would cost a read per queued waiter. Counted by etcd's metrics.
#[test]
fn herd_free_handoffs() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let few = requests_per_handoff(&url, &server.members[0], 4, None).await;
        let many = requests_per_handoff(&url, &server.members[0], 24, None).await;
        eprintln!("etcd requests per hand-off: {few:.2} with 4 waiters, {many:.2} with 24");
        assert!(many <= 5.0 && many <= few * 1.3 + 0.5, "hand-off cost grows with the queue: {few} -> {many}");
    });
}

/// No herd for permits either: a release wakes the first waiting share,
/// and each share admitted wakes the one behind it (it marks its key), so
/// requests per grant stay flat from 4 to 24 waiting shares; when every
/// waiter watched the whole queue, each release cost a read and a new watch
/// per waiter.
#[test]
fn herd_free_permit_handoffs() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let few = requests_per_handoff(&url, &server.members[0], 4, Some(2)).await;
        let many = requests_per_handoff(&url, &server.members[0], 24, Some(2)).await;
        eprintln!("etcd requests per permit grant: {few:.2} with 4 waiters, {many:.2} with 24");
        assert!(many <= 8.0 && many <= few * 1.3 + 0.5, "grant cost grows with the queue: {few} -> {many}");
    });
}

/// One client's waiters take turns: however many of its tasks wait on a key,
/// the lock's queue in etcd holds the holder's key and one waiter's, so the
/// sorted range a hand-off reads does not grow with them (each of 64 tasks
/// put a key of its own before, and every hand-off read all of them). The
/// tasks are still granted one at a time in the order they asked.
#[test]
fn one_queued_key_per_client() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let (holder, waiting) = (client(&url, "holder").await, client(&url, "waiting").await);
        let (key, ttl) = ("turns", Duration::from_secs(10));
        let g = holder.mutex(key).ttl(ttl).acquire().await.expect("acquire");
        let (waiters, order) = holdfast_testkit::conformance::queue_tasks_in_order(&waiting, key, ttl, 64).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let queued = queue_of(&url, key).await;
        assert_eq!(queued.len(), 2, "the holder and one waiter of the client");
        g.release().await.expect("release");
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(30), w).await.expect("waiter stuck").expect("task");
        }
        assert_eq!(*order.lock().expect("order"), (0..64).collect::<Vec<_>>());
        assert!(queue_of(&url, key).await.is_empty(), "keys left behind");
    });
}
