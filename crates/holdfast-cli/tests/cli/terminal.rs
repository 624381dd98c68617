//! `holdfast run` on a terminal: CMD gets the terminal (it can read it, Ctrl-C
//! and Ctrl-Z reach it), and a lost lease or a forwarded signal reaches CMD's
//! whole process group. `script` (util-linux) puts holdfast on a pseudo-terminal.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use holdfast_cli::exit;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{Env, ends_within, read_pid, wait_for_file, wait_timeout};

/// `script -qec "holdfast ARGS" /dev/null`: holdfast on a fresh pseudo-terminal
/// (in its own session, as the terminal's foreground process group).
pub(crate) fn on_a_terminal(env: &Env, holdfast_args: &str) -> std::process::Command {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join("script").is_file()));
    assert!(found, "`script` is missing: apt-get install -y util-linux");
    let mut cmd = std::process::Command::new("script");
    cmd.env_remove("HOLDFAST_BACKEND").env_remove("RUST_LOG").env("XDG_STATE_HOME", env.path("state"));
    cmd.args(["-qec", &format!("{} {holdfast_args}", crate::bin()), "/dev/null"]);
    cmd
}

#[test]
fn on_a_terminal_the_command_can_read_it() {
    // CMD is the terminal's foreground group: reading does not stop it (SIGTTIN).
    let env = Env::new();
    let args =
        format!("run --backend {} --key tty -- sh -c 'read x; echo got-$x; test -t 0 && echo on-a-tty'", env.url);
    let out = assert_cmd::Command::from_std(on_a_terminal(&env, &args))
        .timeout(Duration::from_secs(30))
        .write_stdin("hello\n")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("got-hello") && stdout.contains("on-a-tty"), "{stdout}");
}

/// holdfast on a terminal under a shell that outlives it by 5 s: when holdfast
/// leads the terminal's session, its exit hangs up the terminal, and SIGHUP
/// would end CMD's children whatever holdfast did. Returns `script` and the
/// file holdfast's exit code is written to.
fn under_a_shell_on_a_terminal(env: &Env, holdfast_args: &str) -> (std::process::Child, std::path::PathBuf) {
    let rc = env.path("holdfast.rc");
    let shell = format!("{} {holdfast_args}; echo $? > {}; sleep 5", crate::bin(), rc.display());
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join("script").is_file()));
    assert!(found, "`script` is missing: apt-get install -y util-linux");
    let mut cmd = std::process::Command::new("script");
    cmd.env_remove("HOLDFAST_BACKEND").env_remove("RUST_LOG").env("XDG_STATE_HOME", env.path("state"));
    cmd.args(["-qec", &shell, "/dev/null"]).stdin(Stdio::piped()).stdout(Stdio::piped());
    (cmd.spawn().unwrap(), rc)
}

/// Waits for the exit code [`under_a_shell_on_a_terminal`] writes.
fn holdfast_exit_code(rc: &std::path::Path) -> i32 {
    wait_for_file(rc, Duration::from_secs(20));
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Ok(code) = std::fs::read_to_string(rc).unwrap_or_default().trim().parse() {
            return code;
        }
        assert!(Instant::now() < deadline, "no exit code in {}", rc.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn on_a_terminal_a_lost_lease_stops_the_commands_whole_group() {
    let env = Env::new();
    let pid_file = env.path("sleep.pid");
    let args = format!(
        "run --backend {} --key tty --ttl 300ms --max-hold 100ms -- sh -c \"sleep 30 & echo \\$! > {}; wait\"",
        env.url,
        pid_file.display()
    );
    let started = Instant::now();
    let (mut script, rc) = under_a_shell_on_a_terminal(&env, &args);
    assert_eq!(holdfast_exit_code(&rc), i32::from(exit::LEASE_LOST));
    assert!(started.elapsed() < Duration::from_secs(10));
    // The script's background child was in the group that got SIGTERM.
    let pid = read_pid(&pid_file);
    let ended = ends_within(pid, Duration::from_secs(2));
    let _ = script.kill();
    let _ = script.wait();
    assert!(ended, "the command's child {pid} survived the lost lease");
}

#[test]
fn on_a_terminal_a_forwarded_signal_reaches_the_commands_whole_group() {
    let env = Env::new();
    let (holdfast_pid, sleep_pid) = (env.path("holdfast.pid"), env.path("sleep.pid"));
    let args = format!(
        "run --backend {} --key tty -- sh -c \"echo \\$PPID > {}; sleep 30 & echo \\$! > {}; wait\"",
        env.url,
        holdfast_pid.display(),
        sleep_pid.display()
    );
    let (mut script, rc) = under_a_shell_on_a_terminal(&env, &args);
    wait_for_file(&sleep_pid, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(100)); // the pid file is written before it is complete
    let sleep = read_pid(&sleep_pid);
    kill(Pid::from_raw(read_pid(&holdfast_pid)), Signal::SIGTERM).unwrap();
    // sh died of the forwarded SIGTERM, and so did its child.
    let code = holdfast_exit_code(&rc);
    let ended = ends_within(sleep, Duration::from_secs(2));
    let _ = script.kill();
    let _ = script.wait();
    assert_eq!(code, 128 + 15);
    assert!(ended, "the command's child {sleep} did not get the signal");
    assert!(env.client().is_free("tty"));
}

#[test]
fn on_a_terminal_ctrl_c_reaches_the_command() {
    let env = Env::new();
    let ready = env.path("ready");
    let args = format!("run --backend {} --key tty -- sh -c 'touch {}; exec sleep 30'", env.url, ready.display());
    let mut child = on_a_terminal(&env, &args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    wait_for_file(&ready, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(200)); // let sh exec sleep
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"\x03").unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + 2), "Ctrl-C should end the command with SIGINT");
    assert!(env.client().is_free("tty"));
}

#[test]
fn on_a_terminal_ctrl_z_without_a_job_control_shell_does_not_hang_the_command() {
    // Under `script` no shell could ever resume a stopped job; the terminal
    // driver itself discards Ctrl-Z for such orphaned process groups, and so
    // must holdfast for the command's group, or the command would stay
    // stopped forever (and the lock with it).
    ctrl_z_without_job_control(false);
}

#[test]
fn on_a_terminal_ctrl_z_that_stops_only_part_of_the_commands_group_does_not_hang_it() {
    // CMD's leader catches SIGTSTP and goes on waiting for its child, which
    // Ctrl-Z stopped: holdfast hears nothing from its own child (the leader
    // never stops), yet the job must not hang. The same state arises when
    // Ctrl-Z lands while a shell vforks (the shell cannot stop until its
    // vfork child execs, and that child is stopped): CI saw that hang.
    ctrl_z_without_job_control(true);
}

/// The script CMD runs: it touches `ready`, sleeps a second, then runs
/// `then`. With `trap_tstp`, it catches SIGTSTP, and `sleep` runs before
/// `ready` appears (a shell that caught a Ctrl-Z sent before `sleep`
/// started would leave nothing stopped); the second `wait` waits for a
/// `sleep` that the caught signal cut the first one short of.
fn sleep_then(trap_tstp: bool, ready: &std::path::Path, then: &str) -> String {
    let ready = ready.display();
    if trap_tstp {
        format!("trap \"echo caught\" TSTP; sleep 1 & touch {ready}; wait; wait; {then}")
    } else {
        format!("touch {ready}; sleep 1; {then}")
    }
}

/// Ctrl-Z under `script` (no job control), with CMD [`sleep_then`]: CMD
/// finishes.
fn ctrl_z_without_job_control(trap_tstp: bool) {
    let env = Env::new();
    let ready = env.path("ready");
    let script = sleep_then(trap_tstp, &ready, "echo finished");
    let args = format!("run --backend {} --key tty -- sh -c '{script}'", env.url);
    let mut child = on_a_terminal(&env, &args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    wait_for_file(&ready, Duration::from_secs(10));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"\x1a").unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(10));
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    assert_eq!(status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("finished"), "{stdout}");
}

#[test]
fn on_a_terminal_ctrl_z_and_fg_under_a_job_control_shell() {
    // An interactive bash runs holdfast as a job: Ctrl-Z stops the job
    // (CMD's group and holdfast's), `jobs` says so, and `fg` resumes CMD.
    ctrl_z_and_fg_under_bash(false);
}

#[test]
fn on_a_terminal_ctrl_z_that_stops_only_part_of_the_commands_group_stops_the_job_under_bash() {
    // CMD's leader catches SIGTSTP; its child stops. holdfast finds the
    // stopped child (no SIGCHLD tells it) and stops the job, so that bash
    // lists it as stopped and `fg` continues the child.
    ctrl_z_and_fg_under_bash(true);
}

/// Ctrl-Z, `jobs` and `fg` under an interactive bash, with CMD [`sleep_then`].
fn ctrl_z_and_fg_under_bash(trap_tstp: bool) {
    let env = Env::new();
    let (ready, finished, rc) = (env.path("ready"), env.path("finished"), env.path("rc"));
    let mut bash = std::process::Command::new("script")
        .env_remove("HOLDFAST_BACKEND")
        .env_remove("RUST_LOG")
        .env("XDG_STATE_HOME", env.path("state"))
        .args(["-qec", "bash --norc --noprofile -i", "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut typed = bash.stdin.take().unwrap();
    let mut type_line = |line: &str| typed.write_all(line.as_bytes()).unwrap();
    let script = sleep_then(trap_tstp, &ready, &format!("touch {}", finished.display()));
    type_line(&format!("{} run --backend {} --key tty -- sh -c '{script}'\n", crate::bin(), env.url));
    wait_for_file(&ready, Duration::from_secs(10));
    type_line("\x1a");
    // bash hears of the stop once holdfast stops itself: at once when CMD's
    // own process stops, within STOP_POLL (500 ms) when only its child does,
    // later on a loaded machine. Ask `jobs` until it says so, for 10 s.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut listed = String::new();
    for asked in 0.. {
        std::thread::sleep(Duration::from_millis(300));
        let jobs = env.path(&format!("jobs-{asked}.txt"));
        type_line(&format!("jobs > {}\n", jobs.display()));
        wait_for_file(&jobs, Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(100)); // created before it is written
        listed = std::fs::read_to_string(&jobs).unwrap();
        if listed.contains("Stopped") || Instant::now() > deadline {
            break;
        }
    }
    // CMD would finish within its 1 s sleep if it ran on.
    std::thread::sleep(Duration::from_millis(1500));
    let stopped_while_listed = !finished.exists();
    type_line(&format!("fg\necho $? > {}\nexit\n", rc.display()));
    wait_for_file(&rc, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(50));
    let code = std::fs::read_to_string(&rc).unwrap();
    let _ = wait_timeout(&mut bash, Duration::from_secs(10));
    assert!(listed.contains("Stopped"), "bash should list the job as stopped: {listed:?}");
    assert!(stopped_while_listed, "CMD ran on while its job was stopped");
    assert!(finished.exists(), "CMD did not finish after fg");
    assert_eq!(code.trim(), "0");
    assert!(env.client().is_free("tty"));
}
