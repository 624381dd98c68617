//! The runner a mutation test builds against its mutated copy of holdfast:
//! `mutant-runner <config> <seeds>` runs seeds `0..seeds` with a
//! [`RunConfig`] named in [`config`] on every core and stops at the first
//! seed that fails, the way `seeds.rs`'s `failure` judges a run (a broken
//! guarantee, leases held after the cleanup window, leases left after
//! quiescence).
//!
//! It prints one tab-separated line on stdout and exits with its status:
//! - `found <seed> <guarantee> <what>`, exit 1: the lowest failing seed (a
//!   run stops only the seeds above one that failed, so the seed reported
//!   does not depend on thread timing);
//! - `clean <seeds>`, exit 0: every seed passed.
//!
//! The guarantee is the checker's (`exclusion`, `fencing`, `stale write`,
//! `lost first`), or `held after cleanup`, or `left behind`.
//!
//! `mutant-runner <config> <seeds> all` runs every seed and prints each
//! failure and how many failed: how often a config finds a mutant, when
//! tuning one (keep the mutant's workspace with `MUTANTS_KEEP=1`).
//!
//! Compiled twice: as a module of the `sim` test (so that it is formatted,
//! linted and kept in step with the testkit), and as the `main` of the
//! runner crate in the mutation's temporary workspace.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use holdfast_testkit::sim::run::{RunConfig, RunOutcome, run_seed};

/// Why a run failed, as (guarantee, what), or `None`. Of several
/// violations, the least by guarantee and text: the checker's order is not
/// the same from one process to the next (it drains a `HashMap`), and a
/// seed should tell the same story every time.
fn failure(out: &RunOutcome) -> Option<(String, String)> {
    if let Some(v) = out.verdict.violations.iter().min_by(|a, b| (a.guarantee, &a.what).cmp(&(b.guarantee, &b.what))) {
        let more = match out.verdict.violations.len() - 1 {
            0 => String::new(),
            n => format!(" (and {n} more violations)"),
        };
        return Some((v.guarantee.to_owned(), format!("{}{more}", v.what)));
    }
    if let Some(held) = out.held_after_cleanup.filter(|h| *h > 0) {
        return Some(("held after cleanup".to_owned(), format!("{held} leases still held after the cleanup window")));
    }
    if out.left_behind > 0 {
        return Some(("left behind".to_owned(), format!("{} leases left after quiescence", out.left_behind)));
    }
    None
}

/// The run configs a mutation can ask for.
fn config(name: &str) -> RunConfig {
    match name {
        "default" => RunConfig::default(),
        "long" => RunConfig::long_leases(),
        // Abandoned attempts, made visible. A grant an abandoned attempt
        // leaves shows only if it is still held `cleanup_within` after the
        // run, so only if it was made in the last `ttl - cleanup_within`;
        // and a dropped attempt leaves one only if a granting request was
        // in flight. With long leases' 30 s (waits up to 15 s before the
        // drop) and 40 ms delays that is rare: the cleanup mutant failed 5
        // of 3,000 seeds. 5 s leases, delays up to 240 ms (round trips
        // within the 500 ms call timeout) and a 3 s window (longer than the
        // 2 s backoff of a release retried while partitioned) make it six
        // times as likely (30 of 3,000), in runs half as long.
        "cleanup" => RunConfig {
            ttl: Duration::from_secs(5),
            max_delay: Duration::from_millis(240),
            cleanup_within: Some(Duration::from_secs(3)),
            ops: 30,
            ..RunConfig::long_leases()
        },
        "redlock" => RunConfig { redlock: true, ..RunConfig::default() },
        "fallback" => RunConfig { fallback: true, ..RunConfig::default() },
        "shares" => RunConfig::default().with_shares(),
        other => {
            eprintln!("mutant-runner: unknown config {other:?} (default, long, cleanup, redlock, fallback, shares)");
            std::process::exit(2);
        }
    }
}

/// Runs seeds `0..seeds` on `threads` threads, each taking the next seed;
/// returns the lowest failing seed and why it failed.
fn first_failure(config: &RunConfig, seeds: u64, threads: u64) -> Option<(u64, (String, String))> {
    let next = AtomicU64::new(0);
    let found: Mutex<Option<(u64, (String, String))>> = Mutex::new(None);
    let lowest = || found.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map_or(u64::MAX, |(s, _)| *s);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    // Seeds are taken in order: once one above a failure is
                    // taken, every lower seed has been taken already.
                    if seed >= seeds || seed > lowest() {
                        return;
                    }
                    if let Some(why) = failure(&run_seed(seed, config)) {
                        let mut f = found.lock().unwrap_or_else(|p| p.into_inner());
                        if f.as_ref().is_none_or(|(s, _)| seed < *s) {
                            *f = Some((seed, why));
                        }
                    }
                }
            });
        }
    });
    found.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// Runs every seed and prints each failure (for tuning a mutation's config).
fn all_failures(config: &RunConfig, seeds: u64) {
    let mut failed = 0;
    for seed in 0..seeds {
        if let Some((guarantee, what)) = failure(&run_seed(seed, config)) {
            failed += 1;
            println!("failed\t{seed}\t{guarantee}\t{what}");
        }
    }
    println!("{failed} of {seeds} seeds failed");
}

pub fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (name, seeds, all) = match args.as_slice() {
        [name, seeds] => (name, seeds, false),
        [name, seeds, all] if all == "all" => (name, seeds, true),
        _ => {
            eprintln!("usage: mutant-runner <config> <seeds> [all]");
            std::process::exit(2);
        }
    };
    let Ok(seeds) = seeds.parse::<u64>() else {
        eprintln!("mutant-runner: not a number of seeds: {seeds:?}");
        std::process::exit(2);
    };
    if all {
        all_failures(&config(name), seeds);
        return;
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    match first_failure(&config(name), seeds, threads) {
        Some((seed, (guarantee, what))) => {
            println!("found\t{seed}\t{guarantee}\t{}", what.replace(['\t', '\n'], " "));
            std::process::exit(1);
        }
        None => println!("clean\t{seeds}"),
    }
}
