//! Redis-specific tests on a real redis-server: restarts with and without
//! persistence, the fair queue (order, direct hand-off, dead waiters),
//! batched renewal, and a grant deleted behind the client's back.
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error, FenceDurability};
use holdfast_testkit::servers::redis::RedisServer;

#[path = "redis/fair.rs"]
mod fair;
#[path = "redis/faults.rs"]
mod faults;
#[path = "redis/handover.rs"]
mod handover;
#[path = "redis/handover_faults.rs"]
mod handover_faults;
#[path = "redis/late_copy.rs"]
mod late_copy;
#[path = "redis/replicas.rs"]
mod replicas;
#[path = "redis/share_handover.rs"]
mod share_handover;
#[path = "redis/wakeups.rs"]
mod wakeups;

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let c = redis::Client::open(server.url()).expect("redis client");
    c.get_multiplexed_async_connection().await.expect("raw connection")
}

/// Calls of `cmd` the server has executed so far (INFO commandstats).
async fn command_calls(conn: &mut redis::aio::MultiplexedConnection, cmd: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.expect("info");
    let prefix = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

/// A restart without persistence while a lock is held: the grant is gone, so
/// the holder's renewal finds it missing and `lost()` fires; the key is
/// grantable again; and the new fence is still higher (the fence floor is the
/// server clock in microseconds, which a restart does not reset).
#[test]
fn restart_without_persistence_fires_lost_and_frees_the_key() {
    let mut server = RedisServer::start();
    rt().block_on(async {
        let url = server.url();
        let (a, b) = (client(&url, "holder").await, client(&url, "next").await);
        assert_eq!(a.capabilities().fence_durability, FenceDurability::Volatile);
        let g = a.mutex("restart/volatile").ttl(Duration::from_secs(3)).acquire().await.expect("acquire");
        let first_fence = g.fence();
        let lost = g.lost();
        let restarted = Instant::now();
        tokio::task::block_in_place(|| server.restart());
        tokio::time::timeout(Duration::from_secs(10), lost).await.expect("lost() did not fire after the restart");
        let fired_after = restarted.elapsed();
        assert!(g.is_lost());
        let next = b
            .mutex("restart/volatile")
            .acquire_timeout(Duration::from_secs(10))
            .await
            .expect("the key is grantable after the restart");
        assert!(next.fence() > first_fence, "fence {} after restart, was {first_fence}", next.fence());
        assert!(matches!(g.release().await, Err(Error::Lost { .. })));
        next.release().await.expect("release");
        // Renewal runs every ttl/3 = 1 s and retries soon after a failure.
        assert!(fired_after < Duration::from_secs(5), "lost() fired {fired_after:?} after the restart");
    });
}

/// With `appendonly yes` + `appendfsync always`, a kill -9 and restart loses
/// nothing: a held grant survives (the holder is not lost, nobody else gets
/// the key), and fences stay strictly increasing.
#[test]
fn durable_restart_keeps_grants_and_fences() {
    let mut server = RedisServer::start_durable();
    let url = server.url();
    let runtime = rt();
    let (a, b, held, mut fences) = runtime.block_on(async {
        let (a, b) = (client(&url, "a").await, client(&url, "b").await);
        assert_eq!(a.capabilities().fence_durability, FenceDurability::Durable);
        let mut fences = Vec::new();
        for _ in 0..5 {
            let g = a.mutex("restart/durable").acquire().await.expect("acquire");
            fences.push(g.fence());
            g.release().await.expect("release");
        }
        let held = a.mutex("restart/held").ttl(Duration::from_secs(10)).acquire().await.expect("hold");
        (a, b, held, fences)
    });
    server.kill();
    server.restart();
    runtime.block_on(async {
        for i in 0..5 {
            let c = if i % 2 == 0 { &a } else { &b };
            let g = c.mutex("restart/durable").acquire_timeout(Duration::from_secs(10)).await.expect("acquire");
            fences.push(g.fence());
            g.release().await.expect("release");
        }
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences not strictly increasing: {fences:?}");
        assert!(
            b.mutex("restart/held").try_acquire().await.expect("try").is_none(),
            "a held grant vanished in a durable restart"
        );
        // Renewals keep going after the restart (ttl 10 s: renewed every 3.3 s).
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!held.is_lost(), "the holder was lost across a durable restart");
        held.release().await.expect("release after the restart");
    });
    drop(server);
}

/// A grant deleted behind the client's back is noticed at the next renewal.
#[test]
fn deleted_grant_fires_lost_at_next_renewal() {
    let server = RedisServer::start();
    rt().block_on(async {
        let a = client(&server.url(), "a").await;
        let g = a.mutex("gone").ttl(Duration::from_secs(3)).acquire().await.expect("acquire");
        let mut conn = raw(&server).await;
        let _: () = redis::cmd("DEL").arg("{holdfast:gone}").query_async(&mut conn).await.expect("del");
        tokio::time::timeout(Duration::from_secs(3), g.lost()).await.expect("lost() after the grant was deleted");
        assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    });
}

/// Thousands of leases cost one renewal script call per 32 leases per tick
/// (the client's slice), not one per lease.
#[test]
fn renewal_is_batched() {
    let server = RedisServer::start();
    rt().block_on(async {
        let a = client(&server.url(), "many").await;
        let n = 2500;
        let mut guards = Vec::with_capacity(n);
        for i in 0..n {
            guards.push(a.mutex(format!("many/{i}")).ttl(Duration::from_secs(3)).acquire().await.expect("acquire"));
        }
        let mut conn = raw(&server).await;
        let before = command_calls(&mut conn, "fcall").await;
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let calls = command_calls(&mut conn, "fcall").await - before;
        // Renewal every 1 s: about 3-4 ticks of 79 calls (78 x 32 + 4 leases);
        // a tick split by acquisition times may cost a few more. One call per
        // lease would be 7,500 or more; slices of 64 would be 120-160.
        assert!((190..=480).contains(&calls), "{calls} renewal calls for {n} leases over 3.5 s");
        assert!(guards.iter().all(|g| !g.is_lost()));
        for g in guards {
            g.release().await.expect("release");
        }
    });
}

/// Non-fair waiting: one pub/sub subscription per client and lock, however
/// many tasks wait, and it is dropped (lazily) after the last waiter was served.
#[test]
fn one_subscription_per_client_and_lock() {
    let server = RedisServer::start();
    rt().block_on(async {
        let url = server.url();
        let (a, b) = (client(&url, "a").await, client(&url, "b").await);
        let g = a.mutex("subs").acquire().await.expect("acquire");
        let mut conn = raw(&server).await;
        let before = command_calls(&mut conn, "subscribe").await;
        let mut waiters = Vec::new();
        for _ in 0..20 {
            let b = b.clone();
            waiters.push(tokio::spawn(async move {
                let g = b.mutex("subs").acquire().await.expect("acquire");
                g.release().await.expect("release");
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let numsub: (String, i64) =
            redis::cmd("PUBSUB").arg("NUMSUB").arg("holdfast:w:subs").query_async(&mut conn).await.expect("numsub");
        assert_eq!(numsub.1, 1, "one subscription for 20 waiters of one client");
        assert_eq!(command_calls(&mut conn, "subscribe").await - before, 1);
        g.release().await.expect("release");
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(20), w).await.expect("stuck").expect("task");
        }
        // Dropped lazily, about a second after the last waiter left.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let numsub: (String, i64) =
            redis::cmd("PUBSUB").arg("NUMSUB").arg("holdfast:w:subs").query_async(&mut conn).await.expect("numsub");
        assert_eq!(numsub.1, 0, "subscription kept after the last waiter left");
    });
}

/// An unreachable server is a typed, retryable error within the URL's timeout.
#[test]
fn unreachable_server_is_a_typed_error_in_time() {
    rt().block_on(async {
        let port = holdfast_testkit::servers::free_port();
        let started = Instant::now();
        let outcome = Client::connect(&format!("redis://127.0.0.1:{port}?timeout_ms=500")).await;
        match outcome {
            Err(e @ Error::Backend { .. }) => assert!(e.is_retryable(), "{e}"),
            other => panic!("expected a Backend error, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        // A URL with a password never shows it in errors.
        let err = Client::connect(&format!("redis://u:hunter2@127.0.0.1:{port}?timeout_ms=300")).await.unwrap_err();
        assert!(!format!("{err} {err:?}").contains("hunter2"));
    });
}

/// Pub/sub wake-ups come back after the server was away for longer than the
/// connection's reconnect attempts: the subscription connection is checked,
/// re-established and resubscribed on its own. The waiter's fallback poll is
/// 20 s here, so only a notification can wake it within the bound.
#[test]
fn wakeups_survive_a_server_outage() {
    let mut server = RedisServer::start_durable();
    let url = server.url();
    let slow_poll = format!("{url}?poll_min_ms=20000&poll_max_ms=20000");
    let runtime = rt();
    let (holder, waiter) = runtime.block_on(async {
        let c = client(&url, "holder").await;
        let b = client(&slow_poll, "waiter").await;
        let held = c.mutex("outage").ttl(Duration::from_secs(30)).acquire().await.expect("hold");
        let waiter = tokio::spawn(async move {
            let g = b.mutex("outage").acquire().await.expect("waiter acquire");
            let at = Instant::now();
            g.release().await.expect("release");
            at
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        (held, waiter)
    });
    server.kill();
    std::thread::sleep(Duration::from_secs(3));
    server.restart();
    runtime.block_on(async {
        // Time for the checks to reconnect and resubscribe (one a second).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(!waiter.is_finished(), "the waiter got a held lock");
        let released = Instant::now();
        holder.release().await.expect("release after the outage");
        let granted = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("waiter stuck").expect("task");
        let woke = granted - released;
        assert!(woke < Duration::from_secs(1), "the waiter woke {woke:?} after the release (no notification)");
    });
}

/// `rediss://` with `ca_file=`: locks and pub/sub wake-ups over TLS, trusting
/// only the given CA; without it the server's certificate is refused.
#[test]
fn tls_with_a_ca_file() {
    let server = RedisServer::start_tls();
    rt().block_on(async {
        let url = server.url();
        assert!(url.starts_with("rediss://") && url.contains("ca_file="), "{url}");
        let (a, b) = (client(&url, "a").await, client(&url, "b").await);
        let g = a.mutex("tls").acquire().await.expect("acquire over TLS");
        let waiter = tokio::spawn(async move {
            let g = b.mutex("tls").acquire_timeout(Duration::from_secs(10)).await.expect("wait over TLS");
            g.release().await.expect("release");
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        g.release().await.expect("release");
        tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("waiter stuck").expect("task");
        // The system trust store does not know the test CA.
        let untrusted = format!("rediss://127.0.0.1:{}?timeout_ms=2000", server.port());
        assert!(matches!(Client::connect(&untrusted).await, Err(Error::Backend { .. })));
    });
}

/// A server that lost the function library (`FUNCTION FLUSH`, a restart
/// without persistence, a failover to a node without it) is sent it again by
/// the next call, which then runs: locks go on, and the library is loaded
/// once per loss.
#[test]
fn a_lost_function_library_is_loaded_again() {
    let server = RedisServer::start();
    rt().block_on(async {
        let a = client(&server.url(), "a").await;
        let mut conn = raw(&server).await;
        a.mutex("flush").acquire().await.expect("acquire").release().await.expect("release");
        let loads = command_calls(&mut conn, "function|load").await;
        let flush = || redis::cmd("FUNCTION").arg("FLUSH").clone();
        let _: () = flush().query_async(&mut conn).await.expect("function flush");
        let g = a.mutex("flush").acquire().await.expect("acquire after FUNCTION FLUSH");
        let _: () = flush().query_async(&mut conn).await.expect("function flush");
        g.release().await.expect("release after FUNCTION FLUSH");
        let g = a.mutex("flush").try_acquire().await.expect("try_acquire").expect("free after the release");
        assert!(g.fence() > 0);
        g.release().await.expect("release");
        assert_eq!(command_calls(&mut conn, "function|load").await - loads, 2, "one load per flush");
    });
}

/// The least an ACL user needs (the list in docs.md), with and without the
/// two commands of the faster function calls (`FCALL`, `FUNCTION LOAD`):
/// without them the store calls its scripts by `EVALSHA`. A wrong password is
/// a non-retryable error that does not show the password.
#[test]
fn acl_user_with_minimal_permissions() {
    for functions in [true, false] {
        acl_user_with_minimal_permissions_case(functions);
    }
}

fn acl_user_with_minimal_permissions_case(functions: bool) {
    let server = RedisServer::start();
    rt().block_on(async {
        let mut conn = raw(&server).await;
        let rules = "on >s3cret-pw ~{holdfast:* &holdfast:* +evalsha +eval +script|load +subscribe +unsubscribe \
                     +ping +hello +hget +hmget +hset +hdel +hvals +hgetall +pexpire +pexpireat +pttl +time \
                     +lindex +lpop +rpush +lrem +publish";
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg("locker");
        for rule in rules.split_whitespace() {
            cmd.arg(rule);
        }
        if functions {
            cmd.arg("+fcall").arg("+function|load");
        }
        let _: () = cmd.query_async(&mut conn).await.expect("acl setuser");
        let url = format!("redis://locker:s3cret-pw@127.0.0.1:{}", server.port());
        let (a, b) = (client(&url, "a").await, client(&url, "b").await);
        for fair in [false, true] {
            let g = a.mutex("acl").fair(fair).acquire().await.expect("acquire as an ACL user");
            let waiter = {
                let b = b.clone();
                tokio::spawn(async move {
                    let g = b.mutex("acl").fair(fair).acquire_timeout(Duration::from_secs(10)).await.expect("wait");
                    g.release().await.expect("release");
                })
            };
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(a.status("acl").await.expect("status").holder.map(|h| h.label), Some("a".to_owned()));
            g.release().await.expect("release");
            tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("waiter stuck").expect("task");
        }
        // Shared leases need nothing more: a waiting writer reserves, readers share.
        let reader = a.rwlock("acl-rw").read().acquire().await.expect("read as an ACL user");
        let writer = tokio::spawn({
            let b = b.clone();
            async move { b.rwlock("acl-rw").write().acquire_timeout(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let st = a.status("acl-rw").await.expect("status");
        assert_eq!(st.shared.len(), 1, "{st:?}");
        reader.release().await.expect("release");
        let w = tokio::time::timeout(Duration::from_secs(10), writer).await.expect("writer stuck").expect("task");
        w.expect("write as an ACL user").release().await.expect("release");
        // Which way the scripts went: all by FCALL, or all by EVALSHA.
        let (fcall, evalsha) = (command_calls(&mut conn, "fcall").await, command_calls(&mut conn, "evalsha").await);
        if functions {
            assert!(fcall > 0 && evalsha == 0, "FCALL {fcall}, EVALSHA {evalsha}");
        } else {
            assert!(fcall == 0 && evalsha > 0, "FCALL {fcall}, EVALSHA {evalsha}");
        }
        let bad = format!("redis://locker:wrong-pw@127.0.0.1:{}?timeout_ms=2000", server.port());
        match Client::connect(&bad).await {
            Err(e @ Error::Backend { .. }) => {
                assert!(!e.is_retryable(), "{e}");
                assert!(!format!("{e} {e:?}").contains("wrong-pw"));
            }
            other => panic!("expected an auth error, got {other:?}"),
        }
    });
}

/// An ACL user missing a command the store needs (`FCALL` and `EVALSHA`,
/// here: either way of calling the scripts) over TLS:
/// connecting works (nothing is checked yet), the first lock call is a
/// non-retryable error that names the refusal, and never the password.
#[test]
fn acl_user_missing_a_permission_over_tls() {
    let server = RedisServer::start_tls();
    rt().block_on(async {
        let tls = server.url();
        let ca = server.dir().join("ca.pem");
        let out = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &server.port().to_string(), "--tls", "--cacert"])
            .arg(&ca)
            .args(["ACL", "SETUSER", "partial", "on", ">partial-PLANTED-pw", "~*", "&*", "+@all", "-evalsha", "-fcall"])
            .output()
            .expect("redis-cli (apt-get install -y redis-tools)");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK", "{}", String::from_utf8_lossy(&out.stderr));
        let url = tls.replacen("rediss://", "rediss://partial:partial-PLANTED-pw@", 1);
        let outcome = tokio::time::timeout(Duration::from_secs(20), async {
            let c = Client::connect(&url).await?;
            c.mutex("acl-missing").try_acquire().await.map(|_| ())
        })
        .await
        .expect("a refused command hung");
        match outcome {
            Err(e @ Error::Backend { .. }) => {
                let text = format!("{e} {e:?}");
                assert!(!e.is_retryable(), "{text}");
                assert!(text.to_lowercase().contains("permission"), "{text}");
                assert!(!text.contains("PLANTED"), "{text}");
            }
            other => panic!("a user without FCALL and EVALSHA: expected a Backend error, got {other:?}"),
        }
    });
}

/// `status` counts the waiting shared-lease requests, by their reservations:
/// a semaphore waiter, and writers queued behind readers. (Waiters of a
/// default-mode mutex leave nothing in the store and are not counted; the
/// docs say so.)
#[test]
fn status_counts_waiting_shared_and_writer_requests() {
    let server = RedisServer::start();
    rt().block_on(async {
        let url = server.url();
        let a = client(&url, "a").await;
        let wait_for = |want: u64, key: &'static str| {
            let a = a.clone();
            async move {
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let n = a.status(key).await.expect("status").waiters;
                    if n == Some(want) {
                        return;
                    }
                    assert!(Instant::now() < deadline, "{key}: waiters {n:?}, want {want}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let permit = a.semaphore("status/sem", 1).acquire().await.expect("permit");
        let b = client(&url, "b").await;
        let sem_waiter = tokio::spawn(async move { b.semaphore("status/sem", 1).acquire().await.map(|_| ()) });
        wait_for(1, "status/sem").await;
        permit.release().await.expect("release");
        sem_waiter.await.expect("task").expect("granted after the release");

        let mut readers = Vec::new();
        for _ in 0..3 {
            readers.push(a.rwlock("status/rw").read().acquire().await.expect("read"));
        }
        let mut writers = Vec::new();
        for i in 0..4 {
            let w = client(&url, &format!("w{i}")).await;
            writers.push(tokio::spawn(async move {
                let g = w.rwlock("status/rw").write().acquire_timeout(Duration::from_secs(30)).await.expect("write");
                g.release().await.expect("release");
            }));
        }
        wait_for(4, "status/rw").await;
        for r in readers {
            r.release().await.expect("release");
        }
        for w in writers {
            w.await.expect("writer");
        }
        wait_for(0, "status/rw").await;
    });
}
