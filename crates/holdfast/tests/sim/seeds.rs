//! Seeded fault runs.

use std::time::Instant;

use holdfast_testkit::history::{EndCause, Event};
use holdfast_testkit::sim::run::{RunConfig, run_seed};

#[test]
fn many_seeds() {
    let n: u64 = std::env::var("SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(50);
    let started = Instant::now();
    let (mut grants, mut lost, mut refused, mut bad) = (0, 0, 0, 0);
    for seed in 0..n {
        let out = run_seed(seed, &RunConfig::default());
        grants += out.verdict.grants;
        lost += out.events.iter().filter(|e| matches!(e, Event::Ended { cause: EndCause::Lost, .. })).count();
        refused += out.verdict.writes_refused;
        if !out.verdict.ok() || out.left_behind > 0 {
            bad += 1;
            eprintln!("seed {seed}: left {} {:?}", out.left_behind, out.verdict.violations.first());
        }
    }
    eprintln!("{n} seeds, {grants} grants, {lost} lost, {refused} refused, {bad} bad, {:?}", started.elapsed());
    assert_eq!(bad, 0);
}
