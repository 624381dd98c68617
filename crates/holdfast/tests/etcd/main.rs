//! etcd-specific tests: fairness across clients, status, session loss, the
//! key watch, cleanup, and failover on a real three-member cluster.
#![cfg(feature = "etcd")]

mod failover;
mod late_copy;
mod queue;
mod session;
mod store;
mod watch;

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use holdfast::{Client, ClientOptions, Error};
use holdfast_testkit::conformance::Store;
use holdfast_testkit::servers::etcd::EtcdCluster;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

async fn client(url: &str, label: &str) -> Client {
    Client::connect_with(url, ClientOptions::default().with_label(label)).await.expect("connect")
}

async fn raw(url: &str) -> etcd_client::Client {
    let endpoints: Vec<String> = url.trim_start_matches("etcd://").split(',').map(|h| format!("http://{h}")).collect();
    etcd_client::Client::connect(endpoints, None).await.expect("raw etcd client")
}

/// Keys under holdfast's default prefix.
async fn holdfast_keys(url: &str) -> Vec<String> {
    let resp = raw(url)
        .await
        .get("holdfast/", Some(etcd_client::GetOptions::new().with_prefix().with_keys_only()))
        .await
        .expect("get");
    resp.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect()
}

/// The keys of lock `lock` (default prefix, no `/` in the name) with their
/// session lease ids, oldest first: the holder, then the waiters in order.
async fn queue_of(url: &str, lock: &str) -> Vec<(String, i64)> {
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_sort(etcd_client::SortTarget::Create, etcd_client::SortOrder::Ascend);
    let resp = raw(url).await.get(format!("holdfast/{lock}/"), Some(opts)).await.expect("get");
    resp.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.lease())).collect()
}

/// Runs `etcdctl` against the first endpoint of `url`, as an operator would.
fn etcdctl(url: &str, args: &[&str]) {
    let etcdctl = holdfast_testkit::servers::require_binary("etcdctl", &[], "etcd-client");
    let host = url.trim_start_matches("etcd://").split(',').next().unwrap_or_default();
    let out = Command::new(etcdctl).arg(format!("--endpoints=http://{host}")).args(args).output().expect("run etcdctl");
    assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Child processes: a test re-executes this binary with `--exact <test>` and
/// a role in the environment, and calls [`child_entry`] first, which plays
/// the role and exits.
const CHILD_ROLE: &str = "HOLDFAST_ETCD_CHILD_ROLE";
const CHILD_URL: &str = "HOLDFAST_ETCD_CHILD_URL";
const CHILD_KEY: &str = "HOLDFAST_ETCD_CHILD_KEY";

/// In a child process, plays its role and exits; otherwise returns at once.
///
/// Role `wait`: waits up to 30 s for the key with a 1 s TTL (a session lease
/// of 2 s), prints `GRANTED <fence>`, releases and exits 0; on an error,
/// prints it and exits 1.
fn child_entry() {
    let Ok(role) = std::env::var(CHILD_ROLE) else { return };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("child process without {name}"));
    let code = rt().block_on(async {
        let c = client(&var(CHILD_URL), "child").await;
        match role.as_str() {
            "wait" => {
                let m = c.mutex(var(CHILD_KEY)).ttl(Duration::from_secs(1));
                match m.acquire_timeout(Duration::from_secs(30)).await {
                    Ok(g) => {
                        println!("GRANTED {}", g.fence());
                        g.release().await.map_or(1, |_| 0)
                    }
                    Err(e) => {
                        println!("FAILED {e}");
                        1
                    }
                }
            }
            other => panic!("unknown child role {other}"),
        }
    });
    std::process::exit(code);
}

/// Starts this test binary as a child playing `role` in test `test` (its
/// path inside this binary, e.g. `session::some_test`).
fn spawn_child(test: &str, role: &str, url: &str, key: &str) -> ChildProcess {
    let exe = std::env::current_exe().expect("current_exe");
    Command::new(exe)
        .args(["--exact", &test_name(test), "--nocapture", "--test-threads", "1"])
        .env(CHILD_ROLE, role)
        .env(CHILD_URL, url)
        .env(CHILD_KEY, key)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map(ChildProcess)
        .expect("spawn child")
}

/// A child process, SIGKILLed on drop if it still runs (a failed test must
/// not leave it behind).
struct ChildProcess(std::process::Child);

impl ChildProcess {
    /// Sends `signal` (`STOP`, `CONT`) with `kill -s`.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args(["-s", signal, &self.0.id().to_string()]).status().expect("kill");
        assert!(status.success(), "kill -s {signal} failed");
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The full name of test `name` (`session::...`) under this module, for
/// `--exact` when the binary re-runs itself (the crate's name left off).
fn test_name(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_owned(),
    }
}
