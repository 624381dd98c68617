//! Seeded fault runs: thousands of seeds, each a run through the real client
//! core on tokio's paused clock, checked by the history checker.

use std::ops::Range;
use std::time::{Duration, Instant};

use holdfast_testkit::history::{EndCause, Event};
use holdfast_testkit::sim::run::{RunConfig, RunOutcome, run_seed};

/// What a sweep over seeds saw.
#[derive(Debug, Default)]
pub struct Sweep {
    pub seeds: u64,
    pub grants: u64,
    pub lost: usize,
    pub refused: u64,
    /// Seeds whose history broke a guarantee, or that left leases behind.
    pub failed: Vec<(u64, String)>,
    pub took: Duration,
}

/// Why a run failed, or `None`.
pub fn failure(out: &RunOutcome) -> Option<String> {
    if let Some(v) = out.verdict.violations.first() {
        return Some(format!("{} broke: {}", v.guarantee, v.what));
    }
    if let Some(held) = out.held_after_cleanup.filter(|h| *h > 0) {
        return Some(format!("{held} leases still held after the cleanup window"));
    }
    if out.left_behind > 0 {
        return Some(format!("{} leases left after quiescence", out.left_behind));
    }
    None
}

/// Runs every seed in `seeds` on all cores, each on its own paused runtime.
pub fn sweep(config: &RunConfig, seeds: Range<u64>) -> Sweep {
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let parts: Vec<Sweep> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let seeds = seeds.clone();
                s.spawn(move || {
                    let mut part = Sweep::default();
                    for seed in seeds.filter(|seed| seed % threads == t) {
                        let out = run_seed(seed, config);
                        part.seeds += 1;
                        part.grants += out.verdict.grants;
                        part.lost += out
                            .events
                            .iter()
                            .filter(|e| matches!(e, Event::Ended { cause: EndCause::Lost, .. }))
                            .count();
                        part.refused += out.verdict.writes_refused;
                        if let Some(why) = failure(&out) {
                            part.failed.push((seed, why));
                        }
                    }
                    part
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a sweep thread panicked")).collect()
    });
    let mut all = Sweep::default();
    for p in parts {
        all.seeds += p.seeds;
        all.grants += p.grants;
        all.lost += p.lost;
        all.refused += p.refused;
        all.failed.extend(p.failed);
    }
    all.failed.sort();
    all.took = started.elapsed();
    all
}

fn seeds(default: u64) -> u64 {
    std::env::var("SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn assert_clean(name: &str, s: &Sweep) {
    eprintln!(
        "{name}: {} seeds, {} grants, {} lost, {} stale writes refused, {} failed, {:?}",
        s.seeds,
        s.grants,
        s.lost,
        s.refused,
        s.failed.len(),
        s.took
    );
    assert!(s.grants > 0 && s.refused > 0, "{name}: the runs exercised nothing");
    assert!(
        s.failed.is_empty(),
        "{name}: failing seeds (replay one with run_seed): {:?}",
        &s.failed[..s.failed.len().min(5)]
    );
}

/// 3 stores, 4 clients, 2 keys, 200 operations per client; 3% of requests
/// and replies lost, delays up to 40 ms, 1% of messages up to 2 TTLs late,
/// partitions and restarts, store clocks within the client's drift margin.
#[test]
fn many_seeds() {
    let s = sweep(&RunConfig::default(), 0..seeds(2000));
    assert_clean("many_seeds", &s);
    assert!(s.lost > 0, "no run lost a lease: the faults did not bite");
}

/// Leases long enough that only releases free them within the run: five
/// seconds after the network heals, every store is empty.
#[test]
fn abandoned_attempts_are_released() {
    let s = sweep(&RunConfig::long_leases(), 1_000_000..1_000_000 + seeds(2000) / 8);
    assert_clean("abandoned_attempts_are_released", &s);
}

/// RedLock over the three stores: every client locks through a majority,
/// under the same faults, store restarts keeping their data.
#[test]
fn redlock_seeds() {
    let s = sweep(&RunConfig { redlock: true, ..RunConfig::default() }, 2_000_000..2_000_000 + seeds(2000) / 8);
    assert_clean("redlock_seeds", &s);
}

/// The fallback chain over the three stores (the last the arbiter): every
/// client locks through the chain while partitions make clients disagree
/// about which store is down, so they switch (and fail back) under load.
#[test]
fn fallback_seeds() {
    let config = RunConfig { fallback: true, ..RunConfig::default() };
    let s = sweep(&config, 3_000_000..3_000_000 + seeds(2000) / 8);
    assert_clean("fallback_seeds", &s);
    // Not vacuous: the runs switch. Count grants by the epoch in their fence.
    let mut by_epoch = std::collections::BTreeMap::<u64, u64>::new();
    for seed in 3_000_000..3_000_020 {
        for e in run_seed(seed, &config).events {
            if let Event::Granted { fence, .. } = e {
                *by_epoch.entry(fence >> 52).or_default() += 1;
            }
        }
    }
    eprintln!("fallback_seeds: grants by epoch over 20 seeds: {by_epoch:?}");
    assert!(by_epoch.keys().any(|e| *e >= 2), "no run switched twice: {by_epoch:?}");
}

/// Tenants of one arbiter: two chains with other record names and plain
/// locks on the arbiter, whose fence counter (one for the store, as a SQL
/// arbiter keeps it) every grant and fence floor moves. Each chain switches
/// on its own; none may grant twice.
#[test]
fn fallback_tenant_seeds() {
    let config = RunConfig { fallback: true, tenants: true, ..RunConfig::default() };
    let s = sweep(&config, 4_000_000..4_000_000 + seeds(2000) / 16);
    assert_clean("fallback_tenant_seeds", &s);
    // Not vacuous: both chains switch, and the plain locks grant.
    let mut by_chain = std::collections::BTreeMap::<(u32, u64), u64>::new();
    for seed in 4_000_000..4_000_020 {
        for e in run_seed(seed, &config).events {
            if let Event::Granted { id, fence, .. } = e {
                *by_chain.entry((id.store, if id.store >= 3 { fence >> 52 } else { 0 })).or_default() += 1;
            }
        }
    }
    eprintln!("fallback_tenant_seeds: grants by (store id, epoch) over 20 seeds: {by_chain:?}");
    for chain in [3, 4] {
        assert!(by_chain.keys().any(|&(s, e)| s == chain && e >= 1), "chain {chain} never switched: {by_chain:?}");
    }
    assert!(by_chain.keys().any(|&(s, _)| s == 2), "no plain lock on the arbiter: {by_chain:?}");
}

/// Semaphore permits (1 or 2 of 2), read and write locks beside mutexes,
/// under the default faults: the stores' one admission rule, their
/// reservations and the waiting policy's turns, checked for
/// exclusion within each mode's limits and for fences.
#[test]
fn shares_seeds() {
    let config = RunConfig::default().with_shares();
    let s = sweep(&config, 5_000_000..5_000_000 + seeds(2000) / 8);
    assert_clean("shares_seeds", &s);
    // Not vacuous: every mode grants, and shares are held side by side.
    let mut by_mode = std::collections::BTreeMap::<String, u64>::new();
    let mut side_by_side = 0;
    for seed in 5_000_000..5_000_020 {
        let mut held: std::collections::HashMap<_, (u32, String)> = Default::default();
        for e in run_seed(seed, &config).events {
            match e {
                Event::Granted { id, key, mode, .. } => {
                    *by_mode.entry(format!("{mode:?}")).or_default() += 1;
                    let at = (id.store, key);
                    side_by_side += u64::from(!mode.is_exclusive() && held.values().any(|k| *k == at));
                    held.insert(id, at);
                }
                Event::Ended { id, .. } => {
                    held.remove(&id);
                }
                _ => {}
            }
        }
    }
    eprintln!("shares_seeds: grants by mode over 20 seeds: {by_mode:?}, {side_by_side} beside another share");
    assert!(by_mode.len() >= 4, "not every mode granted: {by_mode:?}");
    assert!(side_by_side > 0, "no share was held beside another");
}

/// Shares with long leases: a dropped waiting acquire of permits or of a
/// lock's read or write side leaves no reservation behind, and every store
/// is empty five seconds after the network heals.
#[test]
fn abandoned_shared_attempts_are_released() {
    let config = RunConfig::long_leases().with_shares();
    let s = sweep(&config, 6_000_000..6_000_000 + seeds(2000) / 8);
    assert_clean("abandoned_shared_attempts_are_released", &s);
}

/// Replays one seed and prints its history and verdict:
/// `SEED=17 cargo test -p holdfast-lock --test sim replay -- --ignored --nocapture`
/// (`LONG=1` for the long-lease runs, `REDLOCK=1` for RedLock's,
/// `FALLBACK=1` for the fallback chain's, with `TENANTS=1` for two chains
/// and plain locks on one arbiter, `SHARES=1` for permits and read-write
/// locks beside mutexes).
#[test]
#[ignore = "a tool: replays the seed in SEED"]
fn replay() {
    let seed = std::env::var("SEED").ok().and_then(|s| s.parse().ok()).expect("SEED=<n>");
    let mut config = if std::env::var_os("LONG").is_some() { RunConfig::long_leases() } else { RunConfig::default() };
    config.redlock = std::env::var_os("REDLOCK").is_some();
    config.fallback = std::env::var_os("FALLBACK").is_some();
    config.tenants = std::env::var_os("TENANTS").is_some();
    if std::env::var_os("SHARES").is_some() {
        config = config.with_shares();
    }
    let out = run_seed(seed, &config);
    for e in &out.events {
        println!("{e:?}");
    }
    println!("{:?}", out.verdict);
    println!("held after cleanup: {:?}, left behind: {}", out.held_after_cleanup, out.left_behind);
}

/// A seed replays bit for bit: the same history on another thread and in
/// another run, so a failing seed can be debugged.
#[test]
fn a_seed_replays_bit_for_bit() {
    let history = |seed| format!("{:?}", run_seed(seed, &RunConfig { ops: 60, ..RunConfig::default() }).events);
    for seed in 0..20 {
        let here = history(seed);
        let there = std::thread::spawn(move || history(seed)).join().expect("replay thread");
        assert_eq!(here, there, "seed {seed} did not replay");
        assert_eq!(here, history(seed), "seed {seed} did not replay");
    }
}
