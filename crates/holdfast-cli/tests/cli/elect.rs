//! `holdfast elect NAME [-- CMD]` and `elect --observe NAME`.

use std::io::BufRead;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{Env, wait_timeout};

/// `holdfast elect ARGS` on the test's store, stdout as lines on a channel.
fn elect(env: &Env, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = std::process::Command::new(crate::bin())
        .env_remove("HOLDFAST_BACKEND")
        .env_remove("RUST_LOG")
        .args(["elect", "--backend", &env.url])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

fn next_line(rx: &mpsc::Receiver<String>, what: &str) -> String {
    rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|e| panic!("{what}: no line ({e})"))
}

fn term(text: &str, before: &str, after: &str) -> u64 {
    let rest = text.strip_prefix(before).unwrap_or_else(|| panic!("{text:?} should start with {before:?}"));
    rest.split_once(after).and_then(|(t, _)| t.parse().ok()).unwrap_or_else(|| panic!("no term in {text:?}"))
}

#[test]
fn a_leader_leads_until_a_signal_the_next_runs_its_command_and_observers_see_both() {
    let env = Env::new();
    let (mut first, first_out) = elect(&env, &["sched", "--value", "a"]);
    let t1 = term(&next_line(&first_out, "first leader"), "leading \"sched\" in term ", " as \"a\"");
    let (mut observer, seen) = elect(&env, &["--observe", "sched"]);
    assert_eq!(next_line(&seen, "observer"), format!("term {t1}: a"));
    // The status of the election's key names the leader by its value.
    let st = env.client().rt.block_on(env.client().client.status("sched")).unwrap();
    assert_eq!(st.holder.map(|h| h.label).as_deref(), Some("a"));

    // The second leader's command lasts until the observer has seen its term
    // (observers read every 100 ms: a shorter term could pass unseen).
    let done = env.path("done");
    let script = format!("echo $HOLDFAST_FENCE; while [ ! -e {} ]; do sleep 0.05; done", done.display());
    let (mut second, second_out) = elect(&env, &["sched", "--value", "b", "--", "sh", "-c", &script]);
    kill(Pid::from_raw(first.id() as i32), Signal::SIGTERM).unwrap();
    assert_eq!(wait_timeout(&mut first, Duration::from_secs(20)).code(), Some(0), "the first leader resigned");
    let t2: u64 = next_line(&second_out, "second leader's command").parse().expect("a term");
    assert!(t2 > t1, "terms must increase: {t1} then {t2}");
    assert_eq!(next_line(&seen, "observer"), format!("term {t2}: b"));
    std::fs::write(&done, "").unwrap();
    assert_eq!(wait_timeout(&mut second, Duration::from_secs(20)).code(), Some(0));

    kill(Pid::from_raw(observer.id() as i32), Signal::SIGTERM).unwrap();
    assert_eq!(wait_timeout(&mut observer, Duration::from_secs(20)).code(), Some(0));
}

#[test]
fn observe_takes_no_value_or_command() {
    let env = Env::new();
    for args in [&["elect", "--observe", "x", "--value", "v"][..], &["elect", "--observe", "x", "--", "true"]] {
        let out = env.cmd().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(i32::from(holdfast_cli::exit::USAGE)), "{args:?}");
    }
}
