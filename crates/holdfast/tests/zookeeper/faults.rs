//! Faults: a hung or dead ensemble, a leader failover, a rolling restart,
//! a renewal that cannot reach the server, a stalled runtime.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast::stores::zookeeper::ZkBackend;
use holdfast::{Client, ClientOptions, Error};
use holdfast_testkit::servers::zookeeper::{TICK_MS, ZkServer};

use super::{client, runtime};

/// A hung ensemble (SIGSTOP longer than the session timeout): the holder's
/// `lost()` fires before anyone else is granted; its release says `Lost`;
/// the client opens a new session and locks again with a higher fence.
#[test]
fn session_loss_fires_lost_before_regrant() {
    let server = ZkServer::start();
    let url = format!("{}?session_timeout=2000&timeout=3000", server.url());
    runtime().block_on(async {
        let backend = ZkBackend::open_url(&url).await.expect("connect");
        let first_session = backend.session_id().await.expect("session id");
        let a = Client::with_backend(Arc::new(backend.clone()), ClientOptions::default().with_label("a"));
        let b = client(&url, "b").await;
        let key = "session/loss";
        let g = a.mutex(key).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let lost_at = {
            let lost = g.lost();
            tokio::spawn(async move {
                lost.await;
                Instant::now()
            })
        };
        let waiter = tokio::spawn(async move {
            let g = b.mutex(key).acquire_timeout(Duration::from_secs(60)).await.expect("waiter");
            (Instant::now(), g.fence(), g)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.pause(0, true);
        tokio::time::sleep(Duration::from_millis(2000 + 2000)).await;
        server.pause(0, false);
        let lost_at =
            tokio::time::timeout(Duration::from_secs(5), lost_at).await.expect("lost() never fired").expect("task");
        let (granted_at, fence, wg) =
            tokio::time::timeout(Duration::from_secs(30), waiter).await.expect("waiter never granted").expect("task");
        assert!(lost_at < granted_at, "lost() fired {:?} after the regrant", lost_at - granted_at);
        assert!(fence > g.fence());
        assert!(matches!(g.release().await, Err(Error::Lost { .. })));
        wg.release().await.expect("waiter release");
        let again = a.mutex(key).acquire_timeout(Duration::from_secs(20)).await.expect("lock on a new session");
        assert!(again.fence() > fence);
        assert_ne!(backend.session_id().await.expect("session id"), first_session, "the lost session was reused");
        again.release().await.expect("release");
    });
}

/// Kill the leader of a three-member ensemble while a lock is held and three
/// clients wait: the holder keeps its grant or sees `lost()` before anyone
/// else is granted; the waiters are granted in their request order; fences
/// strictly increase.
#[test]
fn leader_failover_keeps_order_and_fences() {
    let mut server = ZkServer::start_ensemble(3);
    // Session timeout 10 s: a disconnection up to 2.5 s (the election) keeps
    // grants and queue places.
    let url = format!("{}?session_timeout=10000", server.url());
    let rt = runtime();
    let holder = rt.block_on(client(&url, "holder"));
    let key = "failover/key";
    let g = rt.block_on(holder.mutex(key).ttl(Duration::from_secs(3)).acquire()).expect("acquire");
    let holder_fence = g.fence();
    let lost_at = {
        let lost = g.lost();
        rt.spawn(async move {
            lost.await;
            Instant::now()
        })
    };
    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    // The waiters ride out the whole election, however long a loaded
    // machine makes it (the test allows 60 s), not the default 10 s of a
    // store failing in a row, after which an acquire gives up with the
    // store's error.
    let patient = |label: String| {
        let url = url.clone();
        async move {
            let options = ClientOptions::default().with_label(label).with_store_retry(Duration::from_secs(60));
            Client::connect_with(&url, options).await.expect("connect")
        }
    };
    for i in 0..3 {
        let c = rt.block_on(patient(format!("w{i}")));
        let grants = grants.clone();
        waiters.push(rt.spawn(async move {
            let g = c.mutex(key).acquire_timeout(Duration::from_secs(90)).await.expect("waiter acquire");
            grants.lock().expect("grants").push((i, g.fence(), Instant::now()));
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = g.release().await;
        }));
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(rt.block_on(holder.status(key)).expect("status").waiters, Some(3));
    let leader = server.leader().expect("a leader");
    server.kill(leader);
    // Wait for a new leader among the survivors, then hold a little longer.
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.leader().is_none() {
        assert!(Instant::now() < deadline, "no new leader after 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1) + Duration::from_millis(4 * TICK_MS));
    assert!(grants.lock().expect("grants").is_empty() || g.is_lost(), "a waiter was granted while the holder held");
    let held_through = !g.is_lost();
    let released_at = Instant::now();
    let release = rt.block_on(g.release());
    if held_through {
        release.expect("holder kept its grant through the failover");
    }
    for w in waiters {
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(90), w).await })
            .expect("waiter stuck")
            .expect("task");
    }
    let grants = grants.lock().expect("grants").clone();
    assert_eq!(
        grants.iter().map(|(i, _, _)| *i).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "order after failover: {grants:?}"
    );
    let mut last = holder_fence;
    for (_, f, _) in &grants {
        assert!(*f > last, "fences not increasing across the failover: {holder_fence} then {grants:?}");
        last = *f;
    }
    let first_grant = grants[0].2;
    if held_through {
        assert!(first_grant >= released_at, "granted before the holder released");
    } else {
        let lost_at = rt.block_on(lost_at).expect("lost task");
        assert!(lost_at <= first_grant, "lost() fired after the key was granted again");
    }
    eprintln!("holder kept its grant through the leader kill: {held_through}");
    drop(rt);
}

/// A waiter on a held key whose ensemble dies: the waiting acquire hands the
/// store failure to the client's waiting policy, so `acquire_timeout` ends
/// with the store's error (exit 69 in the CLI), not `Timeout` ("busy", 75).
#[test]
fn waiter_on_a_dead_ensemble_gets_the_store_error() {
    let mut server = ZkServer::start();
    let url = format!("{}?session_timeout=10000", server.url());
    let rt = runtime();
    let (a, b) = rt.block_on(async { (client(&url, "a").await, client(&url, "b").await) });
    let key = "dead/ensemble";
    let g = rt.block_on(a.mutex(key).acquire()).expect("acquire");
    let waiter = rt.spawn(async move {
        let started = Instant::now();
        (b.mutex(key).acquire_timeout(Duration::from_secs(3)).await, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));
    server.kill(0);
    let (outcome, took) = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(30), waiter).await })
        .expect("the waiter hung")
        .expect("task");
    match outcome {
        Err(e @ Error::Backend { .. }) => eprintln!("after {took:?}: {e}"),
        other => panic!("expected the store's error after {took:?}, got {other:?}"),
    }
    assert!(took < Duration::from_secs(5), "took {took:?}");
    g.leak();
}

/// A rolling restart: the member serving the holder's session stops, takes
/// the holder's delete into its socket, and is killed before applying it.
/// The release fails while the session lives on (it moves to another
/// member): the store must say so with a retryable error and keep the node
/// recorded, so that the retry (the client's background retry, made by hand
/// here) deletes it and reports the grant was held. Forgetting the node
/// before the delete was confirmed left the key held for as long as the
/// holder's client lived.
///
/// One outcome besides is right, and the test tells it from the defect: a
/// client whose reconnection outlasts a quarter of its session timeout
/// counts its grants lost and abandons the session. Its retry then rightly
/// says "not held"; what must still be true is that the session was
/// replaced (a lost session is never used again) and that the key frees
/// well before the old session could expire, because abandoning it closes
/// it. (Under the load of a full test run on 2 cores this test failed 3
/// times in 13 with "did not find the grant", when it could not tell the
/// two apart; it now prints which it saw, and how long the retry took.)
#[test]
fn release_lost_in_a_rolling_restart_completes() {
    use holdfast::backend::{AcquireRequest, Backend};
    let mut server = ZkServer::start_ensemble(3);
    // Session timeout 60 s: the client keeps the session through a
    // disconnection of up to 15 s (a quarter). Moving it to another member
    // took longer than 2.5 s (a 10 s timeout's quarter) on a loaded CI
    // machine, and longer than 7.5 s (30 s's) once in a full test run on 2
    // cores: the client then rightly counted its grant lost, and the retry
    // found nothing to delete.
    let url = format!("{}?session_timeout=60000&timeout=2000", server.url());
    // The holder knows only the followers: killing a leader would add an
    // election to the restart, which may outlast the disconnect grace.
    let leader = server.leader().expect("a leader");
    let followers: Vec<usize> = (0..server.len()).filter(|&i| i != leader).collect();
    let holder_url = format!("{}?session_timeout=60000&timeout=2000", server.url_of(&followers));
    let rt = runtime();
    let backend = rt.block_on(ZkBackend::open_url(&holder_url)).expect("connect");
    let session = rt.block_on(backend.session_id()).expect("session id");
    let b = rt.block_on(client(&url, "b"));
    let key = holdfast::LockKey::new("rolling/restart").expect("key");
    let req = AcquireRequest::new(key.clone(), holdfast::OwnerToken::random(), Duration::from_secs(60));
    rt.block_on(backend.try_acquire(&req)).expect("try").expect("granted");
    let member = server.member_serving(session).expect("the member serving the holder");
    server.pause(member, true);
    // `kill -s STOP` returns before every thread of the JVM has stopped: a
    // delete sent at once could still be applied, and the retry would then
    // rightly find nothing to delete.
    std::thread::sleep(Duration::from_millis(200));
    let release = {
        let (backend, key) = (backend.clone(), key.clone());
        rt.spawn(async move { backend.release(&key, req.token).await })
    };
    std::thread::sleep(Duration::from_millis(300));
    server.kill(member);
    let killed_at = Instant::now();
    match rt.block_on(release).expect("task") {
        Err(e) => assert!(e.is_retryable(), "a release cut by connection loss must be retryable: {e}"),
        Ok(held) => panic!("the delete sent to a stopped member succeeded: {held}"),
    }
    let retried = rt.block_on(answered(Duration::from_secs(30), || backend.release(&key, req.token)));
    let retried = retried.expect("release retry");
    // After a lost session the next one may take a moment to open.
    let now = rt.block_on(answered(Duration::from_secs(20), || backend.session_id())).expect("session id");
    eprintln!("the retry ended {:?} after the kill: held {retried}", killed_at.elapsed());
    // b's session may have been on the killed member too: it may need a retry.
    let try_b = || async { b.mutex(key.as_str()).try_acquire().await };
    let took = if now == session {
        assert!(retried, "the retried release did not find the grant it had failed to delete");
        rt.block_on(answered(Duration::from_secs(5), try_b)).expect("try_acquire")
    } else {
        // Counted lost: the retry found no live session, or a new one.
        assert!(!retried, "a release on a replaced session reported the old session's grant held");
        eprintln!("the holder was disconnected past its grace and replaced its session; its grant was lost");
        // Freed by the abandoned session's close: within 10 s, far below
        // the 60 s session timeout, so not by an expiry.
        rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match answered(Duration::from_secs(5), try_b).await.expect("try_acquire") {
                    None if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                    taken => return taken,
                }
            }
        })
    };
    let took = took.expect("the key stayed held after the release completed");
    rt.block_on(took.release()).expect("release");
}

/// `call`'s first answer that is not a retryable error (a connection moving
/// to another member), trying again every 100 ms for up to `within`.
async fn answered<T, F, Fut>(within: Duration, mut call: F) -> holdfast::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = holdfast::Result<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        match call().await {
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            answer => return answer,
        }
    }
}

/// `renew` hears from the server: with the server hung it fails instead of
/// vouching for the lease, and a grant is valid no longer than the session
/// guarantees (three quarters of the negotiated session timeout).
#[test]
fn renew_hears_from_the_server_and_validity_fits_the_session() {
    use holdfast::backend::{AcquireRequest, Backend, RenewRequest};
    let server = ZkServer::start();
    let url = format!("{}?session_timeout=4000&timeout=1000", server.url());
    runtime().block_on(async {
        let backend = ZkBackend::open_url(&url).await.expect("connect");
        let timeout = backend.session_timeout().await.expect("session timeout");
        let key = holdfast::LockKey::new("renew/hears").expect("key");
        let token = holdfast::OwnerToken::random();
        let ttl = Duration::from_secs(60);
        let grant = backend.try_acquire(&AcquireRequest::new(key.clone(), token, ttl)).await.expect("try");
        let grant = grant.expect("granted");
        assert_eq!(grant.valid_for, timeout - timeout / 4, "valid_for must fit the session timeout {timeout:?}");
        let lease = [RenewRequest { key: key.clone(), token, ttl }];
        assert_eq!(backend.renew(&lease).await.expect("renew"), vec![true]);
        server.pause(0, true);
        // `kill -s STOP` returns before every thread of the JVM has stopped.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let paused = tokio::time::timeout(Duration::from_secs(10), backend.renew(&lease)).await;
        server.pause(0, false);
        match paused.expect("renew hung") {
            Err(e) => assert!(e.is_retryable(), "{e}"),
            Ok(held) => panic!("renew vouched for the lease without hearing from the server: {held:?}"),
        }
        assert!(backend.release(&key, token).await.expect("release"));
        assert_eq!(backend.renew(&lease).await.expect("renew"), vec![false]);
    });
}

/// A runtime stalled longer than the session timeout (the client's pings
/// stop, the ensemble expires the session and deletes the holder's node):
/// the first look after the stall already says lost, although the TTL is a
/// minute, and another client can take the key.
#[test]
fn stalled_runtime_sees_the_lease_lost() {
    let server = ZkServer::start();
    let url = format!("{}?session_timeout=2000", server.url());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let a = rt.block_on(client(&url, "a"));
    let key = "stalled/runtime";
    let g = rt.block_on(a.mutex(key).ttl(Duration::from_secs(60)).acquire()).expect("acquire");
    rt.block_on(async {
        // Nothing else runs on this thread meanwhile: no ping, no watcher.
        std::thread::sleep(Duration::from_millis(3500));
        assert!(g.is_lost(), "is_lost() is false after the session expired");
    });
    let b = rt.block_on(client(&url, "b"));
    let g2 = rt.block_on(b.mutex(key).acquire_timeout(Duration::from_secs(10))).expect("key freed by the expiry");
    assert!(g2.fence() > g.fence());
    rt.block_on(g2.release()).expect("release");
}

/// A waiter whose session is lost while it waits (the ensemble hung past the
/// disconnect grace, not yet past the session timeout) returns a retryable
/// error while the ensemble is still hung, instead of riding it out. Called
/// again with the same token once the ensemble answers, it queues on a new
/// session, deleting what its old session left: the token never has two
/// nodes, and it is granted once the holder's abandoned session is gone.
#[test]
fn lost_waiter_requeues_once_on_a_new_session() {
    use holdfast::backend::{AcquireRequest, Backend};
    let server = ZkServer::start();
    let url = format!("{}?session_timeout=4000&timeout=1000", server.url());
    runtime().block_on(async {
        let holder = ZkBackend::open_url(&url).await.expect("connect holder");
        let waiter = Arc::new(ZkBackend::open_url(&url).await.expect("connect waiter"));
        let key = holdfast::LockKey::new("lost/waiter").expect("key");
        let ttl = Duration::from_secs(60);
        let h = AcquireRequest::new(key.clone(), holdfast::OwnerToken::random(), ttl);
        holder.try_acquire(&h).await.expect("try").expect("granted");
        let w = AcquireRequest::new(key.clone(), holdfast::OwnerToken::random(), ttl);
        let first = {
            let (waiter, w) = (waiter.clone(), w.clone());
            tokio::spawn(async move { waiter.acquire(&w).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let old_session = waiter.session_id().await.expect("session id");
        server.pause(0, true);
        let paused = Instant::now();
        let first = tokio::time::timeout(Duration::from_secs(3), first).await;
        let returned_after = paused.elapsed();
        // 3.2 s: past the client's silence timeout (2/5 T) and grace (T/4),
        // short of the session timeout (T = 4 s).
        tokio::time::sleep(Duration::from_millis(3200).saturating_sub(returned_after)).await;
        server.pause(0, false);
        match first.expect("the waiting acquire rode out a hung ensemble").expect("task") {
            Err(e) => assert!(e.is_retryable(), "{e}"),
            Ok(_) => panic!("granted while the holder held"),
        }
        eprintln!("the waiter returned {returned_after:?} after the ensemble hung");
        let observer = super::raw(&server, None).await;
        let parent = "/holdfast/locks/lost%2Fwaiter";
        let prefix = format!("lk-{}-", w.token.to_hex());
        let again = {
            let (waiter, w) = (waiter.clone(), w.clone());
            tokio::spawn(async move {
                loop {
                    match waiter.acquire(&w).await {
                        Ok(grant) => return grant,
                        Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
                        Err(e) => panic!("waiter: {e}"),
                    }
                }
            })
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while !again.is_finished() {
            assert!(Instant::now() < deadline, "the waiter was never granted");
            if let Ok(children) = observer.list_children(parent).await {
                let mine = children.iter().filter(|c| c.starts_with(&prefix)).count();
                assert!(mine <= 1, "the waiter's token has {mine} nodes: {children:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        again.await.expect("task");
        assert_ne!(waiter.session_id().await.expect("session id"), old_session, "the lost session was reused");
        assert!(waiter.release(&key, w.token).await.expect("release"));
        assert_eq!(observer.list_children(parent).await.expect("list").len(), 0, "nodes left behind");
    });
}
