//! The exit-code table and the error paths shared by every command.

use holdfast_cli::exit;

use crate::{Env, assert_one_line};

#[test]
fn help_documents_every_exit_code() {
    let env = Env::new();
    let out = env.cmd().arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for code in [
        exit::INVARIANT_BROKEN,
        exit::USAGE,
        exit::UNAVAILABLE,
        exit::INTERNAL,
        exit::LEASE_LOST,
        exit::BUSY,
        exit::NOT_EXECUTABLE,
        exit::NOT_FOUND,
    ] {
        assert!(help.lines().any(|l| l.trim_start().starts_with(&format!("{code} "))), "no row for {code} in:\n{help}");
    }
    assert!(help.contains("128+s") && help.contains("HOLDFAST_BACKEND"), "{help}");
    // The table in --help is the one in src/exit.rs.
    assert!(help.contains(exit::HELP_TABLE));
}

#[test]
fn the_table_matches_the_conventions() {
    assert_eq!(
        [exit::OK, exit::USAGE, exit::UNAVAILABLE, exit::INTERNAL, exit::LEASE_LOST, exit::BUSY],
        [0, 64, 69, 70, 74, 75]
    );
    assert_eq!([exit::NOT_EXECUTABLE, exit::NOT_FOUND], [126, 127]);
}

#[test]
fn version_and_subcommand_help_exit_zero() {
    let env = Env::new();
    env.cmd().arg("--version").assert().code(0);
    let out = env.cmd().args(["run", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("HOLDFAST_FENCE") && help.contains("--kill-after") && help.contains("--wait"), "{help}");
}

#[test]
fn bad_command_lines_are_usage_errors() {
    let env = Env::new();
    for args in [
        &[][..],
        &["frobnicate"],
        &["run", "--no-such-flag"],
        &["run", "--key", "k", "--ttl", "5", "--", "true"],
        &["run", "--key", "k", "--wait", "soon", "--", "true"],
        &["status"],
        &["demo", "--workers", "0"],
    ] {
        let out = env.cmd().args(args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(i32::from(exit::USAGE)),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    }
}

#[test]
fn bad_input_is_one_line_and_exit_64() {
    let env = Env::new();
    let cases: [(&[&str], &str); 6] = [
        (&["run", "--backend", &env.url, "--key", "", "--", "true"], "key"),
        (&["run", "--backend", &env.url, "--key", "k", "--ttl", "0s", "--", "true"], "ttl"),
        (&["run", "--backend", &env.url, "--key", "k", "--max-hold", "0s", "--", "true"], "--max-hold"),
        (&["run", "--backend", "not-a-url", "--key", "k", "--", "true"], "url"),
        (&["run", "--backend", "gopher://x", "--key", "k", "--", "true"], "unknown scheme"),
        (&["status", "--backend", &env.url, ""], "key"),
    ];
    for (args, needle) in cases {
        let out = env.cmd().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)), "{args:?}");
        assert_one_line(&out.stderr, needle);
    }
    // Nothing was written for the rejected inputs: the store file was never created.
    assert!(!env.path("locks.db").exists());
}

#[test]
fn unreachable_store_is_one_line_and_exit_69() {
    let env = Env::new();
    std::fs::write(env.path("garbage.db"), vec![0x5a; 8192]).unwrap();
    let not_a_db = format!("sqlite://{}", env.path("garbage.db").display());
    for url in ["sqlite:///proc/holdfast-no-such-dir/locks.db", not_a_db.as_str()] {
        for args in [
            &["run", "--backend", url, "--key", "k", "--", "true"][..],
            &["status", "--backend", url, "k"],
            &["demo", "--backend", url, "--workers", "1", "--stock", "1"],
        ] {
            let out = env.cmd().args(args).output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(i32::from(exit::UNAVAILABLE)),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_one_line(&out.stderr, "sqlite");
        }
    }
}

/// A store that is down: exit 69 and one line, `holdfast: etcd at
/// HOST:PORT: connection refused: ...`, naming the store and the endpoint
/// once, with no debug dump of the client library.
#[test]
fn a_refused_store_names_the_store_and_endpoint() {
    let env = Env::new();
    let port = holdfast_verify::servers::closed_port();
    let url = format!("etcd://127.0.0.1:{port}?connect_timeout_ms=500&timeout_ms=2000");
    let out = env.cmd().args(["run", "--backend", &url, "--key", "x", "--", "true"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(i32::from(exit::UNAVAILABLE)), "{stderr}");
    let prefix = format!("holdfast: etcd at 127.0.0.1:{port}: connection refused: ");
    assert!(stderr.starts_with(&prefix), "must start with {prefix:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert_eq!(stderr.matches("etcd").count(), 2, "the store named once, plus its hint: {stderr}");
    for dump in ["tonic::", "Os {", "Error(", "store error"] {
        assert!(!stderr.contains(dump), "shows {dump:?}: {stderr}");
    }
}

#[test]
fn backend_comes_from_the_environment() {
    let env = Env::new();
    env.cmd().env("HOLDFAST_BACKEND", &env.url).args(["run", "--key", "k", "--", "true"]).assert().code(0);
    assert!(env.path("locks.db").exists(), "HOLDFAST_BACKEND was not used");
}

#[test]
fn default_backend_is_a_file_in_the_state_dir() {
    let env = Env::new();
    env.cmd().args(["run", "--key", "k", "--", "true"]).assert().code(0);
    assert!(env.path("state/holdfast/locks.db").exists());
}

#[test]
fn passwords_in_backend_urls_are_never_printed() {
    let env = Env::new();
    for url in [
        "postgres://user:hunter2@127.0.0.1:1/db",
        "gopher://user:hunter2@127.0.0.1:1/",
        // No scheme: this one used to be echoed whole.
        "user:hunter2@127.0.0.1:6379",
        "sqlite:///nonexistent-dir/x.db?password=hunter2",
        "redis://:hunter2@127.0.0.1:1",
        "redis+sentinel://u:hunter2@127.0.0.1:1/mymaster?timeout_ms=500",
        "redis+cluster://u:hunter2@127.0.0.1:1?timeout_ms=500",
        "redlock://:hunter2@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        "mysql://u:hunter2@127.0.0.1:1/db",
        "etcd://u:hunter2@127.0.0.1:1?connect_timeout_ms=500",
    ] {
        let out = env.cmd().args(["status", "--backend", url, "k"]).output().unwrap();
        assert_ne!(out.status.code(), Some(0));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("hunter2"), "{stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("hunter2"));
    }
}

/// `status` on a Redis that asks for a password: the output names the
/// holder and the store, never the password, with and without logs.
#[test]
fn status_of_a_store_with_a_password_never_prints_it() {
    let env = Env::new();
    let server = holdfast_verify::servers::redis::RedisServer::start();
    let set = std::process::Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "CONFIG", "SET", "requirepass", "hunter2-canary"])
        .output()
        .unwrap();
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let url = format!("redis://:hunter2-canary@127.0.0.1:{}", server.port());
    let held = env.run_on(&url, "k", &[], &["sleep", "5"]).spawn().unwrap();
    let mut shown = String::new();
    for _ in 0..50 {
        let out = env.cmd().args(["status", "--backend", &url, "k"]).env("RUST_LOG", "trace").output().unwrap();
        shown = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if shown.contains("exclusive") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let mut held = held;
    let _ = held.kill();
    let _ = held.wait();
    assert!(shown.contains("exclusive"), "status never showed the holder: {shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
    let wrong = format!("redis://:hunter2-wrong@127.0.0.1:{}", server.port());
    let out = env.cmd().args(["status", "--backend", &wrong, "k"]).env("RUST_LOG", "trace").output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains("hunter2"), "{text}");
}

#[test]
fn a_kill_after_that_does_not_fit_the_ttl_is_a_usage_error() {
    // SIGTERM goes out when --kill-after + a margin is left on the lease; past
    // half the TTL that would stop CMD between renewals.
    let env = Env::new();
    for (ttl, kill_after) in [("2s", "1s"), ("10s", "5s"), ("300ms", "200ms")] {
        let out = env.run("k", &["--ttl", ttl, "--kill-after", kill_after], &["true"]).output().unwrap();
        assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)), "--ttl {ttl} --kill-after {kill_after}");
        assert_one_line(&out.stderr, "--kill-after");
    }
    assert!(!env.path("locks.db").exists(), "nothing may be written for a rejected command line");
    // The default fits every TTL; so does a --kill-after within the rule.
    for extra in
        [&["--ttl", "50ms"][..], &["--ttl", "10s", "--kill-after", "4s"], &["--ttl", "1s", "--kill-after", "0s"]]
    {
        env.run("k", extra, &["true"]).assert().code(0);
    }
}

#[test]
fn run_help_states_the_kill_timing_rule() {
    let env = Env::new();
    let out = env.cmd().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in ["min(5s, ttl/4)", "half of --ttl", "SIGKILL", "session_timeout", "tickTime"] {
        assert!(help.contains(needle), "run --help should mention {needle:?}:\n{help}");
    }
}

#[test]
fn log_lines_into_a_pipe_carry_no_colour_codes() {
    let env = Env::new();
    let out = env.run("k", &[], &["true"]).env("RUST_LOG", "debug").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lock acquired"), "expected log lines: {stderr}");
    assert!(!out.stderr.contains(&0x1b), "ESC (colour codes) in log lines written to a pipe: {stderr:?}");
}

/// Command-line errors in the one documented style: `holdfast: ...` on one
/// line, a `hint:` line where it helps, never clap's multi-line block; TTLs
/// in human units.
#[test]
fn command_line_errors_are_one_line_with_a_hint_where_it_helps() {
    let env = Env::new();
    let out = env.cmd().args(["status", "--no-such-flag"]).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(lines[0].starts_with("holdfast: unexpected argument '--no-such-flag'"), "{stderr}");
    assert!(lines[1].starts_with("hint: "), "{stderr}");
    // A mistyped flag of run is not taken for CMD: the hint names the flag meant.
    let out = env.cmd().args(["run", "--key", "k", "--wiat", "5s", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.lines().nth(1).is_some_and(|l| l.starts_with("hint: ") && l.contains("--wait")), "{stderr}");
    let out = env.cmd().args(["run", "--ttl", "5s", "--", "true"]).output().unwrap();
    assert_one_line(&out.stderr[..out.stderr.iter().position(|b| *b == b'\n').unwrap() + 1], "--key <KEY>");
    let out = env.cmd().arg("stauts").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("holdfast: unrecognized subcommand 'stauts'\nhint: "), "{stderr}");
    for (ttl, shown) in [("0s", "'0s'"), ("100y", "'100y'"), ("10ms", "'10ms'")] {
        let out = env.cmd().args(["run", "--key", "k", "--ttl", ttl, "--", "true"]).output().unwrap();
        assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)), "{ttl}");
        assert_one_line(
            &out.stderr,
            &format!("{shown} for '--ttl <DURATION>': a lease TTL must be between 50ms and 1day"),
        );
    }
    for args in [&["run"][..], &["status"], &[]] {
        let out = env.cmd().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("holdfast: ") && stderr.lines().count() <= 2, "{args:?}: {stderr}");
        assert!(!stderr.contains("error:") && !stderr.contains("Usage:"), "{args:?}: {stderr}");
    }
}
