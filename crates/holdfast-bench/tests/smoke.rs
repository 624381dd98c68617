//! Runs every workload briefly on SQLite and checks the report's invariants
//! (every task acquired, cycles > 0, no two holders, no lease lost), not timings.

use std::time::Duration;

use holdfast_bench::{BenchOptions, BenchReport, ProgressEvent, Workload, run};

fn options(dir: &tempfile::TempDir) -> BenchOptions {
    let mut opts = BenchOptions::new(format!("sqlite://{}/bench.db", dir.path().display()));
    opts.tasks_uncontended = 16;
    opts.tasks_contended = 8;
    opts.duration = Duration::from_millis(300);
    opts.leases = 300;
    opts.lease_ttl = Duration::from_millis(300);
    opts
}

fn check_invariants(report: &BenchReport, subjects: &[&str]) {
    for workload in [Workload::Uncontended, Workload::Contended, Workload::ContendedThink] {
        for subject in subjects {
            let r = report.result(workload, subject).unwrap_or_else(|| panic!("no {workload} result for {subject}"));
            assert!(r.cycles > 0, "{workload}/{subject}: no cycles");
            assert_eq!(r.overlaps, 0, "{workload}/{subject}: two holders at once");
            assert_eq!(r.tasks_never_acquired, 0, "{workload}/{subject}: a task never acquired");
            assert!(r.per_task_min >= 1 && r.per_task_max >= r.per_task_min, "{workload}/{subject}: {r:?}");
            assert!(r.cycles_per_sec > 0.0 && r.acquire_p50_us.is_some(), "{workload}/{subject}: {r:?}");
            if workload == Workload::Uncontended {
                assert!(r.handoffs.is_none());
            } else {
                let switches = r.handoffs.unwrap_or(0);
                assert!(switches >= r.tasks as u64 - 1, "{workload}/{subject}: only {switches} owner switches");
                assert!(r.handoff_p50_us.is_some());
            }
            // SQLite cannot count its statements.
            assert_eq!(r.store_commands_per_acquisition, None);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_runs_on_sqlite_with_invariants() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&dir);
    let events = std::sync::Mutex::new(Vec::new());
    let report = run(&opts, |e| events.lock().unwrap().push(e)).await.unwrap();

    check_invariants(&report, &["holdfast", "floor"]);
    let workloads = [Workload::Uncontended, Workload::Contended, Workload::ContendedThink];
    assert_eq!(report.ratios.len(), workloads.len(), "one holdfast/floor ratio per cycle workload");
    assert!(report.ratios.iter().all(|r| r.baseline == "floor" && r.ratio > 0.0));

    let [leases] = report.leases.as_slice() else { panic!("one many-leases result expected: {:?}", report.leases) };
    assert_eq!(leases.leases, 300);
    assert_eq!(leases.renewing, 300, "every lease renewed");
    assert_eq!(leases.lost, 0);
    assert_eq!(leases.release_errors, 0);
    assert!(leases.renew_calls > 0, "renewal ran while holding: {leases:?}");
    assert!(leases.leases_renewed_per_period > 0.0);

    let events = events.into_inner().unwrap();
    let finished = events.iter().filter(|e| matches!(e, ProgressEvent::Finished { .. })).count();
    assert_eq!(finished, 3 * 2 + 1, "a Finished event per workload and subject: {events:?}");

    let json = serde_json::to_string(&report).unwrap();
    // serde_json may round a float's last digit, so compare the rest exactly.
    let back: BenchReport = serde_json::from_str(&json).unwrap();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
    assert_eq!((back.results.len(), back.leases.len(), back.ratios.len()), (6, 1, 3));
    for (b, r) in back.results.iter().zip(&report.results) {
        assert_eq!((b.workload, &b.subject, b.cycles, b.overlaps), (r.workload, &r.subject, r.cycles, r.overlaps));
        assert!(close(b.cycles_per_sec, r.cycles_per_sec));
    }
    assert_eq!(back.leases[0].renew_calls, leases.renew_calls);
    assert!(back.ratios.iter().zip(&report.ratios).all(|(b, r)| close(b.ratio, r.ratio)));
    let table = report.to_string();
    assert!(table.contains("holdfast/floor") && table.contains("many-leases"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_and_bad_options_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&dir);
    opts.fair = true;
    let err = run(&opts, |_| {}).await.unwrap_err();
    assert!(matches!(err, holdfast::Error::Unsupported { .. }), "{err:?}");

    let mut opts = options(&dir);
    opts.tasks_contended = 0;
    assert!(matches!(run(&opts, |_| {}).await, Err(holdfast::Error::InvalidInput { .. })));
    let mut opts = options(&dir);
    opts.workloads.clear();
    assert!(matches!(run(&opts, |_| {}).await, Err(holdfast::Error::InvalidInput { .. })));
    let opts = BenchOptions::new("nope://x");
    assert!(matches!(run(&opts, |_| {}).await, Err(holdfast::Error::InvalidInput { .. })));
    assert!("think".parse::<Workload>().is_ok() && "bogus".parse::<Workload>().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_keep_the_median_and_max_cycles_caps() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&dir);
    opts.workloads = vec![Workload::Contended];
    opts.rounds = 3;
    opts.floor = false;
    opts.duration = Duration::from_secs(30);
    opts.max_cycles = Some(200);
    let report = run(&opts, |_| {}).await.unwrap();
    assert_eq!(report.results.len(), 1);
    let r = &report.results[0];
    // Every cycle is claimed before its acquire, so the cap is exact.
    assert_eq!(r.cycles, 200, "{r:?}");
    assert!(r.elapsed_secs < 30.0);
    assert!(report.ratios.is_empty() && report.floor.is_none());
}
