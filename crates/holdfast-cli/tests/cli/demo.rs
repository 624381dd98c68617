//! `holdfast demo`: the flash sale.

use crate::Env;

fn field<'a>(stdout: &'a str, name: &str) -> &'a str {
    let line = stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name:?} in:\n{stdout}"));
    line[name.len()..].split_whitespace().next().unwrap()
}

#[test]
fn flash_sale_sells_each_item_once() {
    let env = Env::new();
    let out = env.cmd().args(["demo", "--workers", "4", "--stock", "200"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(field(&stdout, "sold"), "200");
    assert_eq!(field(&stdout, "left"), "0");
    assert_eq!(field(&stdout, "oversold"), "0");
    assert_eq!(field(&stdout, "max holders inside"), "1");
    assert!(stdout.contains("strictly increasing"), "{stdout}");
    assert!(stdout.contains("items/s"), "{stdout}");
    // No progress bar when stderr is not a terminal.
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn flash_sale_on_every_store() {
    let env = Env::new();
    for store in crate::stores(&env) {
        let out =
            env.cmd().args(["demo", "--backend", &store.url, "--workers", "3", "--stock", "60"]).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{}: {stdout}", store.name);
        assert_eq!(field(&stdout, "sold"), "60", "{}", store.name);
        assert_eq!(field(&stdout, "oversold"), "0", "{}", store.name);
        assert_eq!(field(&stdout, "max holders inside"), "1", "{}", store.name);
        assert!(stdout.contains(&format!("on {} (", store.name)), "{}: {stdout}", store.name);
    }
    assert!(env.path("locks.db").exists(), "the demo must use the given store");
}

#[test]
fn without_the_lock_the_checks_catch_it_and_exit_1() {
    let env = Env::new();
    let out = env.cmd().args(["demo", "--workers", "4", "--stock", "200", "--without-lock"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Without a lock there are no fences (all 0), so at least that check fails every time.
    assert_eq!(out.status.code(), Some(i32::from(holdfast_cli::exit::INVARIANT_BROKEN)), "{stdout}");
    assert!(stdout.contains("NOT increasing") && stdout.contains("BROKEN"), "{stdout}");
}

/// `--segments`: 150 items over 7 segments (21 or 22 each), 3 workers of 3
/// buyer tasks each: every item sold once, no segment below zero, one holder
/// per segment at a time, fences increasing per segment, throughput shown.
/// Then on Redis, 100 segments and fewer items than segments (some empty from
/// the start: buyers fall over from their first purchase).
#[test]
fn segmented_flash_sale_stays_exact() {
    let env = Env::new();
    let redis = holdfast_verify::servers::redis::RedisServer::start();
    let cases: [(&[&str], &str); 2] = [
        (&["--workers", "3", "--tasks", "3", "--stock", "150", "--segments", "7", "--work-ms", "1"], "150"),
        (&["--backend", &redis.url(), "--workers", "2", "--tasks", "4", "--stock", "60", "--segments", "100"], "60"),
    ];
    for (args, stock) in cases {
        let out = env.cmd().arg("demo").args(args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(field(&stdout, "sold"), stock, "{stdout}");
        assert_eq!(field(&stdout, "left"), "0", "{stdout}");
        assert_eq!(field(&stdout, "oversold"), "0", "{stdout}");
        assert_eq!(field(&stdout, "max holders inside"), "1", "{stdout}");
        assert!(stdout.contains("strictly increasing") && stdout.contains("items/s"), "{stdout}");
        assert!(stdout.contains("segments           "), "{stdout}");
    }
    let out = env.cmd().args(["demo", "--segments", "4", "--without-lock"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "--segments with --without-lock is a usage error");
    let out = env.cmd().args(["demo", "--segments", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "0 segments is a usage error");
}
