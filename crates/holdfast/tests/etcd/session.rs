//! Session leases: what a revoked or expired session does to holders and waiters.

use super::*;

/// Revoking the session lease behind two guards fires `lost()` on both, and
/// the keys are gone; the next acquisition starts a new session.
#[test]
fn session_loss_fires_lost_for_every_guard() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let a = client(&url, "a").await;
        let g1 = a.mutex("s/one").ttl(Duration::from_secs(5)).acquire().await.expect("one");
        let g2 = a.mutex("s/two").ttl(Duration::from_secs(5)).acquire().await.expect("two");
        let mut etcd = raw(&url).await;
        let kv =
            etcd.get("holdfast/s%2Fone/", Some(etcd_client::GetOptions::new().with_prefix())).await.expect("get").kvs()
                [0]
            .clone();
        let other =
            etcd.get("holdfast/s%2Ftwo/", Some(etcd_client::GetOptions::new().with_prefix())).await.expect("get").kvs()
                [0]
            .lease();
        assert_eq!(kv.lease(), other, "two locks of one TTL share one session lease");
        etcd.lease_revoke(kv.lease()).await.expect("revoke");
        let lost = async {
            g1.lost().await;
            g2.lost().await;
        };
        tokio::time::timeout(Duration::from_secs(5), lost).await.expect("lost() did not fire after the lease went");
        assert!(matches!(g1.release().await, Err(Error::Lost { .. })));
        drop(g2);
        let b = client(&url, "b").await;
        let g = b.mutex("s/one").try_acquire().await.expect("try").expect("free after the session went");
        g.release().await.expect("release");
        let g = a.mutex("s/one").ttl(Duration::from_secs(5)).acquire().await.expect("a new session");
        g.release().await.expect("release");
    });
}

/// Runs `etcdctl` off the runtime's worker threads.
async fn etcdctl_async(url: &str, args: &[&str]) {
    let (url, args): (String, Vec<String>) = (url.to_owned(), args.iter().map(|a| a.to_string()).collect());
    tokio::task::spawn_blocking(move || etcdctl(&url, &args.iter().map(String::as_str).collect::<Vec<_>>()))
        .await
        .expect("etcdctl task");
}

/// Waits until lock `lock` has `n` keys (holder and waiters).
async fn queued(url: &str, lock: &str, n: usize, within: Duration) -> Vec<(String, i64)> {
    holdfast_testkit::conformance::eventually(&format!("{n} keys queued on {lock}"), within, || async {
        queue_of(url, lock).await.len() == n
    })
    .await;
    queue_of(url, lock).await
}

/// What an operator does to a holder's grant behind its back.
#[derive(Debug, Clone, Copy)]
enum Removal {
    /// `etcdctl lease revoke` of the holder's session lease.
    RevokeLease,
    /// `etcdctl del` of the holder's key.
    DeleteKey,
}

/// The holder's grant is removed behind its back while another client
/// waits: the holder's `lost()` fires within a second (not at its next
/// keep-alive, 10 s away with this 30 s TTL, nor never for a deleted key),
/// and no later than about when the waiter is granted, give or take what a
/// grant this young waits to hear it: the key watch's deferral (50 ms), then
/// etcd's catch-up of a watcher that starts in the past (up to 100 ms).
async fn removed_grant_fires_lost(url: &str, a: &Client, lock: &str, removal: Removal) {
    let b = client(url, "b").await;
    let ttl = Duration::from_secs(30);
    let g = a.mutex(lock).ttl(ttl).acquire().await.expect("acquire");
    let waiter = {
        let m = b.mutex(lock).ttl(ttl);
        tokio::spawn(async move {
            let g = m.acquire().await;
            (Instant::now(), g)
        })
    };
    let queue = queued(url, lock, 2, Duration::from_secs(10)).await;
    let (holder_key, holder_lease) = queue[0].clone();
    let lost_at = {
        let lost = g.lost();
        tokio::spawn(async move {
            lost.await;
            Instant::now()
        })
    };
    let removed_at = Instant::now();
    match removal {
        Removal::RevokeLease => etcdctl_async(url, &["lease", "revoke", &format!("{holder_lease:x}")]).await,
        Removal::DeleteKey => etcdctl_async(url, &["del", &holder_key]).await,
    }
    let lost_at = tokio::time::timeout(Duration::from_secs(15), lost_at)
        .await
        .unwrap_or_else(|_| panic!("{removal:?}: lost() did not fire within 15 s"))
        .expect("lost task");
    let (granted_at, granted) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not granted after the holder's grant went")
        .expect("waiter task");
    let granted = granted.expect("waiter granted");
    let lost_after = lost_at - removed_at;
    eprintln!(
        "{removal:?}: lost() after {lost_after:?}; waiter granted after {:?}",
        granted_at.saturating_duration_since(removed_at)
    );
    assert!(lost_after <= Duration::from_secs(1), "{removal:?}: lost() fired {lost_after:?} after the removal");
    assert!(
        lost_at <= granted_at + Duration::from_millis(50 + 100 + 100),
        "{removal:?}: lost() fired {:?} after another client was granted",
        lost_at - granted_at
    );
    assert!(g.is_lost());
    assert!(matches!(g.release().await, Err(Error::Lost { .. })), "release of a removed grant");
    granted.release().await.expect("release");
}

/// `etcdctl lease revoke` of a holder's session lease fires its `lost()` in
/// milliseconds; the holder's next attempt, even a single one made before
/// a keep-alive could tell the session is gone, runs on a new session.
#[test]
fn revoked_lease_fires_lost_promptly() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let a = client(&url, "a").await;
        removed_grant_fires_lost(&url, &a, "revoked", Removal::RevokeLease).await;
        let m = a.mutex("revoked-next").ttl(Duration::from_secs(30));
        let g = m.try_acquire().await.expect("try_acquire after the revoke").expect("a free key");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!g.is_lost());
        g.release().await.expect("release");
    });
}

/// `etcdctl del` of a holder's key fires its `lost()` in milliseconds, and
/// only that grant's: the session, and another grant on it, live on.
#[test]
fn deleted_key_fires_lost_promptly() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let a = client(&url, "a").await;
        let other = a.mutex("bystander").ttl(Duration::from_secs(30)).acquire().await.expect("bystander");
        let bystander = queue_of(&url, "bystander").await;
        removed_grant_fires_lost(&url, &a, "deleted", Removal::DeleteKey).await;
        // The same client again: its session lease is the bystander's.
        let g = a.mutex("deleted-next").ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        assert_eq!(queue_of(&url, "deleted-next").await[0].1, bystander[0].1, "the session was replaced");
        g.release().await.expect("release");
        assert!(!other.is_lost(), "a grant on the same session was lost with the deleted key");
        assert_eq!(queue_of(&url, "bystander").await, bystander);
        other.release().await.expect("the bystander's grant is still held");
    });
}

/// A waiter whose session lease is revoked while it waits joins the queue
/// again on a new session at once (not at its next keep-alive, 7 s away
/// with this 20 s TTL), and is granted when the holder releases; nothing of
/// its first attempt is left behind.
#[test]
fn waiter_whose_lease_is_revoked_rejoins_and_is_granted() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let (a, b) = (client(&url, "a").await, client(&url, "b").await);
        let lock = "waiter-revoked";
        let g = a.mutex(lock).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let waiter = {
            let m = b.mutex(lock).ttl(Duration::from_secs(20));
            tokio::spawn(async move { m.acquire_timeout(Duration::from_secs(60)).await })
        };
        let first = queued(&url, lock, 2, Duration::from_secs(10)).await[1].clone();
        etcdctl_async(&url, &["lease", "revoke", &format!("{:x}", first.1)]).await;
        holdfast_testkit::conformance::eventually(
            "the waiter queued again on a new session",
            Duration::from_secs(2),
            || async {
                let q = queue_of(&url, lock).await;
                q.len() == 2 && q[1].1 != first.1
            },
        )
        .await;
        let rejoined = queue_of(&url, lock).await[1].clone();
        assert_eq!(rejoined.0, first.0, "the same token queues again");
        let held_fence = g.fence();
        g.release().await.expect("release");
        let granted = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter was not granted")
            .expect("task")
            .expect("the waiter whose lease was revoked was granted");
        assert!(granted.fence() > held_fence);
        granted.release().await.expect("release");
        assert!(holdfast_keys(&url).await.is_empty(), "keys left behind");
    });
}

/// A waiter whose session lease is revoked just before the holder releases
/// (before its keep-alive could tell it) is still granted: it finds its key
/// gone, and its next attempt runs on a new session rather than failing on
/// the revoked one.
#[test]
fn waiter_revoked_just_before_the_release_is_granted() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let (a, b) = (client(&url, "a").await, client(&url, "b").await);
        let lock = "revoked-then-released";
        let g = a.mutex(lock).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let waiter = {
            let m = b.mutex(lock).ttl(Duration::from_secs(20));
            tokio::spawn(async move { m.acquire_timeout(Duration::from_secs(60)).await })
        };
        let lease = queued(&url, lock, 2, Duration::from_secs(10)).await[1].1;
        let mut etcd = raw(&url).await;
        etcd.lease_revoke(lease).await.expect("revoke");
        g.release().await.expect("release");
        let granted = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter was not granted")
            .expect("task")
            .expect("the waiter whose lease was revoked was granted");
        assert_ne!(queue_of(&url, lock).await[0].1, lease);
        granted.release().await.expect("release");
        assert!(holdfast_keys(&url).await.is_empty(), "keys left behind");
    });
}

/// A waiting process paused (SIGSTOP) past its session lease, which etcd
/// then revokes with its key, rejoins the queue on a new session when it
/// resumes and is granted when the holder releases, within its 30 s wait.
#[test]
fn waiter_paused_past_its_session_is_still_granted() {
    child_entry();
    let server = EtcdCluster::start();
    let url = server.url();
    let lock = "paused";
    rt().block_on(async {
        let a = client(&url, "a").await;
        let g = a.mutex(lock).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let mut child = spawn_child("session::waiter_paused_past_its_session_is_still_granted", "wait", &url, lock);
        let first = queued(&url, lock, 2, Duration::from_secs(20)).await[1].clone();
        child.signal("STOP");
        // The child's session lease (2 s, etcd's minimum here) runs out.
        let expired = queued(&url, lock, 1, Duration::from_secs(10)).await;
        child.signal("CONT");
        holdfast_testkit::conformance::eventually(
            "the child queued again on a new session",
            Duration::from_secs(5),
            || async {
                let q = queue_of(&url, lock).await;
                q.len() == 2 && q[1].1 != first.1
            },
        )
        .await;
        assert_eq!(expired.len(), 1);
        g.release().await.expect("release");
        let stdout = child.0.stdout.take().expect("child stdout");
        let out = tokio::task::spawn_blocking(move || std::io::read_to_string(stdout).expect("read child"))
            .await
            .expect("reader");
        let status = child.0.wait().expect("wait child");
        assert!(status.success() && out.contains("GRANTED"), "the child was not granted: {status}: {out}");
    });
}

/// A release made while etcd does not answer (its process stopped) fails
/// with a store error, not `Lost`; the key is not kept on the holder's live
/// session: the client retries the release in the background, and the key
/// is free within seconds of etcd answering again, while the holder's
/// client lives on with its session.
#[test]
fn release_while_etcd_is_stopped_completes_when_it_is_back() {
    let server = EtcdCluster::start();
    let direct = server.url();
    let url = format!("{direct}?timeout_ms=1000");
    let member = &server.members[0];
    rt().block_on(async {
        let a = client(&url, "a").await;
        let lock = "release-outage";
        let g = a.mutex(lock).ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let lease = queue_of(&direct, lock).await[0].1;
        member.pause();
        let outcome = tokio::time::timeout(Duration::from_secs(10), g.release()).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        member.resume();
        let back = Instant::now();
        match outcome.expect("release hung while etcd was stopped") {
            Err(Error::Backend { retryable: true, .. }) => {}
            other => panic!("release while etcd was stopped: expected a retryable store error, got {other:?}"),
        }
        let b = client(&url, "b").await;
        let g = b.mutex(lock).acquire_timeout(Duration::from_secs(10)).await.expect("the key was never freed");
        let freed_after = back.elapsed();
        eprintln!("release during an outage: key free {freed_after:?} after etcd was back");
        assert!(freed_after <= Duration::from_secs(5), "key freed only {freed_after:?} after etcd was back");
        g.release().await.expect("release");
        let g = a.mutex("release-outage-next").ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        assert_eq!(queue_of(&direct, "release-outage-next").await[0].1, lease, "the holder's session was lost");
        g.release().await.expect("release");
    });
}

/// The key watch survives its member's crash: the holder's client reaches
/// only member 0 of three; while member 0 is down, the holder's key is
/// deleted through the others. When member 0 is back, the client's watch
/// stream is reopened with each watcher resuming from the revision it had
/// reached, so the deletion made in the gap still fires `lost()`, within
/// about a second; and the holder's session lives on.
#[test]
fn key_watch_resumes_after_its_member_restarts() {
    let mut cluster = EtcdCluster::start_members(3);
    let only_first = format!("etcd://127.0.0.1:{}", cluster.members[0].client_port);
    let others =
        format!("etcd://127.0.0.1:{},127.0.0.1:{}", cluster.members[1].client_port, cluster.members[2].client_port);
    let runtime = rt();
    let (a, g, (key, lease)) = runtime.block_on(async {
        let a = client(&only_first, "a").await;
        let g = a.mutex("restarted").ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        let holder = queue_of(&only_first, "restarted").await[0].clone();
        (a, g, holder)
    });
    cluster.kill(0);
    runtime.block_on(async {
        // Through the other two members, once they have a leader.
        holdfast_testkit::conformance::eventually(
            "the key deleted through the others",
            Duration::from_secs(20),
            || {
                let (others, key) = (others.clone(), key.clone());
                async move { raw(&others).await.delete(key, None).await.is_ok() }
            },
        )
        .await;
        assert!(!g.is_lost(), "lost() fired while the holder's only member was down: the test tests nothing");
    });
    cluster.restart(0);
    let back = Instant::now();
    runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), g.lost()).await.expect("lost() did not fire after the restart");
        let took = back.elapsed();
        eprintln!("key deleted while the client's member was down: lost() {took:?} after it was back");
        assert!(took <= Duration::from_secs(3), "lost() fired {took:?} after the member was back");
        let g = a.mutex("restarted-next").ttl(Duration::from_secs(30)).acquire().await.expect("acquire");
        assert_eq!(queue_of(&only_first, "restarted-next").await[0].1, lease, "the session did not survive");
        g.release().await.expect("release");
    });
}

/// A permit without renewal lasts its TTL, though the session vouches for
/// a little less at a time (the session lease, 2 s here, counts from the
/// session's last confirmation, before the grant): held at 1.7 s, and
/// another client gets the permit only once it ended. (Was: it ended at
/// about 1.95 s, before its TTL.)
#[test]
fn a_permit_without_renewal_lasts_its_ttl() {
    let server = EtcdCluster::start();
    let url = server.url();
    rt().block_on(async {
        let (a, b) = (client(&url, "a").await, client(&url, "b").await);
        let ttl = Duration::from_secs(2);
        // A session of this TTL class in use for a while: a grant on it is
        // vouched for until the session lease's end, less than a TTL away.
        let warm = a.mutex("no-renew/etcd-warm").ttl(ttl).acquire().await.expect("warm-up lock");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let called = Instant::now();
        let p = a.semaphore("no-renew/etcd", 1).ttl(ttl).no_renew().acquire().await.expect("permit");
        // Granted on a session lease that runs out sooner than the TTL, the
        // permit's validity at first is the session's; the client renews it
        // up to one TTL, so it is still held at 1.7 s.
        let ends = called + ttl - holdfast::LockOptions::drift_margin(ttl);
        tokio::time::sleep_until((called + Duration::from_millis(1700)).into()).await;
        assert!(!p.is_lost(), "lost at 1.7 s");
        let other = b.semaphore("no-renew/etcd", 1);
        assert!(other.try_acquire().await.expect("try").is_none(), "a second permit at 1.7 s");
        let q = other.acquire_timeout(Duration::from_secs(20)).await.expect("the permit after the TTL");
        assert!(Instant::now() >= ends, "granted {:?} before the first permit's end", ends - Instant::now());
        q.release().await.expect("release");
        warm.release().await.expect("release");
    });
}
