//! `holdfast run --permits N` and `--shared`, and how `status` shows them.

use std::time::Duration;

use holdfast_cli::exit;

use crate::{Env, wait_for_file, wait_timeout};

/// Starts `holdfast run` with `extra` on `key` running a command that marks
/// `ready` and then waits for `done` to appear.
fn hold(env: &Env, key: &str, extra: &[&str], name: &str) -> std::process::Child {
    let (ready, done) = (env.path(&format!("{name}.ready")), env.path("done"));
    let script = format!("touch {}; while [ ! -e {} ]; do sleep 0.02; done", ready.display(), done.display());
    let child = env.run_std(key, extra, &["sh", "-c", &script]).spawn().expect("spawn holdfast run");
    wait_for_file(&ready, Duration::from_secs(20));
    child
}

fn finish(env: &Env, holders: Vec<std::process::Child>) {
    std::fs::write(env.path("done"), "").unwrap();
    for mut h in holders {
        assert!(wait_timeout(&mut h, Duration::from_secs(20)).success(), "a holding run failed");
    }
}

#[test]
fn permits_let_n_commands_run_at_once_and_status_shows_each() {
    let env = Env::new();
    let holders =
        vec![hold(&env, "partner-api", &["--permits", "2"], "a"), hold(&env, "partner-api", &["--permits", "2"], "b")];
    // A third is busy; a mutex on the same key too.
    env.run("partner-api", &["--permits", "2", "--wait", "0"], &["true"]).assert().code(i32::from(exit::BUSY));
    env.run("partner-api", &["--wait", "0"], &["true"]).assert().code(i32::from(exit::BUSY));
    // Another permit count on the live key is refused, not a second semaphore.
    let out = env.run("partner-api", &["--permits", "3", "--wait", "0"], &["true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("semaphore of 2 permits"), "{out:?}");

    let out = env.cmd().args(["status", "--backend", &env.url, "--json", "partner-api"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["held"], true);
    assert!(v[0]["holder"].is_null(), "no exclusive holder: {v}");
    assert_eq!(v[0]["limit"], 2);
    let shares = v[0]["shared"].as_array().unwrap();
    assert_eq!(shares.len(), 2, "{v}");
    assert!(shares.iter().all(|s| s["weight"] == 1 && s["fence"].as_u64().is_some()), "{v}");
    let table = env.cmd().args(["status", "--backend", &env.url, "partner-api"]).output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert_eq!(text.matches("1 of 2 permits").count(), 2, "{text}");
    finish(&env, holders);
    env.run("partner-api", &["--permits", "2", "--wait", "0"], &["true"]).assert().code(0);
}

#[test]
fn shared_runs_read_together_and_exclude_a_plain_run() {
    let env = Env::new();
    let readers = vec![hold(&env, "config", &["--shared"], "r1"), hold(&env, "config", &["--shared"], "r2")];
    env.run("config", &["--wait", "0"], &["true"]).assert().code(i32::from(exit::BUSY));
    let out = env.cmd().args(["status", "--backend", &env.url, "--json", "config"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["shared"].as_array().unwrap().len(), 2, "{v}");
    assert!(v[0]["limit"].is_null(), "readers have no limit: {v}");
    finish(&env, readers);
    // A plain run (exclusive) keeps readers out.
    std::fs::remove_file(env.path("done")).unwrap();
    let writer = hold(&env, "config", &[], "w");
    env.run("config", &["--shared", "--wait", "0"], &["true"]).assert().code(i32::from(exit::BUSY));
    finish(&env, vec![writer]);
}

#[test]
fn permits_and_shared_together_are_a_usage_error() {
    let env = Env::new();
    let out = env.run("k", &["--permits", "2", "--shared"], &["true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)), "{out:?}");
}
