//! Tests that need several OS processes. The test binary re-executes itself
//! with `--exact <this test>` and a role in the environment; the test then
//! runs [`child_entry`] first, which plays the role and exits.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::witness::Witness;
use holdfast::Client;

use super::Store;

const ROLE: &str = "HOLDFAST_CHILD_ROLE";
const URL: &str = "HOLDFAST_CHILD_URL";
const KEY: &str = "HOLDFAST_CHILD_KEY";
const DIR: &str = "HOLDFAST_CHILD_DIR";
const CYCLES: &str = "HOLDFAST_CHILD_CYCLES";

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
    let mut children: Vec<_> = (0..processes)
        .map(|_| {
            child(module_path, test, "worker", &store.url, &key)
                .env(DIR, dir.path())
                .env(CYCLES, cycles.to_string())
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn worker")
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
