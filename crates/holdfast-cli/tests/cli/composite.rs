//! `holdfast run` over composites with its default options: the stop timing
//! follows the lease the store gives, which may be shorter than `--ttl`.

use holdfast_cli::exit;
use holdfast_verify::servers::{redis::RedisServer, zookeeper::ZkServer};

use crate::Env;

fn assert_ran(out: &std::process::Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{what}: stderr: {stderr}");
    assert!(!stderr.contains("stopping the command"), "{what}: {stderr}");
}

#[test]
fn runs_over_a_fallback_chain_with_default_options() {
    // The chain vouches for a lease at most half its 10 s mode TTL ahead;
    // the default --kill-after for --ttl 30s (5 s) would stop CMD at once.
    let env = Env::new();
    let redis = RedisServer::start();
    let url = format!("fallback://{}|sqlite://{}", redis.url(), env.path("arbiter.db").display());
    let out = env.run_on(&url, "jobs/chained", &["--ttl", "30s"], &["sleep", "3"]).output().unwrap();
    assert_ran(&out, "fallback");
}

#[test]
fn runs_over_a_layered_lock_with_default_options() {
    // Behind layered:// ZooKeeper keeps its default 10 s session, so it
    // vouches for 7.5 s at a time whatever --ttl says.
    let env = Env::new();
    let (redis, zk) = (RedisServer::start(), ZkServer::start());
    let url = format!("layered://{}|{}", redis.url(), zk.url());
    let out = env.run_on(&url, "jobs/layered", &["--ttl", "30s"], &["sleep", "3"]).output().unwrap();
    assert_ran(&out, "layered");
}

#[test]
fn a_kill_after_that_does_not_fit_the_lease_is_refused_before_the_command_starts() {
    let env = Env::new();
    let redis = RedisServer::start();
    let url = format!("fallback://{}|sqlite://{}", redis.url(), env.path("arbiter.db").display());
    let marker = env.path("ran");
    let touch = format!("touch {}", marker.display());
    let out = env.run_on(&url, "k", &["--ttl", "30s", "--kill-after", "5s"], &["sh", "-c", &touch]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)), "{stderr}");
    assert!(stderr.contains("use --kill-after") && stderr.contains("or less"), "{stderr}");
    assert!(!marker.exists(), "the command must not start");
    // The grant was released: the next run gets the key at once.
    let out = env.run_on(&url, "k", &["--ttl", "30s", "--wait", "0"], &["true"]).output().unwrap();
    assert_ran(&out, "after the refusal");
}
