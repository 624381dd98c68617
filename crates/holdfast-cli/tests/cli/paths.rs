//! Where the locks live: a mistyped SQLite path is an error naming it, never
//! a new store; read-only commands create nothing; the implicit local store
//! says so.

use holdfast_cli::exit;

use crate::{Env, assert_one_line};

#[test]
fn run_never_creates_a_missing_directory() {
    let env = Env::new();
    let missing = env.path("nonexistent/dir");
    let url = format!("sqlite://{}/x.db", missing.display());
    let out = env.cmd().args(["run", "--backend", &url, "--key", "k", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::UNAVAILABLE)), "{}", String::from_utf8_lossy(&out.stderr));
    assert_one_line(&out.stderr, &format!("directory {} does not exist", missing.display()));
    assert!(!env.path("nonexistent").exists(), "run created the directory");
}

#[test]
fn read_only_commands_never_create_a_database() {
    let env = Env::new();
    let typo = env.path("lcoks.db");
    let url = format!("sqlite://{}", typo.display());
    for args in [
        &["status", "--backend", &url, "k"][..],
        &["list", "--backend", &url],
        &["release", "--force", "--backend", &url, "k"],
    ] {
        let out = env.cmd().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(i32::from(exit::UNAVAILABLE)), "{args:?}: {out:?}");
        assert_one_line(&out.stderr, &format!("{}: no such database file", typo.display()));
        assert_eq!(out.stdout, b"", "{args:?} printed a status for a store that does not exist");
        assert!(!typo.exists(), "{args:?} created the file");
    }
    // A missing directory is named too, and not created.
    let url = format!("sqlite://{}/x.db", env.path("nonexistent/dir").display());
    let out = env.cmd().args(["list", "--backend", &url]).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::UNAVAILABLE)));
    assert_one_line(&out.stderr, "does not exist");
    assert!(!env.path("nonexistent").exists());
}

#[test]
fn read_only_commands_on_the_default_store_create_nothing_and_say_which_store() {
    let env = Env::new();
    for args in [&["status", "k"][..], &["list"]] {
        let out = env.cmd().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(i32::from(exit::UNAVAILABLE)), "{args:?}: {out:?}");
        assert_one_line(&out.stderr, "the default local store");
        assert!(!env.path("state").exists(), "{args:?} created the state directory");
    }
    // Once run has used it, status reads it.
    env.cmd().args(["run", "-q", "--key", "k", "--", "true"]).assert().code(0);
    env.cmd().args(["status", "k"]).assert().code(0).stdout(predicates::str::contains("(free)"));
}

#[test]
fn the_implicit_local_store_says_so_once() {
    let env = Env::new();
    let out = env.cmd().args(["run", "--key", "deploy", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let db = env.path("state/holdfast/locks.db");
    assert_one_line(&out.stderr, &db.display().to_string());
    assert_one_line(&out.stderr, "only processes on this machine");
    assert_one_line(&out.stderr, "--backend");
    // Named explicitly, or with --quiet: nothing on stderr.
    let url = format!("sqlite://{}", db.display());
    env.cmd().args(["run", "--backend", &url, "--key", "deploy", "--", "true"]).assert().code(0).stderr("");
    env.cmd().args(["run", "--quiet", "--key", "deploy", "--", "true"]).assert().code(0).stderr("");
}
