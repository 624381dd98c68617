//! `holdfast run`: env vars, exit status, busy, lost lease, signals.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use holdfast_cli::exit;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{Env, assert_one_line, ends_within, read_pid, wait_for_file, wait_timeout};

#[test]
fn sets_key_and_fence_and_passes_the_status_through() {
    let env = Env::new();
    let out_file = env.path("env.txt");
    let script = format!("echo \"$HOLDFAST_KEY $HOLDFAST_FENCE\" >> {}; exit 7", out_file.display());
    env.run("jobs/nightly", &[], &["sh", "-c", &script]).assert().code(7);
    env.run("jobs/nightly", &[], &["sh", "-c", &script]).assert().code(7);
    let text = std::fs::read_to_string(&out_file).unwrap();
    let fences: Vec<u64> = text
        .lines()
        .map(|l| {
            let (key, fence) = l.split_once(' ').unwrap();
            assert_eq!(key, "jobs/nightly");
            fence.parse().unwrap()
        })
        .collect();
    assert_eq!(fences.len(), 2);
    assert!(fences[0] >= 1 && fences[1] > fences[0], "fences must increase: {fences:?}");
    env.run("jobs/nightly", &[], &["true"]).assert().code(0).stdout("").stderr("");
    // The lock is free again.
    assert!(env.client().is_free("jobs/nightly"));
}

#[test]
fn stdout_and_arguments_reach_the_command() {
    let env = Env::new();
    env.run("k", &[], &["echo", "--not-a-holdfast-flag", "two words"])
        .assert()
        .code(0)
        .stdout("--not-a-holdfast-flag two words\n");
}

#[test]
fn death_by_signal_is_128_plus_the_signal() {
    let env = Env::new();
    env.run("k", &[], &["sh", "-c", "kill -KILL $$"]).assert().code(128 + 9);
    env.run("k", &[], &["sh", "-c", "kill -TERM $$"]).assert().code(128 + 15);
    assert!(env.client().is_free("k"));
}

#[test]
fn command_not_found_is_127_and_not_executable_is_126() {
    let env = Env::new();
    let out = env.run("k", &[], &["holdfast-no-such-command-xyz"]).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::NOT_FOUND)));
    assert_one_line(&out.stderr, "command not found");

    let script = env.path("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = env.run("k", &[], &[script.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::NOT_EXECUTABLE)));
    assert_one_line(&out.stderr, "not-executable.sh");
    // The lock taken for the command that could not start was released.
    assert!(env.client().is_free("k"));
}

#[test]
fn busy_lock_gives_75_at_once_with_wait_zero_and_after_the_wait() {
    let env = Env::new();
    let lib = env.client();
    let guard = lib.hold("busy");
    let marker = env.path("ran");
    let touch = format!("touch {}", marker.display());

    let started = Instant::now();
    let out = env.run("busy", &["--wait", "0"], &["sh", "-c", &touch]).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::BUSY)));
    assert_one_line(&out.stderr, "busy");
    assert!(started.elapsed() < Duration::from_secs(5), "--wait 0 must not wait: {:?}", started.elapsed());

    let started = Instant::now();
    let out = env.run("busy", &["--wait", "400ms"], &["sh", "-c", &touch]).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::BUSY)));
    assert_one_line(&out.stderr, "busy");
    assert!(started.elapsed() >= Duration::from_millis(400), "gave up early: {:?}", started.elapsed());
    assert!(!marker.exists(), "the command must not run without the lock");

    // The holder is still the holder: holdfast left nothing behind.
    let st = lib.rt.block_on(lib.client.status("busy")).unwrap();
    assert_eq!(st.holder.map(|h| h.fence), Some(guard.fence()));
    lib.release(guard);
}

#[test]
fn waits_for_a_busy_lock_and_runs_once_it_is_free() {
    let env = Env::new();
    let lib = env.client();
    let guard = lib.hold("queue");
    let child = env
        .run_std("queue", &["--wait", "20s"], &["sh", "-c", "echo $HOLDFAST_FENCE"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let held_fence = guard.fence();
    lib.release(guard);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let fence: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(fence > held_fence);
}

#[test]
fn lease_lost_by_max_hold_stops_the_command_with_74() {
    let env = Env::new();
    let marker = env.path("finished");
    let script = format!("sleep 30; touch {}", marker.display());
    let started = Instant::now();
    let out = env.run("capped", &["--ttl", "300ms", "--max-hold", "200ms"], &["sh", "-c", &script]).output().unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(i32::from(exit::LEASE_LOST)), "{}", String::from_utf8_lossy(&out.stderr));
    assert_one_line(&out.stderr, "lost");
    // Lost after ~0.5 s (200 ms hold cap + one 300 ms TTL); SIGTERM stops sh and sleep at once.
    assert!(took < Duration::from_secs(10), "the command was not stopped promptly: {took:?}");
    assert!(!marker.exists());
}

#[test]
fn a_command_ignoring_sigterm_gets_sigkill_after_the_grace() {
    let env = Env::new();
    let pid_file = env.path("sleep.pid");
    // SIG_IGN is inherited across exec: both sh and its sleep ignore SIGTERM.
    let script = format!("trap '' TERM; sleep 30 & echo $! > {}; wait", pid_file.display());
    let started = Instant::now();
    let out = env
        .run("stubborn", &["--ttl", "3s", "--max-hold", "100ms", "--kill-after", "700ms"], &["sh", "-c", &script])
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(i32::from(exit::LEASE_LOST)));
    assert!(took >= Duration::from_millis(700), "SIGKILL came before the grace: {took:?}");
    assert!(took < Duration::from_secs(10), "SIGKILL came late: {took:?}");
    // The whole process group was killed, the grandchild too.
    let pid = read_pid(&pid_file);
    assert!(ends_within(pid, Duration::from_secs(2)), "the grandchild {pid} survived");
}

#[test]
fn lease_lost_when_the_store_cannot_renew_stops_the_command() {
    // The real fault: another process holds SQLite's write lock, renewal
    // cannot commit, the lease runs out. No testing hook involved.
    let env = Env::new();
    let ready = env.path("ready");
    let script = format!("touch {}; sleep 30", ready.display());
    let mut child = env
        .run_std("starved", &["--ttl", "1s"], &["sh", "-c", &script])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_file(&ready, Duration::from_secs(10));
    let db = rusqlite::Connection::open(env.path("locks.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let locked_at = Instant::now();
    let status = wait_timeout(&mut child, Duration::from_secs(15));
    let took = locked_at.elapsed();
    db.execute_batch("ROLLBACK").unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(i32::from(exit::LEASE_LOST)), "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
    // Lost about one TTL after the store went dark (generous bound for a loaded machine;
    // the command itself would have run 30 s).
    assert!(took < Duration::from_secs(10), "lost() fired late: {took:?}");
}

#[test]
fn sigterm_is_forwarded_and_the_lock_released_afterwards() {
    let env = Env::new();
    let (ready, got) = (env.path("ready"), env.path("got-term"));
    let script = format!(
        "trap 'echo got-term > {got}; kill $p 2>/dev/null; exit 0' TERM; sleep 30 & p=$!; touch {ready}; wait",
        got = got.display(),
        ready = ready.display()
    );
    let mut child = env.run_std("fwd", &[], &["sh", "-c", &script]).spawn().unwrap();
    wait_for_file(&ready, Duration::from_secs(10));
    let lib = env.client();
    assert!(!lib.is_free("fwd"), "the lock must be held while the command runs");
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "the command handled SIGTERM and exited 0");
    assert_eq!(std::fs::read_to_string(&got).unwrap().trim(), "got-term");
    assert!(lib.is_free("fwd"), "the lock must be released after the command exits");
}

#[test]
fn sigint_is_forwarded_and_its_death_reported_as_130() {
    let env = Env::new();
    let ready = env.path("ready");
    let script = format!("touch {}; exec sleep 30", ready.display());
    let mut child = env.run_std("int", &[], &["sh", "-c", &script]).spawn().unwrap();
    wait_for_file(&ready, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(100)); // let sh exec sleep
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + 2));
    assert!(env.client().is_free("int"));
}

#[test]
fn a_signal_while_waiting_gives_up_without_running_the_command() {
    let env = Env::new();
    let lib = env.client();
    let guard = lib.hold("w");
    let marker = env.path("ran");
    let touch = format!("touch {}", marker.display());
    let mut child = env
        .run_std("w", &[], &["sh", "-c", &touch])
        .env("RUST_LOG", "holdfast_cli=debug")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Signal only once holdfast is waiting (its signal handlers are in place by then).
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("waiting for the lock") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() > 0, "holdfast never waited");
    }
    std::thread::sleep(Duration::from_millis(200));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + 15));
    assert!(!marker.exists());
    let fence = guard.fence();
    lib.release(guard);
    // The waiter left nothing behind: the next grant is free and fenced above ours.
    let next = lib.hold("w");
    assert!(next.fence() > fence);
    lib.release(next);
}

#[test]
fn runs_under_a_fallback_chain_url() {
    // The chain's default 10 s mode lease: a lease is believed at most 5 s
    // ahead, so `--kill-after` plus the margin must stay under about 3 s.
    let env = Env::new();
    let url =
        format!("fallback://sqlite://{}|sqlite://{}", env.path("first.db").display(), env.path("arbiter.db").display());
    let mut fences = Vec::new();
    for _ in 0..2 {
        let out = env
            .run_on(&url, "jobs/chained", &["--kill-after", "2s"], &["sh", "-c", "sleep 4; echo $HOLDFAST_FENCE"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
        fences.push(String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().expect("a fence"));
    }
    assert!(fences[1] > fences[0], "fences must increase: {fences:?}");
}

/// Without CMD, `run` holds the lock until a signal, as `etcdctl lock` does,
/// then releases it and exits 0.
#[test]
fn without_a_command_the_lock_is_held_until_a_signal() {
    let env = Env::new();
    let mut child = std::process::Command::new(crate::bin())
        .env_remove("HOLDFAST_BACKEND")
        .env_remove("RUST_LOG")
        .args(["run", "--backend", &env.url, "--key", "held"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let lib = env.client();
    let st = lib.rt.block_on(lib.client.status("held")).unwrap();
    let fence = st.holder.map(|h| h.fence).expect("held while holdfast runs");
    assert_eq!(line, format!("holding \"held\" with fence {fence}\n"));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(0));
    assert!(lib.is_free("held"), "released on the signal");
}
