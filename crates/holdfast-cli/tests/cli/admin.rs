//! `holdfast release --force`, `holdfast list`, `holdfast status --watch`.

use std::io::BufRead;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::Env;

#[test]
fn release_without_force_is_refused_with_64() {
    let env = Env::new();
    let lib = env.client();
    let guard = lib.hold("jobs/a");
    let out = env.cmd().args(["release", "--backend", &env.url, "jobs/a"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    crate::assert_one_line(&out.stderr, "--force");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(!lib.is_free("jobs/a"), "a refused release freed the key");
    lib.release(guard);
}

#[test]
fn release_force_prints_the_fence_or_free() {
    let env = Env::new();
    let lib = env.client();
    let guard = lib.rt.block_on(lib.client.mutex("jobs/a").ttl(Duration::from_secs(60)).acquire()).unwrap();
    let out = env.cmd().args(["release", "--backend", &env.url, "--force", "jobs/a", "jobs/free"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines, [format!("jobs/a: released fence {}", guard.fence()).as_str(), "jobs/free: was free"]);
    // Free at once (the TTL is 60 s), with a higher fence.
    let next = lib.rt.block_on(lib.client.mutex("jobs/a").try_acquire()).unwrap().expect("free after --force");
    assert!(next.fence() > guard.fence());
    lib.release(next);
    let out = env.cmd().args(["release", "--backend", &env.url, "--force", ""]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "an empty key: {out:?}");
}

#[test]
fn list_shows_the_held_keys_under_a_prefix() {
    let env = Env::new();
    let lib = env.client();
    let (a, b, c) = (lib.hold("jobs/a"), lib.hold("jobs/b"), lib.hold("other/c"));
    lib.release(lib.hold("jobs/released"));
    let out = env.cmd().args(["list", "--backend", &env.url, "jobs/"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("KEY") && lines[0].contains("FENCE"), "{text}");
    assert!(lines[1].starts_with("jobs/a ") && lines[1].contains(&a.fence().to_string()), "{text}");
    assert!(lines[2].starts_with("jobs/b ") && lines[2].contains("test-holder"), "{text}");

    let out = env.cmd().args(["list", "--backend", &env.url, "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys: Vec<&str> = v.as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["jobs/a", "jobs/b", "other/c"]);
    assert_eq!(v[2]["fence"], c.fence());
    assert_eq!(v[1]["holder"], "test-holder");

    let out = env.cmd().args(["list", "--backend", &env.url, "nothing/"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no held keys under \"nothing/\"");
    let out = env.cmd().args(["list", "--backend", &env.url, "bad\nprefix"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    for g in [a, b, c] {
        lib.release(g);
    }
}

#[test]
fn status_watch_shows_a_change_and_ends_on_ctrl_c() {
    let env = Env::new();
    let lib = env.client();
    let mut child = std::process::Command::new(crate::bin())
        .args(["status", "--watch", "--interval", "100ms", "--backend", &env.url, "jobs/w"])
        .env_remove("HOLDFAST_BACKEND")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let wait_for = |needle: &str, seen: &mut Vec<String>| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    seen.push(line);
                    if hit {
                        return;
                    }
                }
                Err(_) => panic!("--watch never printed {needle:?}; it printed {seen:#?}"),
            }
        }
    };
    wait_for("(free)", &mut seen);
    // Four more reads of an unchanged key print nothing new.
    std::thread::sleep(Duration::from_millis(400));
    seen.extend(rx.try_iter());
    let headers = seen.iter().filter(|l| l.starts_with("-- ")).count();
    assert_eq!(headers, 1, "printed again without a change: {seen:#?}");
    let guard = lib.rt.block_on(lib.client.mutex("jobs/w").ttl(Duration::from_secs(30)).acquire()).unwrap();
    wait_for("test-holder", &mut seen);
    let line = seen.last().unwrap().clone();
    assert!(line.starts_with("jobs/w") && line.contains(&guard.fence().to_string()), "{line}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let status = crate::wait_timeout(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "Ctrl-C should end --watch cleanly");
    lib.release(guard);
}

#[test]
fn release_force_and_list_on_redis() {
    let env = Env::new();
    let redis = holdfast_verify::servers::redis::RedisServer::start();
    let url = redis.url();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let client = rt
        .block_on(holdfast::Client::connect_with(&url, holdfast::ClientOptions::default().with_label("redis-holder")))
        .unwrap();
    let mutex = client.mutex("jobs/r").ttl(Duration::from_secs(30)).renew_every(Duration::from_millis(500));
    let guard = rt.block_on(mutex.acquire()).unwrap();
    let out = env.cmd().args(["list", "--backend", &url, "--json", "jobs/"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert_eq!((v[0]["key"].as_str(), v[0]["holder"].as_str()), (Some("jobs/r"), Some("redis-holder")));
    let out = env.cmd().args(["release", "--backend", &url, "--force", "jobs/r"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("jobs/r: released fence {}", guard.fence()));
    let lost = guard.lost();
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), lost).await }).expect("lost() after --force");
}

/// A holder whose lock was force-released is told that, in one line, and its
/// command is stopped (74): not that its lease "ran out", and no log lines.
#[test]
fn a_force_released_holder_is_told_the_cause() {
    let env = Env::new();
    let ready = env.path("ready");
    let script = format!("touch {}; sleep 30", ready.display());
    let mut child =
        env.run_std("jobs/forced", &["--ttl", "3s"], &["sh", "-c", &script]).stderr(Stdio::piped()).spawn().unwrap();
    crate::wait_for_file(&ready, Duration::from_secs(20));
    env.cmd().args(["release", "--backend", &env.url, "--force", "jobs/forced"]).assert().code(0);
    let status = crate::wait_timeout(&mut child, Duration::from_secs(30));
    let mut stderr = Vec::new();
    std::io::Read::read_to_end(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(i32::from(holdfast_cli::exit::LEASE_LOST)), "{}", String::from_utf8_lossy(&stderr));
    crate::assert_one_line(&stderr, "forced release");
    assert!(!String::from_utf8_lossy(&stderr).contains("ran out"));
}
