//! Redis Cluster on real servers (three masters started by the testkit):
//! locks spread over every master; a slot moved to another master while
//! its lock is held and renewed (`MOVED`, `ASK`, `TRYAGAIN` followed);
//! renewal of many leases in one script call per slot; waiters woken on the
//! lock's own master; a failover to a replica; bad cluster URLs.
#![cfg(feature = "redis")]

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use holdfast::backend::{AcquireRequest, RenewRequest};
use holdfast::{Client, ClientOptions, Error, LockKey, OwnerToken};
use holdfast_testkit::servers::redis::sentinel::{Reply, command, pipeline};
use holdfast_testkit::servers::redis::{RedisCluster, RedisServer};

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

/// The Redis key of lock `key`'s hash (default namespace).
fn lock_hash(key: &str) -> String {
    format!("{{holdfast:{key}}}")
}

/// True if the master on `port` holds `key` (`EXISTS`, which a cluster
/// node answers only for its own slots).
fn exists_on(port: u16, key: &str) -> bool {
    command(port, &["EXISTS", key]) == Some(Reply::Text("1".into()))
}

#[test]
fn locks_spread_over_every_master() {
    let cluster = RedisCluster::start();
    rt().block_on(async {
        let a = client(&cluster.url(), "a").await;
        let b = client(&cluster.url(), "b").await;
        let keys: Vec<String> = (0..60).map(|i| format!("spread/{i}")).collect();
        let guards = futures::future::join_all(keys.iter().map(|k| {
            let m = a.mutex(k).ttl(Duration::from_secs(30));
            async move { m.try_acquire().await }
        }))
        .await
        .into_iter()
        .map(|r| r.expect("try_acquire").expect("a free key is granted"))
        .collect::<Vec<_>>();
        // Every lock's hash is on the master that owns its slot, and every
        // master holds some of them.
        let mut per_master: HashMap<u16, usize> = HashMap::new();
        for key in &keys {
            let owner = cluster.owner(cluster.keyslot(&lock_hash(key)));
            assert!(exists_on(owner, &lock_hash(key)), "{key} is not on the master of its slot ({owner})");
            *per_master.entry(owner).or_default() += 1;
        }
        for port in cluster.ports() {
            let n = per_master.get(&port).copied().unwrap_or(0);
            assert!(n > 0 && cluster.dbsize(port) as usize >= n, "master {port} holds {n} locks: {per_master:?}");
        }
        eprintln!("locks per master: {per_master:?}");
        // Another client is refused every one, then granted each once released.
        for key in &keys {
            assert!(b.mutex(key).try_acquire().await.expect("try_acquire").is_none(), "{key} granted twice");
        }
        let fences: Vec<u64> = guards.iter().map(|g| g.fence()).collect();
        for g in guards {
            g.release().await.expect("release");
        }
        for (key, old) in keys.iter().zip(fences) {
            let g = b.mutex(key).try_acquire().await.expect("try_acquire").expect("a released key is granted");
            assert!(g.fence() > old, "{key}: fence {} not above {old}", g.fence());
            g.release().await.expect("release");
        }
    });
}

/// A held lock whose slot moves to another master, in the steps of
/// `redis-cli --cluster reshard` run back to back (IMPORTING, MIGRATING,
/// MIGRATE, SETSLOT NODE on every master), while its lease is renewed every
/// second and another client keeps trying to take it.
#[test]
fn slot_moves_under_a_held_renewed_lease() {
    let cluster = std::sync::Arc::new(RedisCluster::start());
    rt().block_on(async {
        let key = "moving/lock";
        let slot = cluster.keyslot(&lock_hash(key));
        let from = cluster.owner(slot);
        let to = cluster.ports().into_iter().find(|p| *p != from).expect("another master");
        let a = client(&cluster.url(), "holder").await;
        let b = client(&cluster.url(), "other").await;
        let ttl = Duration::from_secs(3);
        let guard = a.mutex(key).ttl(ttl).acquire_timeout(Duration::from_secs(3)).await.expect("acquire");
        let old_fence = guard.fence();
        assert!(exists_on(from, &lock_hash(key)));
        // Let a renewal or two pass, so that the move lands between renewals.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mover = cluster.clone();
        let started = Instant::now();
        let mut migration = tokio::task::spawn_blocking(move || {
            let moved = mover.migrate_slot(slot, to);
            (moved, started.elapsed())
        });
        // Another client tries all through the move: refused by the lock,
        // or by a retryable error while the slot is half moved (TRYAGAIN).
        let (mut busy, mut retryable) = (0, 0);
        let (moved, window) = loop {
            let attempt = b.mutex(key).ttl(ttl);
            tokio::select! {
                done = &mut migration => break done.expect("migration"),
                r = attempt.try_acquire() => match r {
                    Ok(None) => busy += 1,
                    Err(e) if e.is_retryable() => retryable += 1,
                    Ok(Some(g)) => panic!("another client was granted the held lock during the move (fence {})", g.fence()),
                    Err(e) => panic!("during the move: {e}"),
                },
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(moved >= 1, "the lock's hash was not in slot {slot}");
        eprintln!(
            "slot {slot} moved {from} -> {to} in {window:?} ({moved} keys); another client meanwhile: \
             {busy} busy, {retryable} retryable errors"
        );
        assert!(exists_on(to, &lock_hash(key)) && !exists_on(from, &lock_hash(key)));
        // Renewals after the move go to the new master (MOVED followed).
        tokio::time::sleep(ttl * 2).await;
        assert!(!guard.is_lost(), "the holder lost its lease through the move");
        assert!(exists_on(to, &lock_hash(key)) && !exists_on(from, &lock_hash(key)));
        assert!(b.mutex(key).ttl(ttl).try_acquire().await.expect("try_acquire after the move").is_none());
        guard.release().await.expect("release after the move");
        let next = b.mutex(key).ttl(ttl).try_acquire().await.expect("try_acquire").expect("granted after release");
        assert!(next.fence() > old_fence, "fence {} not above {old_fence}", next.fence());
        next.release().await.expect("release");
    });
}

/// One acquire and release of `key`.
async fn cycle(client: &Client, key: &str) {
    let g = client.mutex(key).try_acquire().await.expect("try_acquire").expect("a free key is granted");
    g.release().await.expect("release");
}

/// Cycles keys until the backend routes script calls straight to `masters`
/// masters (its Debug says so), for at most 10 s.
async fn until_direct(backend: &dyn holdfast::backend::Backend, client: &Client, masters: usize) {
    let want = format!("direct_masters: Some({masters})");
    let deadline = Instant::now() + Duration::from_secs(10);
    for i in 0.. {
        if format!("{backend:?}").contains(&want) {
            return;
        }
        assert!(Instant::now() < deadline, "no direct routes after 10 s: {backend:?}");
        cycle(client, &format!("direct/{i}")).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Script calls go straight to the master of their slot once the routes
/// are known (the `redis` crate's cluster connection passes each request
/// through two tasks); when a slot moves, the first call on it meets
/// `MOVED` at the old master, goes through the cluster connection instead,
/// and the routes are built again.
#[test]
fn script_calls_go_straight_to_their_master() {
    let cluster = std::sync::Arc::new(RedisCluster::start());
    rt().block_on(async {
        let backend = holdfast::stores::connect(&cluster.url()).await.expect("connect");
        let c = Client::with_backend(backend.clone(), ClientOptions::default());
        until_direct(&*backend, &c, 3).await;
        let key = "moving/direct";
        cycle(&c, key).await;
        let slot = cluster.keyslot(&lock_hash(key));
        let from = cluster.owner(slot);
        let to = cluster.ports().into_iter().find(|p| *p != from).expect("another master");
        let mover = cluster.clone();
        let moved = tokio::task::spawn_blocking(move || mover.migrate_slot(slot, to)).await.expect("migration");
        assert!(moved >= 1 && exists_on(to, &lock_hash(key)));
        let g = c.mutex(key).try_acquire().await.expect("after the move").expect("a free key is granted");
        assert!(exists_on(to, &lock_hash(key)) && !exists_on(from, &lock_hash(key)));
        g.release().await.expect("release");
        until_direct(&*backend, &c, 3).await;
        for _ in 0..20 {
            cycle(&c, key).await;
        }
    });
}

/// The channels `PUBSUB CHANNELS pattern` lists on the master on `port`.
fn channels(port: u16, pattern: &str) -> Vec<String> {
    match command(port, &["PUBSUB", "CHANNELS", pattern]) {
        Some(Reply::Array(items)) => items
            .into_iter()
            .filter_map(|r| match r {
                Reply::Text(t) => Some(t),
                _ => None,
            })
            .collect(),
        other => panic!("PUBSUB CHANNELS on {port}: {other:?}"),
    }
}

/// Waiters are woken by pub/sub on the lock's own master: a non-fair and a
/// fair waiter of one lock subscribe there (`prefix:w:{prefix:K}` and
/// `prefix:c:{prefix:K}:ID`) and nowhere else, and each is granted within
/// 200 ms of the release before it, with a fallback poll of 2 s.
#[test]
fn waiters_are_woken_on_the_locks_own_master() {
    let cluster = RedisCluster::start();
    rt().block_on(async {
        let key = "woken/lock";
        let owner = cluster.owner(cluster.keyslot(&lock_hash(key)));
        let url = format!("{}?poll_min_ms=2000&poll_max_ms=2000", cluster.url());
        let (a, b, c) = (client(&url, "a").await, client(&url, "b").await, client(&url, "c").await);
        let ttl = Duration::from_secs(30);
        let held = a.mutex(key).ttl(ttl).try_acquire().await.expect("try_acquire").expect("granted");
        let plain = tokio::spawn({
            let m = b.mutex(key).ttl(ttl);
            async move {
                let g = m.acquire_timeout(Duration::from_secs(20)).await.expect("non-fair waiter");
                (Instant::now(), g)
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let fair = tokio::spawn({
            let m = c.mutex(key).ttl(ttl).fair(true);
            async move {
                let g = m.acquire_timeout(Duration::from_secs(20)).await.expect("fair waiter");
                (Instant::now(), g)
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let lock_channel = format!("holdfast:w:{}", lock_hash(key));
        let fair_prefix = format!("holdfast:c:{}:", lock_hash(key));
        for port in cluster.ports() {
            let found = channels(port, "holdfast:*");
            let here = found.contains(&lock_channel) && found.iter().any(|ch| ch.starts_with(&fair_prefix));
            assert_eq!(here, port == owner, "channels on {port} (lock on {owner}): {found:?}");
            if port != owner {
                assert!(found.is_empty(), "channels on {port}: {found:?}");
            }
        }
        // The fair waiter queued; the non-fair one defers to it. The release
        // hands the lock to the fair waiter, whose release wakes the other.
        let released = Instant::now();
        held.release().await.expect("release");
        let (at, g) = fair.await.expect("fair task");
        let woke = at - released;
        assert!(woke < Duration::from_millis(200), "fair waiter granted {woke:?} after the release");
        let released = Instant::now();
        g.release().await.expect("release");
        let (at, g) = plain.await.expect("waiter task");
        let woke_plain = at - released;
        assert!(woke_plain < Duration::from_millis(200), "non-fair waiter granted {woke_plain:?} after the release");
        eprintln!("hand-off to the fair waiter: {woke:?}; non-fair waiter woken: {woke_plain:?}");
        g.release().await.expect("release");
    });
}

/// CRC16-XMODEM of the hash tag, modulo 16384: the slot of a key without
/// asking the server (as Redis computes it).
fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tag = match bytes.iter().position(|b| *b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|b| *b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    let mut crc: u16 = 0;
    for b in tag {
        crc ^= u16::from(*b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % 16384
}

/// While a slot is half moved (held open between the steps), every call on
/// its locks is refused with a retryable error (`TRYAGAIN`, retried until
/// `timeout_ms`): the held lock's and a fresh lock's alike, on the old
/// master and, after the keys moved, on the new one (`ASK` leads there,
/// and it answers `TRYAGAIN` too, as the scripts name keys that do not
/// exist). Once the slot is handed over, both work on the new master, and
/// a holder whose lease outlived the window kept it.
#[test]
fn half_moved_slot_refuses_its_locks_until_handed_over() {
    let cluster = RedisCluster::start();
    rt().block_on(async {
        let key = "half/lock";
        let slot = cluster.keyslot(&lock_hash(key));
        assert_eq!(slot_of(&lock_hash(key)), slot);
        let fresh = (0..)
            .map(|i| format!("half/fresh/{i}"))
            .find(|k| slot_of(&lock_hash(k)) == slot)
            .expect("a key in the same slot");
        let from = cluster.owner(slot);
        let to = cluster.ports().into_iter().find(|p| *p != from).expect("another master");
        let a = client(&cluster.url(), "holder").await;
        let b = client(&format!("{}?timeout_ms=300", cluster.url()), "other").await;
        let ttl = Duration::from_secs(10);
        let guard = a.mutex(key).ttl(ttl).try_acquire().await.expect("try_acquire").expect("granted");
        let refused = async |phase: &str, k: &str| {
            let started = Instant::now();
            match b.mutex(k).ttl(ttl).try_acquire().await {
                Err(e) if e.is_retryable() => eprintln!("{phase}, {k}: {e} after {:?}", started.elapsed()),
                other => panic!("{phase}, {k}: expected a retryable error, got {:?}", other.map(|g| g.is_some())),
            }
        };
        cluster.begin_migration(slot, to);
        refused("migrating, keys on the old master", key).await;
        refused("migrating, keys on the old master", &fresh).await;
        assert!(cluster.migrate_keys(slot, to) >= 1);
        refused("keys moved, slot not handed over", key).await;
        refused("keys moved, slot not handed over", &fresh).await;
        cluster.finish_migration(slot, to);
        assert!(b.mutex(key).try_acquire().await.expect("after the move").is_none());
        let g = b.mutex(&fresh).try_acquire().await.expect("after the move").expect("a fresh key is granted");
        assert!(exists_on(to, &lock_hash(&fresh)));
        g.release().await.expect("release");
        assert!(!guard.is_lost(), "the holder lost a 10 s lease in a window of under 2 s");
        guard.release().await.expect("release after the move");
    });
}

/// 1,000 leases on keys spread over the three masters, renewed in one
/// `renew` call: every one renewed, with one script call per slot (so per
/// master: the number of slots of its leases, not one call per chunk of
/// leases of mixed slots, which a cluster refuses as CROSSSLOT).
#[test]
fn renews_many_leases_in_one_script_call_per_slot() {
    let cluster = RedisCluster::start();
    rt().block_on(async {
        let backend = holdfast::stores::connect(&cluster.url()).await.expect("connect");
        let ttl = Duration::from_secs(60);
        let reqs: Vec<AcquireRequest> = (0..1000)
            .map(|i| AcquireRequest::new(LockKey::new(format!("many/{i}")).unwrap(), OwnerToken::random(), ttl))
            .collect();
        for chunk in reqs.chunks(200) {
            for r in futures::future::join_all(chunk.iter().map(|r| backend.try_acquire(r))).await {
                assert!(r.expect("try_acquire").is_some());
            }
        }
        let leases: Vec<RenewRequest> =
            reqs.iter().map(|r| RenewRequest { key: r.key.clone(), token: r.token, ttl }).collect();
        // Warms the connections (the function library went to every master
        // at connect; by EVALSHA a first call would answer NOSCRIPT).
        assert_eq!(backend.renew(&leases[..1]).await.expect("renew one"), vec![true]);
        // The slots of the leases on each master.
        let mut slots: HashMap<u16, HashSet<u16>> = HashMap::new();
        for r in &reqs {
            let slot = cluster.keyslot(&lock_hash(r.key.as_str()));
            slots.entry(cluster.owner(slot)).or_default().insert(slot);
        }
        cluster.reset_stats();
        let started = Instant::now();
        let held = backend.renew(&leases).await.expect("renew 1000 leases");
        let took = started.elapsed();
        assert_eq!(held.len(), 1000);
        assert!(held.iter().all(|h| *h), "{} of 1000 not renewed", held.iter().filter(|h| !**h).count());
        let mut report = Vec::new();
        for port in cluster.ports() {
            let calls = cluster.calls(port, "fcall");
            let expected = slots.get(&port).map_or(0, HashSet::len) as u64;
            assert_eq!(calls, expected, "master {port}: {calls} renew script calls for {expected} slots");
            report.push(format!("{port}: {calls} FCALL for {expected} slots"));
        }
        eprintln!("renewed 1000 leases in {took:?}; {}", report.join("; "));
        // A lease of another token is not renewed, whatever its slot.
        let mut stale = leases[..3].to_vec();
        for l in &mut stale {
            l.token = OwnerToken::random();
        }
        assert_eq!(backend.renew(&stale).await.expect("renew stale"), vec![false; 3]);
    });
}

/// Through the client's lease scheduler: 1,000 locks held with a 1.5 s TTL
/// (renewed every 500 ms) for 3 s, none lost.
#[test]
fn client_keeps_many_leases_across_masters() {
    let cluster = RedisCluster::start();
    rt().block_on(async {
        let c = client(&cluster.url(), "many").await;
        let ttl = Duration::from_millis(1500);
        let mut guards = Vec::new();
        for chunk in (0..1000).collect::<Vec<_>>().chunks(200) {
            let got = futures::future::join_all(chunk.iter().map(|i| {
                let m = c.mutex(format!("held/{i}")).ttl(ttl);
                async move { m.try_acquire().await }
            }))
            .await;
            guards.extend(got.into_iter().map(|r| r.expect("try_acquire").expect("granted")));
        }
        cluster.reset_stats();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let lost = guards.iter().filter(|g| g.is_lost()).count();
        let calls: Vec<u64> = cluster.ports().iter().map(|p| cluster.calls(*p, "fcall")).collect();
        eprintln!("1000 leases held 3 s: {lost} lost; FCALL per master {calls:?}");
        assert_eq!(lost, 0);
        for g in guards {
            g.release().await.expect("release");
        }
    });
}

#[test]
fn bad_cluster_input_is_typed_and_redacted() {
    rt().block_on(async {
        for url in [
            "redis+cluster://u:topsecret@127.0.0.1:1/5",
            "rediss+cluster://u:topsecret@127.0.0.1:1",
            "redis+cluster://u:topsecret@127.0.0.1:1?replicas=1",
            "redis+cluster://u:topsecret@127.0.0.1:1?ca_file=/x",
            "redis+cluster://u:topsecret@127.0.0.1:1,",
        ] {
            let err = holdfast::stores::connect(url).await.expect_err(url);
            assert!(matches!(err, Error::InvalidInput { .. }), "{url}: {err}");
            assert!(!err.to_string().contains("topsecret") && !format!("{err:?}").contains("topsecret"), "{err}");
        }
        // Nothing listens: a retryable error within the timeout, no hang.
        let port = holdfast_testkit::servers::free_port();
        let started = Instant::now();
        let err = holdfast::stores::connect(&format!("redis+cluster://u:topsecret@127.0.0.1:{port}?timeout_ms=500"))
            .await
            .expect_err("nothing listens");
        assert!(err.is_retryable() && !err.to_string().contains("topsecret"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
        // A server without cluster support: an error, not a hang.
        let plain = RedisServer::start();
        let started = Instant::now();
        let url = format!("redis+cluster://127.0.0.1:{}?timeout_ms=500", plain.port());
        let err = holdfast::stores::connect(&url).await.expect_err("not a cluster");
        eprintln!("redis+cluster:// to a plain server: {err}");
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    });
}

/// A master of the cluster SIGKILLed: its replica takes over its slots
/// (`cluster-node-timeout` 2 s), and the client follows: a lock held on the
/// dead master (replicated before the kill) stays held and renewed, another
/// client is refused it, a fresh lock of the dead master's slots is granted
/// on the promoted replica, and the held one is released there.
#[test]
fn follows_a_failover_to_the_replica() {
    let mut cluster = RedisCluster::start_with_replicas();
    rt().block_on(async {
        let key = "failover/lock";
        let slot = cluster.keyslot(&lock_hash(key));
        let old = cluster.owner(slot);
        let fresh = (0..)
            .map(|i| format!("failover/fresh/{i}"))
            .find(|k| cluster.owner(cluster.keyslot(&lock_hash(k))) == old && slot_of(&lock_hash(k)) != slot)
            .expect("another key on the same master");
        let a = client(&cluster.url(), "holder").await;
        let b = client(&cluster.url(), "other").await;
        let ttl = Duration::from_secs(10);
        let guard = a.mutex(key).ttl(ttl).try_acquire().await.expect("try_acquire").expect("granted");
        let old_fence = guard.fence();
        // The grant is on the replica before the master dies: a later write
        // to the same slot that WAIT confirms on its own connection (WAIT
        // counts the caller's writes; replication keeps their order).
        let probe = format!("{}-probe", lock_hash(key));
        let acked = pipeline(old, &[&["SET", &probe, "1"], &["WAIT", "1", "5000"], &["DEL", &probe]]);
        assert!(matches!(acked.as_deref(), Some([_, Reply::Text(n), _]) if n == "1"), "not replicated: {acked:?}");
        let killed = Instant::now();
        cluster.kill(old);
        let (new, promoted) = cluster.wait_failover(slot, old, Duration::from_secs(30));
        assert_ne!(new, old);
        // A fresh lock on the dead master's slots: granted once the client follows.
        let first_grant = loop {
            match b.mutex(&fresh).ttl(ttl).try_acquire().await {
                Ok(Some(g)) => break (killed.elapsed(), g),
                Ok(None) => panic!("{fresh} busy: nobody holds it"),
                Err(e) => {
                    assert!(e.is_retryable(), "{e}");
                    assert!(killed.elapsed() < Duration::from_secs(40), "no grant 40 s after the kill: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        eprintln!(
            "master {old} killed; replica {new} owned the slot after {promoted:?}; first grant there {:?} after the kill",
            first_grant.0
        );
        first_grant.1.release().await.expect("release on the promoted replica");
        // The held lock: kept through the failover (it was replicated), renewed on the new master.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!guard.is_lost(), "the replicated lease was lost in the failover: {:?}", guard.lost_reason());
        assert!(exists_on(new, &lock_hash(key)));
        assert!(b.mutex(key).ttl(ttl).try_acquire().await.expect("try_acquire").is_none(), "granted twice");
        guard.release().await.expect("release after the failover");
        let next = b.mutex(key).ttl(ttl).try_acquire().await.expect("try_acquire").expect("granted after release");
        assert!(next.fence() > old_fence);
        next.release().await.expect("release");
    });
}
