//! `holdfast status`.

use std::time::Duration;

use crate::Env;

#[test]
fn shows_holder_fence_and_ttl_left_or_free() {
    let env = Env::new();
    let lib = env.client();
    let guard = lib.rt.block_on(lib.client.mutex("orders/42").ttl(Duration::from_secs(20)).acquire()).unwrap();
    let out = env.cmd().args(["status", "--backend", &env.url, "orders/42", "orders/43"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("KEY") && lines[0].contains("HOLDER") && lines[0].contains("TTL LEFT"));
    assert!(lines[1].starts_with("orders/42") && lines[1].contains("test-holder"), "{text}");
    assert!(lines[1].split_whitespace().any(|w| w == guard.fence().to_string()), "{text}");
    assert!(lines[2].starts_with("orders/43") && lines[2].contains("(free)"), "{text}");
    lib.release(guard);
}

#[test]
fn json_output() {
    let env = Env::new();
    let lib = env.client();
    let guard = lib.rt.block_on(lib.client.mutex("a").ttl(Duration::from_secs(20)).acquire()).unwrap();
    let out = env.cmd().args(["status", "--backend", &env.url, "--json", "a", "b"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["key"], "a");
    assert_eq!(rows[0]["held"], true);
    assert_eq!(rows[0]["holder"], "test-holder");
    assert_eq!(rows[0]["fence"], guard.fence());
    let left = rows[0]["ttl_left_ms"].as_u64().unwrap();
    assert!(left > 10_000 && left <= 20_000, "{left}");
    assert!(rows[0]["waiters"].is_null(), "SQLite does not count waiters");
    assert_eq!(rows[1]["held"], false);
    assert!(rows[1]["holder"].is_null() && rows[1]["fence"].is_null());
    lib.release(guard);
}

#[test]
fn shows_the_label_of_a_holdfast_run() {
    let env = Env::new();
    let ready = env.path("ready");
    let script = format!("touch {}; sleep 30", ready.display());
    let mut child = env.run_std("job", &["--label", "backup@db1"], &["sh", "-c", &script]).spawn().unwrap();
    crate::wait_for_file(&ready, Duration::from_secs(10));
    let out = env.cmd().args(["status", "--backend", &env.url, "--json", "job"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["holder"], "backup@db1");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    child.wait().unwrap();
}

#[test]
fn run_and_status_on_every_store() {
    // Inside `holdfast run`, `holdfast status` on the same key shows the run as the holder.
    let env = Env::new();
    for store in crate::stores(&env) {
        let (json, fence) = (env.path(&format!("{}.json", store.name)), env.path(&format!("{}.fence", store.name)));
        let script = format!(
            "\"$0\" status --backend \"$1\" --json shared/key > {}; echo $HOLDFAST_FENCE > {}",
            json.display(),
            fence.display()
        );
        env.cmd()
            .args(["run", "--backend", &store.url, "--key", "shared/key", "--label", "cron@host1", "--"])
            .args(["sh", "-c", &script, crate::bin(), &store.url])
            .assert()
            .code(0);
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let fence: u64 = std::fs::read_to_string(&fence).unwrap().trim().parse().unwrap();
        assert_eq!(v[0]["holder"], "cron@host1", "{}", store.name);
        assert_eq!(v[0]["fence"], fence, "{}", store.name);
        // Released afterwards.
        let out = env.cmd().args(["status", "--backend", &store.url, "--json", "shared/key"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v[0]["held"], false, "{}", store.name);
    }
}
