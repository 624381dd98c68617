//! Every store's client against a hostile peer ([`GarbagePeer`]) that
//! answers with generated scripts of garbage: random bytes, replies of the
//! store's protocol cut short, mutated or of the wrong type, length prefixes
//! of gigabytes with no body, endless replies, a close at once or after some
//! bytes, a reset, or silence. For every URL scheme, `connect`, then (if it
//! connected) `try_acquire`, `release` of anything granted, and `status`,
//! each bounded: every call returns within its documented timeouts plus a
//! margin, with a typed error; no panic (on any thread of the client's
//! runtime); no single allocation of more than [`MAX_ALLOCATION`]; and the
//! password planted in the URL shows in no error.
//!
//! The cases of one scheme run at once (each with its own peer), so that
//! cases that wait out timeouts cost CI the time of one; the scripts are
//! drawn by proptest from a seed printed with the results (`BADINPUT_SEED`
//! replays it).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error};
use holdfast_testkit::faults::{GarbagePeer, Protocol, Script};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use super::cases;
use super::scripts::scripts;

/// The password planted in every URL; no error may show it.
const MARK: &str = "PWMARKs3cr3t";
/// The store timeouts every URL sets, in ms.
const TIMEOUT_MS: u64 = 200;
/// The largest single allocation a hostile length may cause (checked
/// process-wide: no other test of the binary comes near it).
const MAX_ALLOCATION: usize = 256 << 20;
/// The name of the threads of the runtime the clients run on; panics on
/// threads of this name are counted.
const CLIENT_THREADS: &str = "garbage-client";

/// A URL scheme under test: its protocol, how many peers its URL names,
/// the URL for those peers, and how long one call may take at most.
struct Scheme {
    name: &'static str,
    protocol: Protocol,
    peers: usize,
    url: fn(&[SocketAddr]) -> String,
    bound: Duration,
}

/// Every call's bound: the store's timeouts (a connect may spend one on
/// the TCP connect and one on each of a few handshake steps), plus a margin
/// for a loaded CI machine.
fn bound(timeouts: u32) -> Duration {
    Duration::from_millis(TIMEOUT_MS) * timeouts + Duration::from_secs(3)
}

fn schemes() -> Vec<Scheme> {
    vec![
        Scheme {
            name: "redis",
            protocol: Protocol::Resp,
            peers: 1,
            url: |a| format!("redis://u:{MARK}@{}/0?timeout_ms={TIMEOUT_MS}", a[0]),
            bound: bound(4),
        },
        Scheme {
            name: "redis+sentinel",
            protocol: Protocol::Resp,
            peers: 1,
            url: |a| format!("redis+sentinel://u:{MARK}@{}/mymaster?timeout_ms={TIMEOUT_MS}&sentinel_auth=same", a[0]),
            bound: bound(4),
        },
        Scheme {
            name: "redis+cluster",
            protocol: Protocol::Resp,
            peers: 1,
            url: |a| format!("redis+cluster://u:{MARK}@{}?timeout_ms={TIMEOUT_MS}", a[0]),
            bound: bound(4),
        },
        Scheme {
            name: "redlock",
            protocol: Protocol::Resp,
            peers: 3,
            url: |a| {
                let hosts: Vec<String> = a.iter().map(ToString::to_string).collect();
                format!("redlock://u:{MARK}@{}?timeout_ms={TIMEOUT_MS}&call_timeout_ms={TIMEOUT_MS}", hosts.join(","))
            },
            bound: bound(4),
        },
        Scheme {
            name: "etcd",
            protocol: Protocol::Http2,
            peers: 1,
            url: |a| format!("etcd://u:{MARK}@{}?timeout_ms={TIMEOUT_MS}&connect_timeout_ms={TIMEOUT_MS}", a[0]),
            bound: bound(4),
        },
        Scheme {
            name: "zk",
            protocol: Protocol::ZooKeeper,
            peers: 1,
            url: |a| format!("zk://u:{MARK}@{}?timeout_ms={TIMEOUT_MS}", a[0]),
            bound: bound(4),
        },
        Scheme {
            name: "postgres",
            protocol: Protocol::Postgres,
            peers: 1,
            url: |a| {
                format!(
                    "postgres://u:{MARK}@{}/db?sslmode=disable&timeout_ms={TIMEOUT_MS}&connect_timeout_ms={TIMEOUT_MS}",
                    a[0]
                )
            },
            bound: bound(4),
        },
        Scheme {
            name: "mysql",
            protocol: Protocol::Mysql,
            peers: 1,
            url: |a| format!("mysql://u:{MARK}@{}/db?timeout_ms={TIMEOUT_MS}", a[0]),
            bound: bound(4),
        },
    ]
}

/// A URL for the given peers' addresses.
type UrlFor = Box<dyn Fn(&[SocketAddr]) -> String + Send + Sync>;

/// A real store behind the peers, for cases whose scripts relay to it
/// first, and the URL that reaches it through them.
pub struct Relay {
    /// The store's address.
    pub upstream: SocketAddr,
    /// The URL of the store with the peers' addresses in its place, with
    /// the short timeouts set.
    pub url: UrlFor,
    /// The password in that URL, which no error may show.
    pub secret: String,
}

/// Panics on the client runtime's threads so far.
static CLIENT_PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts panics on [`CLIENT_THREADS`] threads (a client library's
/// background task that panics never reaches the test's future), then
/// reports them as before.
fn count_client_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name().is_some_and(|n| n.starts_with(CLIENT_THREADS)) {
                CLIENT_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

/// Checks one call's outcome: within the bound, and an error (if any) that
/// is typed and hides the password. Returns the outcome for the next step.
fn judge<T>(
    what: &str,
    secret: &str,
    took: Duration,
    bound: Duration,
    outcome: Result<T, Error>,
) -> Result<Option<T>, String> {
    if took > bound {
        return Err(format!("{what} took {took:?}, above its bound {bound:?}"));
    }
    match outcome {
        Ok(v) => Ok(Some(v)),
        Err(e) => {
            let shown = format!("{e} {e:?}");
            if shown.contains(secret) {
                return Err(format!("{what}: the error shows the password: {shown}"));
            }
            match e {
                Error::Backend { .. } | Error::Timeout { .. } | Error::Lost { .. } => Ok(None),
                other => Err(format!("{what}: not a store error: {other:?}")),
            }
        }
    }
}

/// Runs `f` bounded by `bound` and a hang limit above it.
async fn timed<T>(
    bound: Duration,
    f: impl Future<Output = Result<T, Error>>,
) -> Result<(Duration, Result<T, Error>), String> {
    let started = Instant::now();
    match tokio::time::timeout(bound * 3, f).await {
        Ok(outcome) => Ok((started.elapsed(), outcome)),
        Err(_) => Err(format!("hung for {:?}", bound * 3)),
    }
}

/// How one case ended, for the summary.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    relayed: u32,
    connect_failed: u32,
    connected: u32,
    granted: u32,
    slowest: Duration,
}

/// One case: a peer per URL host following `scripts`, and the four calls.
async fn case(scheme: &Scheme, relay: Option<&Relay>, scripts: Vec<Script>) -> Result<Tally, String> {
    let start = |_| match relay {
        Some(r) => GarbagePeer::relaying(r.upstream, scripts.clone()),
        None => GarbagePeer::start(scripts.clone()),
    };
    let peers: Vec<GarbagePeer> = (0..scheme.peers).map(start).collect();
    let addrs: Vec<SocketAddr> = peers.iter().map(GarbagePeer::addr).collect();
    let (url, secret) = match relay {
        Some(r) => ((r.url)(&addrs), r.secret.as_str()),
        None => ((scheme.url)(&addrs), MARK),
    };
    let mut tally = Tally { relayed: u32::from(relay.is_some()), ..Tally::default() };
    let options = ClientOptions::default().with_label("garbage").with_store_retry(Duration::from_millis(TIMEOUT_MS));
    let (took, outcome) =
        timed(scheme.bound, Client::connect_with(&url, options)).await.map_err(|e| format!("connect {e}"))?;
    tally.slowest = took;
    let Some(client) = judge("connect", secret, took, scheme.bound, outcome)? else {
        tally.connect_failed = 1;
        return Ok(tally);
    };
    tally.connected = 1;
    let lock = client.mutex("garbage/key").ttl(Duration::from_secs(5));
    let (took, outcome) = timed(scheme.bound, lock.try_acquire()).await.map_err(|e| format!("try_acquire {e}"))?;
    tally.slowest = tally.slowest.max(took);
    if let Some(Some(guard)) = judge("try_acquire", secret, took, scheme.bound, outcome)? {
        tally.granted = 1;
        let (took, outcome) = timed(scheme.bound, guard.release()).await.map_err(|e| format!("release {e}"))?;
        tally.slowest = tally.slowest.max(took);
        judge("release", secret, took, scheme.bound, outcome)?;
    }
    let (took, outcome) = timed(scheme.bound, client.status("garbage/key")).await.map_err(|e| format!("status {e}"))?;
    tally.slowest = tally.slowest.max(took);
    judge("status", secret, took, scheme.bound, outcome)?;
    drop(client);
    drop(peers);
    Ok(tally)
}

/// Runs `n` generated cases of `scheme` at once and checks them; with a
/// `relay`, every other case has the real store behind its peers.
fn run_scheme(scheme: &Scheme, n: u32, relay: Option<Relay>) {
    count_client_panics();
    let seed: u64 = std::env::var("BADINPUT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x6a7b_a9e5);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    seed_bytes[8..16].copy_from_slice(&u64::from(xor_name(scheme.name)).to_le_bytes());
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes));
    let strategy = scripts(scheme.protocol);
    let all: Vec<Vec<Script>> = (0..n).map(|_| strategy.new_tree(&mut runner).expect("a script").current()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(CLIENT_THREADS)
        .enable_all()
        .build()
        .expect("runtime");
    let panics_before = CLIENT_PANICS.load(Ordering::SeqCst);
    let started = Instant::now();
    let relay = relay.as_ref();
    let cases = all.iter().cloned().enumerate().map(|(i, s)| case(scheme, relay.filter(|_| i % 2 == 1), s));
    let results = rt.block_on(futures::future::join_all(cases));
    let elapsed = started.elapsed();
    rt.shutdown_timeout(Duration::from_secs(5));
    let mut total = Tally::default();
    let mut failures = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(t) => {
                total.relayed += t.relayed;
                total.connect_failed += t.connect_failed;
                total.connected += t.connected;
                total.granted += t.granted;
                total.slowest = total.slowest.max(t.slowest);
            }
            Err(why) => failures.push(format!(
                "case {i} (relayed: {}): {why}\n  scripts: {:?}",
                relay.is_some() && i % 2 == 1,
                all[i]
            )),
        }
    }
    let panics = CLIENT_PANICS.load(Ordering::SeqCst) - panics_before;
    assert!(
        failures.is_empty(),
        "{} (seed {seed}): {} of {n} cases failed:\n{}",
        scheme.name,
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(panics, 0, "{}: {panics} panics on the client's threads (see stderr)", scheme.name);
    let largest = super::alloc::largest();
    assert!(largest <= MAX_ALLOCATION, "{}: an allocation of {largest} bytes", scheme.name);
    eprintln!(
        "{}: {n} garbage-peer cases in {elapsed:?} (seed {seed}), {} with a real store behind: {} failed at connect, \
         {} connected, {} granted; slowest call {:?} (bound {:?}); largest allocation so far {} KiB",
        scheme.name,
        total.relayed,
        total.connect_failed,
        total.connected,
        total.granted,
        total.slowest,
        scheme.bound,
        largest >> 10
    );
}

fn xor_name(name: &str) -> u32 {
    name.bytes().fold(0u32, |h, b| h.rotate_left(5) ^ u32::from(b))
}

fn scheme(name: &str) -> Scheme {
    schemes().into_iter().find(|s| s.name == name).expect("a scheme")
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `url` with its `127.0.0.1:port` replaced by the first peer's address and
/// the short timeouts added.
fn through(url: &str, port: u16, timeouts: &'static str) -> UrlFor {
    let (url, server) = (url.to_owned(), format!("127.0.0.1:{port}"));
    Box::new(move |peers| {
        let joined = if url.contains('?') { '&' } else { '?' };
        format!("{}{joined}{timeouts}", url.replacen(&server, &peers[0].to_string(), 1))
    })
}

const REDIS_TIMEOUTS: &str = "timeout_ms=200";

/// A Redis server with the user `u` whose password is [`MARK`].
fn redis_with_user() -> holdfast_testkit::servers::redis::RedisServer {
    let server = holdfast_testkit::servers::redis::RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let client = redis::Client::open(server.url()).expect("redis client");
        let mut c = client.get_multiplexed_async_connection().await.expect("redis connection");
        let set: () = redis::cmd("ACL")
            .arg(&["SETUSER", "u", "on", &format!(">{MARK}"), "~*", "&*", "+@all"])
            .query_async(&mut c)
            .await
            .expect("ACL SETUSER");
        set
    });
    server
}

#[test]
fn garbage_redis() {
    let server = redis_with_user();
    let url = format!("redis://u:{MARK}@127.0.0.1:{}/0", server.port());
    let relay = Relay {
        upstream: loopback(server.port()),
        url: through(&url, server.port(), REDIS_TIMEOUTS),
        secret: MARK.into(),
    };
    run_scheme(&scheme("redis"), cases(48), Some(relay));
}

#[test]
fn garbage_redis_sentinel() {
    run_scheme(&scheme("redis+sentinel"), cases(32), None);
}

#[test]
fn garbage_redis_cluster() {
    run_scheme(&scheme("redis+cluster"), cases(32), None);
}

#[cfg(feature = "redlock")]
#[test]
fn garbage_redlock() {
    // The three members' peers relay to one server: enough to get past
    // the handshakes, which is all a relay is for.
    let server = redis_with_user();
    let relay = Relay {
        upstream: loopback(server.port()),
        url: Box::new(|peers| {
            let hosts: Vec<String> = peers.iter().map(ToString::to_string).collect();
            format!("redlock://u:{MARK}@{}?timeout_ms={TIMEOUT_MS}&call_timeout_ms={TIMEOUT_MS}", hosts.join(","))
        }),
        secret: MARK.into(),
    };
    run_scheme(&scheme("redlock"), cases(32), Some(relay));
}

/// etcd: the relayed cases' URL has no credentials (the test server has
/// no auth enabled, so a login would fail before any lock call); the
/// password is checked in the other half.
#[cfg(feature = "etcd")]
#[test]
fn garbage_etcd() {
    let cluster = holdfast_testkit::servers::etcd::EtcdCluster::start();
    let url = cluster.url();
    let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("etcd port");
    let relay = Relay {
        upstream: loopback(port),
        url: through(&url, port, "timeout_ms=200&connect_timeout_ms=200"),
        secret: MARK.into(),
    };
    run_scheme(&scheme("etcd"), cases(48), Some(relay));
}

#[cfg(feature = "zookeeper")]
#[test]
fn garbage_zk() {
    let server = holdfast_testkit::servers::zookeeper::ZkServer::start();
    let port = server.client_port(0);
    let url = format!("zk://u:{MARK}@127.0.0.1:{port}");
    let relay = Relay { upstream: loopback(port), url: through(&url, port, "timeout_ms=200"), secret: MARK.into() };
    run_scheme(&scheme("zk"), cases(48), Some(relay));
}

/// PostgreSQL: the test server trusts every local login, so the password
/// planted in the relayed URL is sent and ignored.
#[cfg(feature = "postgres")]
#[test]
fn garbage_postgres() {
    let server = holdfast_testkit::servers::postgres::PostgresServer::start();
    let url = server.url().replacen("postgres@", &format!("postgres:{MARK}@"), 1);
    let relay = Relay {
        upstream: loopback(server.port()),
        url: through(&url, server.port(), "timeout_ms=200&connect_timeout_ms=200"),
        secret: MARK.into(),
    };
    run_scheme(&scheme("postgres"), cases(48), Some(relay));
}

/// MySQL: the relayed URL is the test server's, with its own password.
#[cfg(feature = "mysql")]
#[test]
fn garbage_mysql() {
    let server = holdfast_testkit::servers::mysql::MysqlServer::start();
    let relay = Relay {
        upstream: loopback(server.port()),
        url: through(&server.url(), server.port(), "timeout_ms=200"),
        secret: holdfast_testkit::servers::mysql::PASSWORD.into(),
    };
    run_scheme(&scheme("mysql"), cases(48), Some(relay));
}
