//! Tests that need several OS processes. The test binary re-executes itself
//! with `--exact <this test>` and a role in the environment; the test then
//! runs [`child_entry`] first, which plays the role and exits.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::witness::{SharedWitness, Witness};
use holdfast::Client;

use super::Store;

const ROLE: &str = "HOLDFAST_CHILD_ROLE";
const URL: &str = "HOLDFAST_CHILD_URL";
const KEY: &str = "HOLDFAST_CHILD_KEY";
const DIR: &str = "HOLDFAST_CHILD_DIR";
const CYCLES: &str = "HOLDFAST_CHILD_CYCLES";
const PERMITS: &str = "HOLDFAST_CHILD_PERMITS";

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child process without {name}"))
}

/// In a child process (role set in the environment), plays the role and
/// exits; otherwise returns at once.
pub fn child_entry<S>(_start: &S) {
    let Ok(role) = std::env::var(ROLE) else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    rt.block_on(async {
        let client = Client::connect(&env(URL)).await.expect("child connect");
        let key = env(KEY);
        match role.as_str() {
            "hold" => {
                let g = client.mutex(&key).ttl(Duration::from_secs(1)).acquire().await.expect("child acquire");
                println!("HOLDFAST_FENCE {}", g.fence());
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            "worker" => {
                let witness = Witness::new(env(DIR)).expect("witness");
                let cycles: u64 = env(CYCLES).parse().expect("cycles");
                for _ in 0..cycles {
                    let g = client
                        .mutex(&key)
                        .ttl(Duration::from_secs(10))
                        .acquire_timeout(Duration::from_secs(120))
                        .await
                        .expect("worker acquire");
                    let inside = witness.enter(g.fence()).expect("enter");
                    let n = witness.counter().expect("read counter");
                    tokio::task::yield_now().await;
                    witness.set_counter(n + 1).expect("write counter");
                    witness.exit(inside).expect("exit");
                    g.release().await.expect("worker release");
                }
            }
            "permit-worker" => {
                // Two tasks per process on a semaphore of PERMITS, each
                // asking for 1 or 2 permits per cycle.
                let witness = SharedWitness::new(env(DIR)).expect("witness");
                let cycles: u32 = env(CYCLES).parse().expect("cycles");
                let permits: u32 = env(PERMITS).parse().expect("permits");
                let tasks = (0..2u32).map(|t| {
                    let (sem, witness) =
                        (client.semaphore(&key, permits).ttl(Duration::from_secs(10)), witness.clone());
                    async move {
                        for c in 0..cycles {
                            let n = 1 + (t + c) % 2;
                            let p = sem.acquire_many_timeout(n, Duration::from_secs(120)).await.expect("permits");
                            let inside = witness.enter_permits(n, permits).expect("enter");
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            witness.exit(inside).expect("exit");
                            p.release().await.expect("release permits");
                        }
                    }
                });
                futures::future::join_all(tasks).await;
            }
            "rw-worker" => {
                // Three readers and one writer per process.
                let witness = SharedWitness::new(env(DIR)).expect("witness");
                let cycles: u32 = env(CYCLES).parse().expect("cycles");
                let tasks = (0..4u32).map(|t| {
                    let (lock, witness) = (client.rwlock(&key), witness.clone());
                    async move {
                        for c in 0..cycles {
                            if t == 0 {
                                let g = lock.write().acquire_timeout(Duration::from_secs(120)).await.expect("write");
                                let inside = witness.enter_writer().expect("enter");
                                tokio::time::sleep(Duration::from_millis(2)).await;
                                witness.exit(inside).expect("exit");
                                g.release().await.expect("release");
                            } else {
                                let g = lock.read().acquire_timeout(Duration::from_secs(120)).await.expect("read");
                                let me = format!("{}-{t}-{c}", std::process::id());
                                let inside = witness.enter_reader(&me).expect("enter");
                                tokio::time::sleep(Duration::from_millis(3)).await;
                                witness.exit(inside).expect("exit");
                                g.release().await.expect("release");
                            }
                        }
                    }
                });
                futures::future::join_all(tasks).await;
            }
            other => panic!("unknown child role {other}"),
        }
    });
    std::process::exit(0);
}

fn child(module_path: &str, test: &str, role: &str, url: &str, key: &str) -> Command {
    let exe = std::env::current_exe().expect("current_exe");
    // module_path!() starts with the test binary's crate name, which libtest omits.
    let path = module_path.split_once("::").map_or("", |(_, rest)| rest);
    let name = if path.is_empty() { test.to_owned() } else { format!("{path}::{test}") };
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", &name, "--nocapture", "--test-threads", "1"])
        .env(ROLE, role)
        .env(URL, url)
        .env(KEY, key)
        .stdin(Stdio::null());
    cmd
}

/// The worker processes of a process test.
struct Workers<'a> {
    role: &'a str,
    processes: u64,
    cycles: u64,
    /// More environment for each worker.
    extra: &'a [(&'a str, String)],
}

/// Runs the workers on `key` until they all exit (180 s at most), each with
/// `dir` and the cycle count in its environment.
fn run_children(module_path: &str, test: &str, store: &Store, key: &str, dir: &Path, workers: Workers<'_>) {
    let Workers { role, processes, cycles, extra } = workers;
    let mut children: Vec<_> = (0..processes)
        .map(|_| {
            let mut cmd = child(module_path, test, role, &store.url, key);
            cmd.env(DIR, dir).env(CYCLES, cycles.to_string()).stdout(Stdio::null());
            for (k, v) in extra {
                cmd.env(k, v);
            }
            cmd.spawn().expect("spawn worker")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(180);
    for c in &mut children {
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                assert!(status.success(), "a worker process failed: {status}");
                break;
            }
            if Instant::now() > deadline {
                for c in &mut children {
                    let _ = c.kill();
                }
                panic!("worker processes did not finish in 180 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether the store under test declares shared leases (checked in a
/// runtime of its own, for the process tests).
fn store_declares_shared(store: &Store) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    rt.block_on(async { super::client(store, "shared-probe").await.capabilities().shared_leases })
}

/// C12 across processes: 3 OS processes of 2 tasks each take 1 or 2 of 3
/// permits per cycle; a witness outside the store (slot files created with
/// `O_EXCL`) never sees more than 3 taken.
pub fn c12_permit_bound_processes<S: Fn() -> Store>(module_path: &str, test: &str, start: &S) {
    let store = start();
    if !store_declares_shared(&store) {
        return; // c12_permit_bound checks that the store refuses semaphores
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let key = super::fresh_key("c12-processes");
    let extra = [(PERMITS, "3".to_owned())];
    let workers = Workers { role: "permit-worker", processes: 3, cycles: 15, extra: &extra };
    run_children(module_path, test, &store, &key, dir.path(), workers);
    let seen = SharedWitness::new(dir.path()).expect("witness").violations().expect("violations");
    assert!(seen.is_empty(), "the permit bound broke across processes: {seen:?}");
}

/// C14 across processes: 3 OS processes of three readers and one writer
/// each; a witness outside the store never sees a writer with anyone else.
pub fn c14_read_write_processes<S: Fn() -> Store>(module_path: &str, test: &str, start: &S) {
    let store = start();
    if !store_declares_shared(&store) {
        return; // c14_read_share_write_exclusion checks that the store refuses them
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let key = super::fresh_key("c14-processes");
    let workers = Workers { role: "rw-worker", processes: 3, cycles: 12, extra: &[] };
    run_children(module_path, test, &store, &key, dir.path(), workers);
    let seen = SharedWitness::new(dir.path()).expect("witness").violations().expect("violations");
    assert!(seen.is_empty(), "read-write exclusion broke across processes: {seen:?}");
}

/// N OS processes each take the lock K times and increment a counter kept in
/// a file: the count is exact, no two holders are ever inside, and fences
/// increase strictly in grant order.
pub fn multi_process<S: Fn() -> Store>(module_path: &str, test: &str, start: &S) {
    let store = start();
    let (processes, cycles) = (4u64, 25u64);
    let dir = tempfile::tempdir().expect("tempdir");
    let witness = Witness::new(dir.path()).expect("witness");
    witness.reset(0).expect("reset");
    let key = super::fresh_key("multi-process");
    let workers = Workers { role: "worker", processes, cycles, extra: &[] };
    run_children(module_path, test, &store, &key, dir.path(), workers);
    let report = witness.report().expect("report");
    assert_eq!(report.overlaps, 0, "two holders were inside at once: {report:?}");
    assert_eq!(report.counter, (processes * cycles) as i64, "lost updates: {report:?}");
    assert_eq!(report.entries, processes * cycles);
    assert!(report.fences_increasing, "fences did not increase in grant order");
    drop(store);
}

/// C3 with a real process: a holder killed with SIGKILL frees the key within
/// its TTL (1 s) plus the store's slack, and the next fence is higher.
pub fn c3_expiry_killed_process<S: Fn() -> Store>(module_path: &str, test: &str, start: &S) {
    let store = start();
    let key = super::fresh_key("c3-kill");
    let mut holder =
        child(module_path, test, "hold", &store.url, &key).stdout(Stdio::piped()).spawn().expect("spawn holder");
    let stdout = holder.stdout.take().expect("stdout");
    let fence: u64 = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.split_once("HOLDFAST_FENCE ").and_then(|(_, f)| f.trim().parse().ok()))
        .expect("holder printed no fence");
    holder.kill().expect("SIGKILL holder");
    let killed = Instant::now();
    let _ = holder.wait();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("rt");
    let next = rt.block_on(async {
        let c = super::client(&store, "c3-kill").await;
        let g = c
            .mutex(&key)
            .acquire_timeout(Duration::from_secs(1) + store.expiry_slack + Duration::from_secs(10))
            .await
            .expect("key never freed after the holder was killed");
        let f = g.fence();
        g.release().await.expect("release");
        f
    });
    let took = killed.elapsed();
    assert!(took <= Duration::from_secs(1) + store.expiry_slack + Duration::from_secs(1), "freed after {took:?}");
    assert!(next > fence, "fence {next} after the killed holder's {fence}");
    drop(store);
}
