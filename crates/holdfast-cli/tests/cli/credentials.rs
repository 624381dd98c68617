//! The store password from a file or the environment, never only the URL.

use holdfast_cli::exit;

use crate::Env;

/// A Redis that asks for `password`.
fn redis_with_password(password: &str) -> holdfast_verify::servers::redis::RedisServer {
    let server = holdfast_verify::servers::redis::RedisServer::start();
    let set = std::process::Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "CONFIG", "SET", "requirepass", password])
        .output()
        .expect("redis-cli (apt-get install redis-tools)");
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    server
}

fn shown(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A password with `/`, `@` and `:` (which would break a URL written by
/// hand) reaches the store from `--password-file` and from
/// `HOLDFAST_PASSWORD`; without it the store refuses; it is never printed.
#[test]
fn a_password_from_a_file_or_the_environment_reaches_the_store() {
    let password = "canary/p@ss:w0rd";
    let server = redis_with_password(password);
    let url = format!("redis://127.0.0.1:{}", server.port());
    let env = Env::new();
    let file = env.path("redis.password");
    std::fs::write(&file, format!("{password}\n")).unwrap();
    let marker = env.path("ran");
    let touch = format!("touch {}", marker.display());
    let run = |extra: &[&str], vars: &[(&str, &str)]| {
        let mut cmd = env.cmd();
        cmd.args(["run", "--backend", &url, "--key", "k"]).args(extra).args(["--", "sh", "-c", &touch]);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.env("RUST_LOG", "debug").output().unwrap()
    };

    let out = run(&["--password-file", file.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "--password-file: {}", shown(&out));
    assert!(std::fs::remove_file(&marker).is_ok(), "the command did not run with --password-file");

    let out = run(&[], &[("HOLDFAST_PASSWORD", password)]);
    assert_eq!(out.status.code(), Some(0), "HOLDFAST_PASSWORD: {}", shown(&out));
    assert!(std::fs::remove_file(&marker).is_ok(), "the command did not run with HOLDFAST_PASSWORD");

    let out = run(&[], &[("HOLDFAST_PASSWORD_FILE", file.to_str().unwrap())]);
    assert_eq!(out.status.code(), Some(0), "HOLDFAST_PASSWORD_FILE: {}", shown(&out));
    assert!(std::fs::remove_file(&marker).is_ok(), "the command did not run with HOLDFAST_PASSWORD_FILE");

    let out = run(&[], &[]);
    assert_eq!(out.status.code(), Some(i32::from(exit::UNAVAILABLE)), "no password: {}", shown(&out));
    assert!(!marker.exists(), "the command ran although the store refused the client");

    let wrong = env.path("wrong.password");
    std::fs::write(&wrong, "canary-wrong\n").unwrap();
    let out = run(&["--password-file", wrong.to_str().unwrap()], &[]);
    assert_ne!(out.status.code(), Some(0), "a wrong password: {}", shown(&out));
    for out in [
        run(&["--password-file", file.to_str().unwrap()], &[]),
        run(&["--password-file", wrong.to_str().unwrap()], &[]),
    ] {
        let text = shown(&out);
        assert!(!text.contains("canary") && !text.contains("p%40ss"), "a password was printed: {text}");
    }
}

/// Arguments, environment variables, and what the error must say.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

/// A password given twice, or where it means nothing, is a usage error that
/// says which; an unreadable file is named, its content never shown.
#[test]
fn a_password_given_twice_or_for_no_store_is_a_usage_error() {
    let env = Env::new();
    let file = env.path("pw");
    std::fs::write(&file, "canary-secret\n").unwrap();
    let pw = file.to_str().unwrap();
    let empty = env.path("empty");
    std::fs::write(&empty, "\n").unwrap();
    let missing = env.path("missing");
    let cases: [Case; 6] = [
        (&["--backend", "redis://:old@127.0.0.1:1", "--password-file", pw], &[], "one way"),
        (
            &["--backend", "redis://127.0.0.1:1", "--password-file", pw],
            &[("HOLDFAST_PASSWORD", "canary-env")],
            "unset one",
        ),
        (&["--backend", "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "--password-file", pw], &[], "own URL"),
        (&["--password-file", pw], &[], "--backend"),
        (&["--backend", "redis://127.0.0.1:1", "--password-file", empty.to_str().unwrap()], &[], "empty"),
        (&["--backend", "redis://127.0.0.1:1", "--password-file", missing.to_str().unwrap()], &[], "no such file"),
    ];
    for (args, vars, says) in cases {
        let mut cmd = env.cmd();
        cmd.arg("run").args(args).args(["--key", "k", "--", "true"]);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let text = shown(&out);
        assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)), "{args:?}: {text}");
        assert!(text.contains(says), "{args:?}: {text:?} does not say {says:?}");
        assert!(text.trim().lines().count() <= 2 && text.starts_with("holdfast: "), "{args:?}: {text:?}");
        assert!(!text.contains("canary"), "{args:?}: a password was printed: {text}");
    }
    assert!(!env.path("state").exists(), "nothing may be created for a refused command line");
}
