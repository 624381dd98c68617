//! Grants in request order: across clients, and across the wrap of the
//! lock parent's sequence counter.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holdfast::Client;
use tokio::task::JoinHandle;

use holdfast::stores::zookeeper::ZkBackend;
use holdfast_testkit::servers::zookeeper::{ZkServer, requests_received, watches_by_path};

use super::{client, raw, runtime};

/// Grants follow request order across several clients (each its own
/// session); `status` counts the waiters; fences strictly increase; nothing
/// is left in the queue afterwards.
#[test]
fn fair_order_across_clients() {
    let server = ZkServer::start();
    let url = server.url();
    runtime().block_on(async {
        let holder = client(&url, "holder").await;
        let key = "fair/orders";
        let g = holder.mutex(key).acquire().await.expect("acquire");
        let first_fence = g.fence();
        let (waiters, order) = queue_six(&url, |c| async move {
            let g = c.mutex(key).acquire_timeout(Duration::from_secs(60)).await.expect("waiter");
            (g.fence(), Box::pin(g.release()) as Releasing)
        })
        .await;
        let status = holder.status(key).await.expect("status");
        assert_eq!(status.holder.as_ref().map(|h| (h.label.as_str(), h.fence)), Some(("holder", first_fence)));
        assert_eq!(status.waiters, Some(6), "{status:?}");
        // No herd: each waiter watches only the node just before its own, so
        // six distinct queue nodes are watched, by one session each, and
        // nobody watches the lock's children.
        let watches = watches_by_path(server.client_port(0));
        assert_eq!(watches.len(), 6, "{watches:?}");
        assert!(
            watches.iter().all(|(p, n)| *n == 1 && p.starts_with("/holdfast/locks/fair%2Forders/lk-")),
            "{watches:?}"
        );
        g.release().await.expect("release");
        all_through(waiters).await;
        let order = order.lock().expect("order").clone();
        assert_eq!(order.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5], "{order:?}");
        let mut last = first_fence;
        for (_, f) in &order {
            assert!(*f > last, "fences not increasing: {order:?}");
            last = *f;
        }
        let status = holder.status(key).await.expect("status");
        assert!(status.holder.is_none() && status.waiters == Some(0), "{status:?}");
    });
}

/// A guard's release, whatever the guard's kind.
type Releasing = Pin<Box<dyn Future<Output = holdfast::Result<()>> + Send>>;

/// Queues six waiters, each a client of its own, 150 ms apart; each holds
/// what `acquire` grants it (its fence and its release) for 30 ms. Returns
/// the waiters' tasks and the grants in the order they came: (waiter, fence).
async fn queue_six<F, Fut>(url: &str, acquire: F) -> (Vec<JoinHandle<()>>, Arc<Mutex<Vec<(usize, u64)>>>)
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = (u64, Releasing)> + Send + 'static,
{
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..6 {
        let granted = acquire(client(url, &format!("w{i}")).await);
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let (fence, release) = granted.await;
            order.lock().expect("order").push((i, fence));
            tokio::time::sleep(Duration::from_millis(30)).await;
            release.await.expect("waiter release");
        }));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    (waiters, order)
}

/// Waits for every waiter to be granted and to release.
async fn all_through(waiters: Vec<JoinHandle<()>>) {
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(60), w).await.expect("waiter stuck").expect("task");
    }
}

/// The sequence part of a queue node name as the server wrote it
/// (`lk-{32 hex token}-{%010d}`).
fn sequence_suffix(name: &str) -> &str {
    name.get("lk-".len() + 32 + 1..).unwrap_or(name)
}

/// ZooKeeper numbers sequential children from the parent's child version, a
/// signed 32-bit counter (a never-idle lock reaches 2^31 in about 12 days at
/// 1,000 grants/s). A real server never lets the committed counter go back,
/// so past `2147483647` every child is numbered `2147483647` again. The
/// server here starts with the lock parent at child version 2^31 - 2 (see
/// the testkit), so the holder's node is `...-2147483646` and the next five
/// are all `...-2147483647`, as the server writes them. Exactly one holds at
/// a time, and the waiters are granted in request order all the same.
#[test]
fn queue_order_survives_the_sequence_wrap() {
    let key = "wrap/key";
    let parent = "/holdfast/locks/wrap%2Fkey";
    let server = ZkServer::start_with_child_version(parent, i32::MAX - 1);
    let url = server.url();
    runtime().block_on(async {
        let holder = client(&url, "holder").await;
        let g = holder.mutex(key).ttl(Duration::from_secs(60)).acquire().await.expect("acquire");
        let inside = Arc::new(std::sync::atomic::AtomicU32::new(1));
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..5 {
            let c = client(&url, &format!("w{i}")).await;
            let (inside, order) = (inside.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let g = c.mutex(key).ttl(Duration::from_secs(60)).acquire_timeout(Duration::from_secs(60)).await;
                let g = g.expect("waiter");
                let others = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                order.lock().expect("order").push((i, g.fence(), others));
                tokio::time::sleep(Duration::from_millis(30)).await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                g.release().await.expect("waiter release");
            }));
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        // The server really numbered the nodes past the wrap.
        let observer = raw(&server, None).await;
        let names = observer.list_children(parent).await.expect("list");
        let mut seqs: Vec<&str> = names.iter().map(|n| sequence_suffix(n)).collect();
        seqs.sort();
        assert_eq!(seqs, ["2147483646", "2147483647", "2147483647", "2147483647", "2147483647", "2147483647"]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(order.lock().expect("order").is_empty(), "granted while the holder held: {order:?}");
        let status = holder.status(key).await.expect("status");
        assert_eq!(status.holder.as_ref().map(|h| (h.label.as_str(), h.fence)), Some(("holder", g.fence())));
        assert_eq!(status.waiters, Some(5), "{status:?}");
        let holder_fence = g.fence();
        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        g.release().await.expect("release");
        all_through(waiters).await;
        let order = order.lock().expect("order").clone();
        assert_eq!(order.iter().map(|(i, _, _)| *i).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4], "{order:?}");
        assert!(order.iter().all(|(_, _, others)| *others == 0), "two holders at once: {order:?}");
        assert!(order.windows(2).all(|w| w[0].1 < w[1].1) && order[0].1 > holder_fence, "fences: {order:?}");
    });
}

/// Past the wrap, a newcomer's node shares the holder's number (or, for
/// creates the server prepared together, gets a wrapped negative one), and
/// its token may sort first: it must still not be granted. Tokens are chosen
/// here so that ordering by name would put every newcomer ahead.
#[test]
fn newcomer_past_the_wrap_does_not_jump_the_holder() {
    use holdfast::backend::{AcquireRequest, Backend};
    let key = "wrap/jump";
    let parent = "/holdfast/locks/wrap%2Fjump";
    let server = ZkServer::start_with_child_version(parent, i32::MAX);
    let url = server.url();
    runtime().block_on(async {
        let backend = Arc::new(ZkBackend::open_url(&url).await.expect("connect"));
        let ttl = Duration::from_secs(60);
        let lock_key = holdfast::LockKey::new(key).expect("key");
        let request =
            |t: u128| AcquireRequest::new(lock_key.clone(), holdfast::OwnerToken::from_bytes(t.to_be_bytes()), ttl);
        let holder = request(u128::MAX);
        backend.try_acquire(&holder).await.expect("try").expect("the free key granted");
        for t in 1..=3 {
            let grant = backend.try_acquire(&request(t)).await.expect("try");
            assert!(grant.is_none(), "newcomer {t} granted while the holder holds");
        }
        // Waiters queued together: their creates may be prepared before the
        // previous one commits, so the server numbers them past the wrap.
        // A client of their own each: one client queues one node per key.
        let granted = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut waiters = Vec::new();
        for t in 10..16u128 {
            let backend = ZkBackend::open_url(&url).await.expect("connect");
            let (req, granted) = (request(t), granted.clone());
            waiters.push(tokio::spawn(async move {
                backend.acquire(&req).await.expect("waiter");
                assert_eq!(granted.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0, "two holders");
                tokio::time::sleep(Duration::from_millis(20)).await;
                granted.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                assert!(backend.release(&req.key, req.token).await.expect("release"));
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let observer = raw(&server, None).await;
        let names = observer.list_children(parent).await.expect("list");
        let seqs: Vec<&str> = names.iter().map(|n| sequence_suffix(n)).collect();
        eprintln!("queue past the wrap as the server numbered it: {seqs:?}");
        assert_eq!(names.len(), 7, "{names:?}");
        assert!(seqs.iter().all(|s| *s == "2147483647" || s.starts_with('-')), "{seqs:?}");
        assert_eq!(granted.load(std::sync::atomic::Ordering::SeqCst), 0, "a waiter was granted while the holder held");
        assert!(backend.release(&holder.key, holder.token).await.expect("release"));
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(30), w).await.expect("waiter stuck").expect("task");
        }
    });
}

/// No herd for permits: behind shares only, the first waiting share watches
/// the lock's children and every share behind it watches its predecessor's
/// node alone (which marks itself when admitted), so a release wakes one
/// waiter, not all. Every waiter is then granted, each with its own fence
/// above the holder's.
#[test]
fn permit_waiters_watch_their_predecessor() {
    let server = ZkServer::start();
    let url = server.url();
    runtime().block_on(async {
        let holder = client(&url, "holder").await;
        let key = "permits/pool";
        let g = holder.semaphore(key, 2).acquire_many(2).await.expect("acquire");
        let first_fence = g.fence();
        let (waiters, order) = queue_six(&url, |c| async move {
            let g = c.semaphore(key, 2).acquire_timeout(Duration::from_secs(60)).await.expect("waiter");
            (g.fence(), Box::pin(g.release()) as Releasing)
        })
        .await;
        let status = holder.status(key).await.expect("status");
        assert_eq!(status.waiters, Some(6), "{status:?}");
        // `wchp` lists data watches: five distinct share nodes, one
        // session each (the head waiter's children watch is not listed;
        // when every waiter watched the children, none was).
        let watches = watches_by_path(server.client_port(0));
        assert_eq!(watches.len(), 5, "{watches:?}");
        assert!(
            watches.iter().all(|(p, n)| *n == 1 && p.starts_with("/holdfast/locks/permits%2Fpool/sh1-")),
            "{watches:?}"
        );
        g.release().await.expect("release");
        all_through(waiters).await;
        let order = order.lock().expect("order").clone();
        let mut fences: Vec<u64> = order.iter().map(|(_, f)| *f).collect();
        assert!(fences.iter().all(|f| *f > first_fence), "{order:?}");
        fences.sort_unstable();
        fences.dedup();
        assert_eq!(fences.len(), 6, "{order:?}");
        let status = holder.status(key).await.expect("status");
        assert!(status.holder.is_none() && status.waiters == Some(0), "{status:?}");
    });
}

/// A share waiting behind a writer reads its limit again when it wakes: a
/// resize made while it waited applies to it. Three permits asked of a
/// semaphore of 4 that was resized to 2 are not granted when the writer
/// goes (they were, under the limit read when the share queued).
#[test]
fn share_behind_a_writer_sees_a_resize() {
    let server = ZkServer::start();
    let url = server.url();
    runtime().block_on(async {
        let (holder, other) = (client(&url, "writer").await, client(&url, "permits").await);
        let key = "permits/resized";
        let writing = holder.rwlock(key).write().acquire().await.expect("write");
        let asking = tokio::spawn(async move {
            other.semaphore(key, 4).acquire_many_timeout(3, Duration::from_secs(3)).await.map(|p| p.fence())
        });
        holdfast_testkit::conformance::eventually("the share queued", Duration::from_secs(10), || async {
            holder.status(key).await.expect("status").waiters == Some(1)
        })
        .await;
        let mut sem = holder.semaphore(key, 4);
        assert_eq!(sem.resize(2).await.expect("resize"), 0);
        writing.release().await.expect("release");
        let outcome = asking.await.expect("task");
        assert!(matches!(outcome, Err(holdfast::Error::Timeout { .. })), "3 permits of 2 granted: {outcome:?}");
    });
}

/// One client's waiters take turns: however many of its tasks wait on a key,
/// the lock node has two children (the holder's and one waiter's), so the
/// children a hand-off lists do not grow with them (each of 64 tasks made a
/// node of its own before). The tasks are still granted in the order they
/// asked.
#[test]
fn one_queue_node_per_client() {
    let server = ZkServer::start();
    let url = server.url();
    runtime().block_on(async {
        let (holder, waiting) = (client(&url, "holder").await, client(&url, "waiting").await);
        let (key, ttl) = ("turns", Duration::from_secs(10));
        let g = holder.mutex(key).ttl(ttl).acquire().await.expect("acquire");
        let (waiters, order) = holdfast_testkit::conformance::queue_tasks_in_order(&waiting, key, ttl, 64).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let observer = raw(&server, None).await;
        let children = observer.list_children("/holdfast/locks/turns").await.expect("list");
        assert_eq!(children.len(), 2, "the holder and one waiter of the client");
        g.release().await.expect("release");
        all_through(waiters).await;
        assert_eq!(*order.lock().expect("order"), (0..64).collect::<Vec<_>>());
    });
}

/// A node alone in the queue learns that it is first from its create's
/// transaction (model `zk_join`): an uncontended cycle is two requests to
/// the server, the join and the delete, not three (a listing behind every
/// create), and the grant's fence is its node's creation zxid.
#[test]
fn an_uncontended_cycle_is_two_requests_fenced_with_the_nodes_czxid() {
    let server = ZkServer::start();
    let received = || requests_received(server.client_port(0)).expect("srvr's Received:");
    runtime().block_on(async {
        let c = client(&server.url(), "alone").await;
        let key = "alone/cycles";
        // The first cycle also creates the lock's container.
        c.mutex(key).acquire().await.expect("acquire").release().await.expect("release");
        let g = c.mutex(key).acquire().await.expect("acquire");
        let zk = raw(&server, None).await;
        let parent = "/holdfast/locks/alone%2Fcycles";
        let children = zk.list_children(parent).await.expect("list");
        assert_eq!(children.len(), 1, "{children:?}");
        let (_, stat) = zk.get_data(&format!("{parent}/{}", children[0])).await.expect("holder node");
        assert_eq!(g.fence(), stat.czxid as u64, "the fence is the holder node's creation zxid");
        g.release().await.expect("release");
        const CYCLES: u64 = 200;
        let before = received();
        for _ in 0..CYCLES {
            c.mutex(key).acquire().await.expect("acquire").release().await.expect("release");
        }
        let per_cycle = (received() - before) as f64 / CYCLES as f64;
        assert!(per_cycle < 2.5, "{per_cycle:.2} requests per uncontended cycle (2 expected; 3 with a listing)");
    });
}
