//! Where the guarantees end, shown by the same seeded runs with one
//! assumption broken at a time: the checker must find the break (so it is
//! not blind to it), and the break is the documented limit.

use std::collections::BTreeMap;
use std::time::Duration;

use holdfast_testkit::sim::run::{RunConfig, run_seed};

/// How many seeds a scenario may take to show its break.
const WITHIN: u64 = 200;

/// The default run (or RedLock's) whose stores restart without their data,
/// down for `down_for`, 20 times a run.
fn restarting_without_data(redlock: bool, down_for: Duration) -> RunConfig {
    RunConfig {
        redlock,
        restarts_keep_state: false,
        restart_down_for: Some(down_for),
        faults: 20,
        ..RunConfig::default()
    }
}

/// How many times `guarantee` broke over the first [`WITHIN`] seeds.
fn breaches(config: &RunConfig, guarantee: &str) -> usize {
    (0..WITHIN)
        .map(|seed| run_seed(seed, config).verdict.violations.iter().filter(|v| v.guarantee == guarantee).count())
        .sum()
}

/// Runs seeds from `first` until one breaks `guarantee`; returns that seed
/// and every guarantee broken (with a count) over the seeds run.
fn until_broken(config: &RunConfig, first: u64, guarantee: &str) -> (Option<u64>, BTreeMap<&'static str, usize>) {
    let mut broken = BTreeMap::new();
    for seed in first..first + WITHIN {
        let out = run_seed(seed, config);
        for v in &out.verdict.violations {
            *broken.entry(v.guarantee).or_insert(0) += 1;
        }
        if let Some(v) = out.verdict.violations.iter().find(|v| v.guarantee == guarantee) {
            eprintln!("seed {seed} broke {guarantee}: {}", v.what);
            return (Some(seed), broken);
        }
    }
    (None, broken)
}

/// A store clock 5% fast (the client's margin covers 1%) expires leases
/// while their holders still count on them: "lost first" breaks, and the
/// checker sees it.
#[test]
fn store_clock_outside_the_margin_expires_leases_first() {
    let config = RunConfig { clock_drift: 0.05, ..RunConfig::default() };
    let (seed, broken) = until_broken(&config, 0, "lost first");
    assert!(seed.is_some(), "no run of a 5%-fast store clock broke lost-first: {broken:?}");
}

/// A store that restarts without its data and takes requests at once
/// grants a key its old holder still believes it holds: two holders. This
/// is why holdfast's stores must persist leases (or, like RedLock asks,
/// stay down for a TTL).
#[test]
fn restart_without_data_grants_twice() {
    let config = restarting_without_data(false, Duration::from_millis(50));
    let (seed, broken) = until_broken(&config, 0, "exclusion");
    assert!(seed.is_some(), "no run of a store restarted without its data broke exclusion: {broken:?}");
}

/// A store that restarts without its data but stays down longer than a
/// lease (TTL plus the drift margin) never grants twice: every holder's
/// deadline passes while it is down. Its fence counter starts again,
/// though: fences repeat, and only the resource's fence check (which then
/// refuses the new holders' writes) shows it. That is the limit of a store
/// without persistence, documented in the README.
#[test]
fn restart_without_data_after_a_ttl_repeats_fences_but_grants_once() {
    let config = restarting_without_data(false, Duration::from_millis(1100));
    let (seed, broken) = until_broken(&config, 0, "fencing");
    assert!(seed.is_some(), "no run of a store restarted without its data repeated a fence: {broken:?}");
    assert_eq!(breaches(&config, "exclusion"), 0, "a store down for a TTL after losing its data granted a key twice");
    assert_eq!(breaches(&config, "stale write"), 0, "the register accepted a stale write");
}

/// The model's counterexample `redlock::e_a_store_restarting_without_persistence_breaks_exclusion`,
/// replayed on the client core: a RedLock member that restarts without its
/// data and answers at once lets a second majority form while the first
/// holder's lease is valid. The documented limit of RedLock.
#[test]
fn redlock_member_restarting_without_data_grants_twice() {
    let config = restarting_without_data(true, Duration::from_millis(50));
    let (seed, broken) = until_broken(&config, 0, "exclusion");
    assert!(seed.is_some(), "no RedLock run with a member restarted without its data broke exclusion: {broken:?}");
}

/// The delayed restart RedLock asks for: a member that lost its data stays
/// down longer than a lease, and no key is granted twice.
#[test]
fn redlock_member_restarting_after_a_ttl_grants_once() {
    let config = restarting_without_data(true, Duration::from_millis(1100));
    assert_eq!(
        breaches(&config, "exclusion"),
        0,
        "a RedLock member down for a TTL after losing its data let a key be granted twice"
    );
}
