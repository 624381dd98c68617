//! `holdfast run` for cron and on-call: the busy message names the holder,
//! `--busy-exit CODE` and `--quiet` for skipped runs, `--fair` for a queue.

use std::time::{Duration, Instant};

use holdfast_cli::exit;
use holdfast_verify::servers::redis::RedisServer;

use crate::{Env, Lib, assert_one_line, wait_timeout};

#[test]
fn the_busy_message_names_the_holder_its_fence_and_ttl_left() {
    let env = Env::new();
    let lib = env.client();
    let guard = lib.hold("x");
    for extra in [&["--wait", "0"][..], &["--wait", "300ms"]] {
        let out = env.run("x", extra, &["true"]).output().unwrap();
        assert_eq!(out.status.code(), Some(i32::from(exit::BUSY)), "{extra:?}");
        let needle = format!("lock \"x\" is busy: held by test-holder (fence {}, ", guard.fence());
        assert_one_line(&out.stderr, &needle);
        assert_one_line(&out.stderr, " left)");
    }
    lib.release(guard);
}

#[test]
fn busy_exit_and_quiet_choose_what_a_skipped_run_says() {
    let env = Env::new();
    let lib = env.client();
    let guard = lib.hold("cron");
    let marker = env.path("ran");
    let touch = format!("touch {}", marker.display());
    // flock's -E: the code is the caller's; the message stays.
    let out = env.run("cron", &["--wait", "0", "--busy-exit", "3"], &["sh", "-c", &touch]).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_one_line(&out.stderr, "is busy");
    // --quiet: nothing at all on a skip, the code still tells.
    env.run("cron", &["--wait", "0", "--quiet"], &["sh", "-c", &touch]).assert().code(i32::from(exit::BUSY)).stderr("");
    env.run("cron", &["-q", "--wait", "100ms", "--busy-exit", "0"], &["sh", "-c", &touch])
        .assert()
        .code(0)
        .stdout("")
        .stderr("");
    assert!(!marker.exists(), "the command ran without the lock");
    // --quiet keeps the errors that are not a skip.
    lib.release(guard);
    let out = env.run("cron", &["-q", "--busy-exit", "0"], &["holdfast-no-such-command-xyz"]).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::NOT_FOUND)));
    assert_one_line(&out.stderr, "command not found");
}

#[test]
fn fair_needs_a_store_that_queues_and_excludes_permits_and_shared() {
    let env = Env::new();
    let out = env.run("k", &["--fair"], &["true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)));
    assert_one_line(&out.stderr, "does not support");
    for extra in [&["--fair", "--permits", "2"][..], &["--fair", "--shared"]] {
        let out = env.run("k", extra, &["true"]).output().unwrap();
        assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)), "{extra:?}");
    }
}

/// Three `run --fair` queue on Redis behind a holder, each started once the
/// one before is queued; released, they run in the order they came.
#[test]
fn fair_runs_take_the_lock_in_the_order_they_asked() {
    let env = Env::new();
    let redis = RedisServer::start();
    let url = redis.url();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let client = rt.block_on(holdfast::Client::connect(&url)).expect("connect");
    let lib = Lib { client, rt };
    let guard = lib.hold("queue");
    let order = env.path("order");
    let mut children = Vec::new();
    for name in ["a", "b", "c"] {
        let script = format!("echo {name} >> {}", order.display());
        children.push(env.run_on(&url, "queue", &["--fair", "--wait", "60s"], &["sh", "-c", &script]).spawn().unwrap());
        // Queued when the store counts it as a waiter.
        let deadline = Instant::now() + Duration::from_secs(30);
        let queued = children.len() as u64;
        loop {
            let waiters = lib.rt.block_on(lib.client.status("queue")).unwrap().waiters.unwrap_or(0);
            if waiters >= queued {
                break;
            }
            assert!(Instant::now() < deadline, "{name} never queued ({waiters} waiters)");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    lib.release(guard);
    for mut child in children {
        assert!(wait_timeout(&mut child, Duration::from_secs(60)).success());
    }
    assert_eq!(std::fs::read_to_string(&order).unwrap(), "a\nb\nc\n");
}

/// On a terminal, a waiting `run` shows one line saying who holds the lock;
/// off it (every other test here) nothing is shown while waiting.
#[test]
fn on_a_terminal_a_waiting_line_shows_who_holds_the_lock() {
    let env = Env::new();
    let lib = env.client();
    let guard = lib.hold("w");
    let args = format!("run --backend {} --key w --wait 3s -- true", env.url);
    let out = assert_cmd::Command::from_std(crate::terminal::on_a_terminal(&env, &args))
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    let needle = format!("holdfast: waiting for lock \"w\": held by test-holder (fence {}, ", guard.fence());
    assert!(shown.contains(&needle), "{shown:?}");
    // The busy message after the waiting line starts on a clean line.
    assert!(shown.contains("\r\x1b[Kholdfast: lock \"w\" is busy: held by test-holder"), "{shown:?}");
    lib.release(guard);
}
