//! `holdfast run` under faults, on real servers: a command that ignores
//! SIGTERM, holdfast itself killed, a store that dies while holdfast waits.

use std::io::BufRead;
use std::process::Stdio;
use std::time::{Duration, Instant};

use holdfast_cli::exit;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{Env, ends_within, read_pid, wait_for_file, wait_timeout};

/// Nanoseconds since the epoch, as `date +%s%N` writes them, one per line.
fn stamps(text: &str) -> Vec<u128> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[test]
fn a_command_ignoring_sigterm_is_dead_before_the_next_holder_starts_on_every_store() {
    // The first command ignores SIGTERM and stamps the time every 20 ms; its
    // lease runs out (renewal stops after --max-hold). The second `holdfast
    // run` waits for the key, then its command records when it started and
    // the state of the first command's process. Mutual exclusion holds only if
    // the first command was dead (SIGKILLed) before the store let the second in.
    let env = Env::new();
    let mut failures = Vec::new();
    for store in crate::stores(&env) {
        let name = store.name;
        let (pid, stamp_file, next) =
            (env.path(&format!("{name}.pid")), env.path(&format!("{name}.stamps")), env.path(&format!("{name}.next")));
        let first_script = format!(
            "trap '' TERM; echo $$ > {pid}; while :; do date +%s%N >> {stamps}; sleep 0.02; done",
            pid = pid.display(),
            stamps = stamp_file.display()
        );
        let mut first = env
            .run_on(&store.url, "overlap", &["--ttl", "2s", "--max-hold", "500ms"], &["sh", "-c", &first_script])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_file(&stamp_file, Duration::from_secs(20));
        let first_pid = read_pid(&pid);
        let second_script = format!(
            "date +%s%N > {next}; cat /proc/{first_pid}/stat >> {next} 2>/dev/null; true",
            next = next.display()
        );
        let second =
            env.run_on(&store.url, "overlap", &["--wait", "30s"], &["sh", "-c", &second_script]).output().unwrap();
        let first_status = wait_timeout(&mut first, Duration::from_secs(30));
        let mut first_stderr = String::new();
        std::io::Read::read_to_string(first.stderr.as_mut().unwrap(), &mut first_stderr).unwrap();
        assert_eq!(first_status.code(), Some(i32::from(exit::LEASE_LOST)), "{name}: {first_stderr}");
        assert_eq!(second.status.code(), Some(0), "{name}: {}", String::from_utf8_lossy(&second.stderr));

        let next = std::fs::read_to_string(&next).unwrap();
        let (started, first_state) = next.split_once('\n').unwrap_or((next.as_str(), ""));
        let started: u128 = started.trim().parse().unwrap();
        let last = stamps(&std::fs::read_to_string(&stamp_file).unwrap()).into_iter().max().unwrap();
        if last < started {
            eprintln!(
                "{name}: last stamp {:.1} ms before the next holder's command started",
                (started - last) as f64 / 1e6
            );
        }
        // Every store is tried before the test fails, so that one run shows them all.
        if last >= started {
            failures.push(format!(
                "{name}: the first command still ran {:.1} ms after the next holder's command started",
                (last - started) as f64 / 1e6
            ));
        }
        let state = first_state.rsplit(')').next().unwrap_or("").trim_start();
        if !(state.is_empty() || state.starts_with('Z')) {
            let state = state.chars().next();
            failures
                .push(format!("{name}: the first command was alive (state {state:?}) when the next holder's started"));
        }
    }
    assert!(failures.is_empty(), "two holders' commands overlapped:\n{}", failures.join("\n"));
}

#[test]
fn the_command_dies_with_a_killed_holdfast() {
    let env = Env::new();
    let pid_file = env.path("cmd.pid");
    let script = format!("echo $$ > {}; exec sleep 300", pid_file.display());
    let mut holdfast = env.run_std("orphan", &[], &["sh", "-c", &script]).spawn().unwrap();
    wait_for_file(&pid_file, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(100)); // the pid file is written before it is complete
    let pid = read_pid(&pid_file);
    kill(Pid::from_raw(holdfast.id() as i32), Signal::SIGKILL).unwrap();
    holdfast.wait().unwrap();
    assert!(ends_within(pid, Duration::from_secs(1)), "the command {pid} outlived the holdfast that ran it");
}

#[test]
fn a_store_that_dies_while_holdfast_waits_is_69_not_75_on_every_store() {
    // Exit 75 says "busy, try later"; a store that is down must say 69.
    let env = Env::new();
    let mut failures = Vec::new();
    for mut store in crate::stores(&env) {
        let name = store.name;
        let ready = env.path(&format!("{name}.holding"));
        let hold = format!("touch {}; exec sleep 60", ready.display());
        let mut holder =
            env.run_on(&store.url, "down", &[], &["sh", "-c", &hold]).stderr(Stdio::null()).spawn().unwrap();
        wait_for_file(&ready, Duration::from_secs(20));

        let marker = env.path(&format!("{name}.ran"));
        let touch = format!("touch {}", marker.display());
        let mut waiter = env
            .run_on(&store.url, "down", &["--wait", "5s"], &["sh", "-c", &touch])
            .env("RUST_LOG", "holdfast_cli=debug")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = std::io::BufReader::new(waiter.stderr.take().unwrap());
        let mut log = String::new();
        while !log.contains("waiting for the lock") {
            assert!(stderr.read_line(&mut log).unwrap() > 0, "{name}: holdfast never waited: {log}");
        }
        std::thread::sleep(Duration::from_millis(300));
        let sqlite_lock = store.crash(&env);
        let crashed = Instant::now();
        let status = wait_timeout(&mut waiter, Duration::from_secs(40));
        let took = crashed.elapsed();
        std::io::Read::read_to_string(&mut stderr, &mut log).unwrap();
        drop(sqlite_lock);
        let _ = kill(Pid::from_raw(holder.id() as i32), Signal::SIGKILL);
        let _ = holder.wait();
        // Every store is tried before the test fails, so that one run shows them all.
        if status.code() != Some(i32::from(exit::UNAVAILABLE)) {
            failures.push(format!("{name}: exit {:?} after {took:?}, not 69: {}", status.code(), log.trim()));
        }
        assert!(!marker.exists(), "{name}: the command ran without the lock");
        assert!(took < Duration::from_secs(30), "{name}: gave up after {took:?}");

        if name != "sqlite" {
            // Unreachable from the start: the same exit code, within the wait.
            let started = Instant::now();
            let out = env.run_on(&store.url, "down", &["--wait", "5s"], &["sh", "-c", &touch]).output().unwrap();
            let took = started.elapsed();
            if out.status.code() != Some(i32::from(exit::UNAVAILABLE)) {
                let stderr = String::from_utf8_lossy(&out.stderr);
                failures.push(format!("{name} (unreachable): exit {:?}, not 69: {}", out.status.code(), stderr.trim()));
            }
            assert!(took < Duration::from_secs(30), "{name}: {took:?}");
            assert!(!marker.exists());
        }
    }
    assert!(failures.is_empty(), "a failing store must give exit 69:\n{}", failures.join("\n"));
}

#[test]
fn a_killed_run_on_zookeeper_frees_its_key_within_its_ttl() {
    // ZooKeeper frees a dead client's nodes when its session expires: the
    // session timeout must follow --ttl, not ZooKeeper's 10 s default.
    let zk = holdfast_verify::servers::zookeeper::ZkServer::start();
    let env = Env::new();
    let pid_file = env.path("cmd.pid");
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let mut holder = env.run_on(&zk.url(), "zk-ttl", &["--ttl", "2s"], &["sh", "-c", &script]).spawn().unwrap();
    wait_for_file(&pid_file, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(100));
    let cmd_pid = read_pid(&pid_file);
    kill(Pid::from_raw(holder.id() as i32), Signal::SIGKILL).unwrap();
    holder.wait().unwrap();
    let killed = Instant::now();
    // The command itself may outlive holdfast (that is another test); here only the key matters.
    let _ = kill(Pid::from_raw(cmd_pid), Signal::SIGKILL);
    let out = env.run_on(&zk.url(), "zk-ttl", &["--wait", "30s"], &["true"]).output().unwrap();
    let took = killed.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    // TTL 2 s, plus one tick of the server's expiry check, plus connecting.
    assert!(took < Duration::from_secs(5), "the key was freed {took:?} after holdfast died (--ttl 2s)");
}

/// A `holdfast run` stopped (SIGSTOP, a GC pause) past its TTL exits 74
/// once continued, every time, and its command is stopped before it can
/// act on the lost lease for long; meanwhile another holder got the key.
#[test]
fn a_run_paused_past_its_ttl_exits_74_on_every_store() {
    let env = Env::new();
    for store in crate::stores(&env) {
        for round in 0..1 {
            let pid_file = env.path(&format!("paused-{}-{round}.pid", store.name));
            let script = format!("echo $$ > {}; exec sleep 300", pid_file.display());
            let key = format!("paused-{round}");
            let mut holdfast = env.run_on(&store.url, &key, &["--ttl", "1s"], &["sh", "-c", &script]).spawn().unwrap();
            wait_for_file(&pid_file, Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(100));
            let cmd = read_pid(&pid_file);
            let target = Pid::from_raw(holdfast.id() as i32);
            kill(target, Signal::SIGSTOP).unwrap();
            // Past the TTL: the store frees the key and another holder takes it.
            let next = env
                .run_on(&store.url, &key, &["--ttl", "1s", "--wait", "10s"], &["true"])
                .output()
                .expect("the next holder");
            assert_eq!(next.status.code(), Some(0), "{}: the key was not freed: {next:?}", store.name);
            kill(target, Signal::SIGCONT).unwrap();
            let status = wait_timeout(&mut holdfast, Duration::from_secs(10));
            assert_eq!(status.code(), Some(i32::from(exit::LEASE_LOST)), "{} round {round}: {status:?}", store.name);
            assert!(ends_within(cmd, Duration::from_secs(2)), "{}: the command outlived the lost lease", store.name);
        }
    }
}
