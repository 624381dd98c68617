//! `holdfast bench --held N` and `--hot W --procs P`: they run at small scale
//! on SQLite and Redis, print their figures (table and JSON), and reject bad
//! sizes with a usage error. Figures are checked for what must hold at any
//! speed (nothing lost, every task acquired, counts add up), never for timings.

use holdfast_verify::servers::redis::RedisServer;
use serde_json::Value;

use crate::Env;

fn bench_json(env: &Env, url: &str, args: &[&str]) -> Value {
    let out = env.cmd().args(["bench", "--backend", url, "--json"]).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "bench {args:?} failed: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn u(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} is not a count in {v:#}"))
}

fn f(v: &Value, field: &str) -> f64 {
    v[field].as_f64().unwrap_or_else(|| panic!("{field} is not a number in {v:#}"))
}

fn check_held(held: &Value, leases: u64) {
    assert_eq!(u(held, "leases"), leases);
    assert_eq!(u(held, "renewing"), leases, "every lease renewed: {held:#}");
    assert_eq!((u(held, "lost"), u(held, "lost_fired"), u(held, "release_errors")), (0, 0, 0), "{held:#}");
    assert!(u(&held["idle_probe"], "samples") > 0 && u(&held["probe"], "samples") > 0, "{held:#}");
    assert_eq!((u(&held["idle_probe"], "errors"), u(&held["probe"], "errors")), (0, 0), "{held:#}");
    assert!(f(held, "probe_p99_over_idle") > 0.0, "{held:#}");
    assert_eq!(u(&held["acquire"], "ops"), leases);
    assert!(f(&held["acquire_first"], "per_sec") > 0.0 && f(&held["acquire_last"], "per_sec") > 0.0, "{held:#}");
    assert_eq!(u(&held["release"], "ops"), leases);
}

fn check_hot(hot: &Value, tasks: u64, procs: u64) {
    assert_eq!((u(hot, "tasks"), u(hot, "procs")), (tasks, procs));
    assert!(u(hot, "acquisitions") >= tasks, "{hot:#}");
    assert_eq!((u(hot, "never_acquired"), u(hot, "overlaps"), u(hot, "release_errors")), (0, 0, 0), "{hot:#}");
    assert!(u(hot, "per_task_min") >= 1 && u(hot, "per_task_max") >= u(hot, "per_task_min"), "{hot:#}");
    // At least one acquire and one release call per acquisition.
    assert!(f(hot, "library_calls_per_acquisition") >= 2.0, "{hot:#}");
    assert!(f(hot, "longest_wait_ms") > 0.0 && f(hot, "per_sec") > 0.0, "{hot:#}");
}

#[test]
fn held_and_hot_print_their_figures_on_sqlite() {
    let env = Env::new();
    let out = env.cmd().args(["bench", "--backend", &env.url, "--held", "200", "--duration", "2s"]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}{}", String::from_utf8_lossy(&out.stderr));
    for field in [
        "(sqlite)",
        "cores",
        "held: 200 leases",
        "acquire, first",
        "acquire, last",
        "memory per held lease",
        "probe on the idle client",
        "probe while holding",
        "leases lost",
        "renew calls per period",
        "release, all",
    ] {
        assert!(table.contains(field), "no {field:?} in:\n{table}");
    }
    assert!(!table.contains("uncontended"), "the default workloads do not run with --held:\n{table}");

    let report = bench_json(&env, &env.url, &["--hot", "8", "--procs", "2", "--duration", "1s"]);
    check_hot(&report["hot"], 8, 2);
    assert!(report["hot"]["store_commands_per_acquisition"].is_null(), "SQLite cannot count its statements");
    assert!(report["machine"]["cores"].as_u64().is_some_and(|c| c >= 1) && report["machine"]["date"].is_string());
    assert!(report["results"].as_array().is_some_and(|r| r.is_empty()));
}

#[test]
fn held_and_hot_count_server_commands_on_redis() {
    let env = Env::new();
    let redis = RedisServer::start();
    let report =
        bench_json(&env, &redis.url(), &["--held", "200", "--duration", "1s", "--lease-ttl", "900ms", "--churn"]);
    let held = &report["held"];
    check_held(held, 200);
    assert!(u(held, "renew_calls") > 0 && u(held, "largest_renew_batch") > 0, "renewal ran: {held:#}");
    assert!(f(held, "store_commands_per_period") > 0.0, "{held:#}");
    assert!(u(held, "churn_cycles") > 0 && u(held, "churn_errors") == 0, "{held:#}");

    let report = bench_json(&env, &redis.url(), &["--hot", "8", "--procs", "2", "--duration", "1s"]);
    let hot = &report["hot"];
    check_hot(hot, 8, 2);
    // An acquisition is at least one script call to acquire and one to release.
    assert!(f(hot, "store_requests_per_acquisition") >= 2.0, "{hot:#}");
    assert!(f(hot, "store_commands_per_acquisition") >= f(hot, "store_requests_per_acquisition"), "{hot:#}");
    assert!(hot["permits"].is_null(), "a mutex by default: {hot:#}");

    // A semaphore of 3 on the hot key: never more than 3 of a process's
    // tasks inside at once (counted as overlaps), every task served.
    let report =
        bench_json(&env, &redis.url(), &["--hot", "8", "--procs", "2", "--hot-permits", "3", "--duration", "1s"]);
    let hot = &report["hot"];
    check_hot(hot, 8, 2);
    assert_eq!(u(hot, "permits"), 3, "{hot:#}");
}

/// A semaphore asked of a store without shared leases (RedLock): refused
/// before the run starts, in one line that names the store and the flag.
#[test]
fn hot_permits_on_redlock_is_refused_up_front() {
    let env = Env::new();
    let members: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let addrs: Vec<String> = members.iter().map(|m| m.url().trim_start_matches("redis://").to_owned()).collect();
    let url = format!("redlock://{}", addrs.join(","));
    let out = env.cmd().args(["bench", "--backend", &url, "--hot", "4", "--hot-permits", "2"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", String::from_utf8_lossy(&out.stderr));
    crate::assert_one_line(&out.stderr, "redlock store does not support semaphores (--hot-permits)");
}

#[test]
fn bad_scale_sizes_are_usage_errors() {
    let env = Env::new();
    for (args, needle) in [
        (&["--held", "0"][..], "at least 1"),
        (&["--hot", "8", "--procs", "0"], "at least 1"),
        (&["--hot", "0"], "at least 1"),
        (&["--procs", "2"], "--hot"),
        (&["--hot", "4", "--hold-ms", "99999"], "between 0"),
        (&["--hot", "4", "--hot-permits", "0"], "at least 1"),
        (&["--hot-permits", "2"], "--hot"),
        (&["--hot", "4", "--hot-permits", "2", "--fair"], "--fair"),
    ] {
        let out = env.cmd().args(["bench", "--backend", &env.url]).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(needle) && !stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    // Checked by the bench itself, not by the flag parser: one line, exit 64.
    let out = env.cmd().args(["bench", "--backend", &env.url, "--hot", "2", "--procs", "3"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    crate::assert_one_line(&out.stderr, "3 processes for 2 tasks");
}
