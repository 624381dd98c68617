//! The peer bench: the cycle workloads on holdfast, the raw floor and the
//! peer crates, interleaved in one run on one Redis, with holdfast/peer ratios.
//!
//! ```text
//! cargo run -p holdfast-bench --release --features peers --bin peers -- --url redis://127.0.0.1:6379 --rounds 3
//! cargo run -p holdfast-bench --release --features peers --bin peers -- --url redlock://127.0.0.1:6379,127.0.0.1:6380,127.0.0.1:6381
//! ```
//!
//! With a `redlock://` URL, holdfast's RedLock runs against rslock's and
//! distributed-lock-redis's own RedLock over the same servers (no raw floor).
//! With a `zk://` URL, holdfast's ZooKeeper lock runs against the raw floor
//! and the lock recipe of `zookeeper-client` (the ZooKeeper client holdfast
//! itself uses), which is Apache Curator's `InterProcessMutex` recipe:
//!
//! ```text
//! cargo run -p holdfast-bench --release --features peers --bin peers -- --backend zk://127.0.0.1:2181 --rounds 3
//! ```
//!
//! Peers (latest on crates.io when this was written):
//! - `rslock` 0.10 (`LockManager` on the one server, `acquire_no_guard` =
//!   `SET NX PX` retried 3 times with a random delay of up to 200 ms, in a
//!   loop; `unlock` = compare-and-delete script).
//! - `distributed-lock-redis` 0.2 (`RedisLockProvider` on the one server;
//!   its `acquire(Some(timeout))` does not wait on one server (one `SET NX`,
//!   then `Timeout` at once if busy), so waiting is `try_acquire` polled
//!   every 1 ms; `release` = `EVAL` compare-and-delete; a background
//!   extension task per handle).
//!
//! - `zookeeper-client` 0.11 (`Client::lock` with `LockPrefix::new_curator`:
//!   an EPHEMERAL_SEQUENTIAL node in the key's directory, the children
//!   listed, a watch on the node just ahead when not first; the node is
//!   deleted when the guard drops, in the background, so release costs the
//!   caller no round trip; one session for all tasks). Fair, like holdfast's
//!   ZooKeeper lock and unlike the floor (a plain EPHEMERAL create, where a
//!   newcomer can beat a waiter).
//!
//! Their dependencies stay in this binary (feature `peers`): the library and
//! the CLI never link them. The many-leases workload has no peer here.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use distributed_lock_core::{DistributedLock, LockHandle, LockProvider};
use holdfast::{Client, Error, Result};
use holdfast_bench::{
    ACQUIRE_LIMIT, BenchReport, CommandCounter, CycleSpec, FloorLocker, HoldfastLocker, Locker, Mix, ProgressEvent,
    Workload, WorkloadResult, command_counter_for, floor_for, run_cycles,
};

/// `rslock` on one Redis server.
struct Rslock {
    manager: rslock::LockManager,
    ttl: Duration,
}

impl Locker for Rslock {
    type Guard = rslock::Lock;

    async fn acquire(&self, key: &str) -> Result<rslock::Lock> {
        match tokio::time::timeout(ACQUIRE_LIMIT, self.manager.acquire_no_guard(key.as_bytes(), self.ttl)).await {
            Ok(Ok(lock)) => Ok(lock),
            Ok(Err(e)) => Err(Error::backend("rslock", false, e.to_string())),
            Err(_) => Err(Error::Timeout { key: key.to_owned(), waited: ACQUIRE_LIMIT }),
        }
    }

    async fn release(&self, lock: rslock::Lock) -> Result<()> {
        // rslock's unlock is best effort and reports nothing.
        self.manager.unlock(&lock).await;
        Ok(())
    }
}

/// `distributed-lock-redis` on one Redis server.
struct DistributedLockRedis {
    provider: distributed_lock_redis::RedisLockProvider,
}

impl Locker for DistributedLockRedis {
    type Guard = distributed_lock_redis::RedisLockHandle;

    /// `acquire(Some(timeout))` of this crate does not wait on a single
    /// server: it makes one `SET NX` and returns `Timeout` at once if the key
    /// is busy. So waiting is `try_acquire` in a 1 ms sleep-poll loop, as for
    /// the floor.
    async fn acquire(&self, key: &str) -> Result<distributed_lock_redis::RedisLockHandle> {
        let lock = self.provider.create_lock(key);
        let started = std::time::Instant::now();
        loop {
            match lock.try_acquire().await {
                Ok(Some(handle)) => return Ok(handle),
                Ok(None) if started.elapsed() < ACQUIRE_LIMIT => tokio::time::sleep(Duration::from_millis(1)).await,
                Ok(None) => return Err(Error::Timeout { key: key.to_owned(), waited: started.elapsed() }),
                Err(e) => return Err(Error::backend("distributed-lock-redis", false, e)),
            }
        }
    }

    async fn release(&self, handle: distributed_lock_redis::RedisLockHandle) -> Result<()> {
        handle.release().await.map_err(|e| Error::backend("distributed-lock-redis", false, e))
    }
}

/// `zookeeper-client`'s lock recipe (Curator's `InterProcessMutex`) on one session.
struct ZkRecipe {
    client: zookeeper_client::Client,
}

/// Where the recipe's lock directories live, one per key.
const ZK_PEER_ROOT: &str = "/holdfast-bench/peer";

impl ZkRecipe {
    async fn connect(url: &str) -> Result<Self> {
        let cfg = holdfast::stores::zookeeper::ZkConfig::from_url(url)?;
        let mut connector = zookeeper_client::Client::connector().with_session_timeout(cfg.session_timeout);
        if let Some((user, pass)) = &cfg.credentials {
            connector = connector.with_auth("digest", format!("{user}:{}", pass.expose()).as_bytes());
        }
        match tokio::time::timeout(ACQUIRE_LIMIT, connector.connect(&cfg.connect_string())).await {
            Ok(Ok(client)) => Ok(ZkRecipe { client }),
            Ok(Err(e)) => Err(Error::backend("zookeeper-client", true, e)),
            Err(_) => Err(Error::backend("zookeeper-client", true, "no session within the acquire limit")),
        }
    }
}

impl Locker for ZkRecipe {
    type Guard = zookeeper_client::OwnedLockClient;

    async fn acquire(&self, key: &str) -> Result<zookeeper_client::OwnedLockClient> {
        use zookeeper_client as zk;
        let peer_err = |e: zk::Error| Error::backend("zookeeper-client", false, e);
        let dir = format!("{ZK_PEER_ROOT}/{key}");
        let prefix = zk::LockPrefix::new_curator(&dir, "lock-").map_err(peer_err)?;
        let acls = zk::Acls::anyone_all();
        let options = zk::LockOptions::new(acls)
            .with_ancestor_options(zk::CreateMode::Persistent.with_acls(acls))
            .map_err(peer_err)?;
        match tokio::time::timeout(ACQUIRE_LIMIT, self.client.lock(prefix, b"", options)).await {
            Ok(Ok(lock)) => Ok(lock.into_owned()),
            Ok(Err(e)) => Err(peer_err(e)),
            Err(_) => Err(Error::Timeout { key: key.to_owned(), waited: ACQUIRE_LIMIT }),
        }
    }

    /// The crate's release: dropping the guard deletes the node in the background.
    async fn release(&self, lock: zookeeper_client::OwnedLockClient) -> Result<()> {
        drop(lock);
        Ok(())
    }
}

fn median(mut rounds: Vec<WorkloadResult>) -> Option<WorkloadResult> {
    rounds.sort_by(|a, b| a.cycles_per_sec.total_cmp(&b.cycles_per_sec));
    let mid = rounds.len().checked_sub(1)? / 2;
    Some(rounds.swap_remove(mid))
}

fn progress(e: ProgressEvent) {
    if !matches!(e, ProgressEvent::Tick { .. }) {
        eprintln!("{e}");
    }
}

async fn subject_run<L: Locker>(
    locker: &Arc<L>,
    spec: &CycleSpec,
    counter: Option<&dyn CommandCounter>,
    into: &mut Vec<WorkloadResult>,
) {
    match run_cycles(locker.clone(), spec, counter, &progress).await {
        Ok(r) => into.push(r),
        Err(e) => eprintln!("{} / {}: failed: {e}", spec.workload, spec.subject),
    }
}

#[tokio::main]
async fn main() {
    let args = Cli::parse().args;
    if let Err(e) = bench(&args).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// A run's own key prefix, so that runs never meet each other's keys.
fn run_id() -> String {
    format!("{:016x}", holdfast::OwnerToken::random().as_u128() as u64)
}

/// The cycle workloads asked for, with their task counts.
fn cycle_workloads(opts: &holdfast_bench::BenchOptions) -> Vec<(Workload, usize)> {
    let cycles = |w: &Workload| matches!(w, Workload::Uncontended | Workload::Contended | Workload::ContendedThink);
    let tasks = |w: Workload| if w == Workload::Uncontended { opts.tasks_uncontended } else { opts.tasks_contended };
    opts.workloads.iter().copied().filter(cycles).map(|w| (w, tasks(w))).collect()
}

/// holdfast's ZooKeeper lock, the floor and `zookeeper-client`'s recipe.
async fn bench_zk(args: &holdfast_bench::args::Args) -> Result<()> {
    let opts = args.options();
    let url = opts.url.as_str();
    let counter = command_counter_for(url).await?;
    let holdfast = Arc::new(HoldfastLocker::new(Client::connect(url).await?, opts.ttl, opts.fair));
    let floor_locker = FloorLocker::new(floor_for(url).await?).with_ttl(opts.ttl);
    let floor_description = floor_locker.describe().to_owned();
    let floor = Some(Arc::new(floor_locker)).filter(|_| !args.no_floor);
    let recipe = Arc::new(ZkRecipe::connect(url).await?);
    let run_id = run_id();
    let mut results = Vec::new();
    for (workload, tasks) in cycle_workloads(&opts) {
        let mut by_subject: [Vec<WorkloadResult>; 3] = Default::default();
        for round in 0..opts.rounds {
            let spec =
                |subject: &str| CycleSpec::round_of(&opts, (workload, tasks, Mix::Exclusive), &run_id, round, subject);
            let counter = counter.as_deref();
            subject_run(&holdfast, &spec("holdfast"), counter, &mut by_subject[0]).await;
            if let Some(f) = &floor {
                subject_run(f, &spec("floor"), counter, &mut by_subject[1]).await;
            }
            subject_run(&recipe, &spec("zookeeper-client"), counter, &mut by_subject[2]).await;
        }
        results.extend(by_subject.into_iter().filter_map(median));
    }
    let description = floor.as_ref().map(|_| floor_description);
    let report = BenchReport::new(&opts, "zookeeper", description, results, Vec::new());
    if args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| Error::backend("holdfast-bench", false, e))?;
        println!("{json}");
    } else {
        print!("{report}");
        println!();
        println!("peer: zookeeper-client 0.11 (Client::lock, Curator's InterProcessMutex recipe: EPHEMERAL_SEQUENTIAL");
        println!("      node, children listed, watch on the node ahead; the guard's drop deletes in the background)");
    }
    let _ = std::io::stdout().flush();
    Ok(())
}

async fn bench(args: &holdfast_bench::args::Args) -> Result<()> {
    let opts = args.options();
    let url = opts.url.as_str();
    if url.starts_with("zk://") {
        return bench_zk(args).await;
    }
    // redis:// for one server; redlock://h1:p1,h2:p2,h3:p3 for RedLock over
    // several, where the peers run their own RedLock over the same servers.
    let servers: Vec<String> = if let Some(hosts) = url.strip_prefix("redlock://") {
        hosts.split('?').next().unwrap_or_default().split(',').map(|h| format!("redis://{h}")).collect()
    } else if url.starts_with("redis://") {
        vec![url.to_owned()]
    } else {
        return Err(Error::invalid(
            "url",
            "the peer bench needs a redis://, redlock:// or zk:// URL (its peers are Redis and ZooKeeper locks)",
        ));
    };
    let redlock = url.starts_with("redlock://");
    // Commands are counted on one server: for RedLock, none are.
    let counter = if redlock { None } else { command_counter_for(url).await? };
    // holdfast's Redis store may not be built in yet; then the peers still run.
    let holdfast = match Client::connect(url).await {
        Ok(client) => Some(Arc::new(HoldfastLocker::new(client, opts.ttl, opts.fair))),
        Err(e) => {
            eprintln!("holdfast: cannot connect ({e}); measuring the floor and the peers only");
            None
        }
    };
    // The raw floor is one server's SET NX; RedLock has none.
    let floor_locker = if redlock { None } else { Some(FloorLocker::new(floor_for(url).await?).with_ttl(opts.ttl)) };
    let floor_description = floor_locker.as_ref().map(|f| f.describe().to_owned());
    let floor = floor_locker.filter(|_| !args.no_floor).map(Arc::new);
    let rslock = Arc::new(Rslock { manager: rslock::LockManager::new(servers.clone()), ttl: opts.ttl });
    let dlr = distributed_lock_redis::RedisLockProvider::builder()
        .urls(&servers)
        .expiry(opts.ttl)
        .build()
        .await
        .map_err(|e| Error::backend("distributed-lock-redis", false, e))?;
    let dlr = Arc::new(DistributedLockRedis { provider: dlr });

    let run_id = run_id();
    let mut results = Vec::new();
    for (workload, tasks) in cycle_workloads(&opts) {
        let mut by_subject: [Vec<WorkloadResult>; 4] = Default::default();
        for round in 0..opts.rounds {
            let spec =
                |subject: &str| CycleSpec::round_of(&opts, (workload, tasks, Mix::Exclusive), &run_id, round, subject);
            let counter = counter.as_deref();
            if let Some(h) = &holdfast {
                subject_run(h, &spec("holdfast"), counter, &mut by_subject[0]).await;
            }
            if let Some(f) = &floor {
                subject_run(f, &spec("floor"), counter, &mut by_subject[1]).await;
            }
            subject_run(&rslock, &spec("rslock"), counter, &mut by_subject[2]).await;
            subject_run(&dlr, &spec("distributed-lock-redis"), counter, &mut by_subject[3]).await;
        }
        results.extend(by_subject.into_iter().filter_map(median));
    }
    let store = match (redlock, holdfast.is_some()) {
        (true, _) => "redlock (3 redis-servers)",
        (false, true) => "redis",
        (false, false) => "redis (holdfast store not built in)",
    };
    let report = BenchReport::new(&opts, store, floor.as_ref().and(floor_description), results, Vec::new());
    if args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| Error::backend("holdfast-bench", false, e))?;
        println!("{json}");
    } else {
        print!("{report}");
        println!();
        println!("peers: rslock 0.10 (SET NX PX, retry 3x with up to 200 ms random delay, in a loop),");
        println!("       distributed-lock-redis 0.2 (try_acquire polled every 1 ms: its acquire does not wait on one");
        println!("       server; EVAL compare-and-delete release; an extension task per handle)");
    }
    let _ = std::io::stdout().flush();
    Ok(())
}

/// The command line: the flags of `holdfast bench`.
#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: holdfast_bench::args::Args,
}
