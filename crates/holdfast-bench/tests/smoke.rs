//! Runs every workload briefly on SQLite and checks the report's invariants
//! (every task acquired, cycles > 0, no two holders, no lease lost), not timings.

use std::time::Duration;

use holdfast_bench::{BenchOptions, BenchReport, ProgressEvent, Workload, run};

fn options(dir: &tempfile::TempDir) -> BenchOptions {
    let mut opts = BenchOptions::new(format!("sqlite://{}/bench.db", dir.path().display()));
    opts.tasks_uncontended = 16;
    opts.tasks_contended = 8;
    opts.tasks_semaphore = 12;
    opts.permits = 3;
    opts.tasks_rwlock = 8;
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
    for workload in [Workload::Semaphore, Workload::RwLock, Workload::Readers] {
        for subject in ["holdfast", "floor"] {
            let r = report.result(workload, subject).unwrap_or_else(|| panic!("no {workload} result for {subject}"));
            assert!(r.cycles > 0 && r.tasks_never_acquired == 0, "{workload}/{subject}: {r:?}");
            assert_eq!(r.overlaps, 0, "{workload}/{subject}: the permit bound or exclusion broke");
            assert!(r.handoffs.is_none(), "hand-offs are for one holder at a time");
        }
    }
    assert!(report.notes.is_empty(), "{:?}", report.notes);
    let workloads = [
        Workload::Uncontended,
        Workload::Contended,
        Workload::ContendedThink,
        Workload::Semaphore,
        Workload::RwLock,
        Workload::Readers,
    ];
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
    assert_eq!(finished, 6 * 2 + 1, "a Finished event per workload and subject: {events:?}");

    let json = serde_json::to_string(&report).unwrap();
    // serde_json may round a float's last digit, so compare the rest exactly.
    let back: BenchReport = serde_json::from_str(&json).unwrap();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
    assert_eq!((back.results.len(), back.leases.len(), back.ratios.len()), (12, 1, 6));
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
    assert_eq!("readers".parse::<Workload>().ok(), Some(Workload::Readers));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_and_hot_run_in_process_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&dir);
    opts.workloads.clear();
    let mut held = holdfast_bench::HeldOptions::new(150);
    // Renewal every 500 ms, lost only after a stall of a second: with a
    // 600 ms TTL the suite's own parallel tests on 2 cores once stalled the
    // one session row's renewal past its lapse, and every lease was lost.
    held.lease_ttl = Duration::from_millis(1_500);
    held.duration = Duration::from_millis(1_200);
    held.churn = true;
    opts.held = Some(held);
    let mut hot = holdfast_bench::HotOptions::new(12);
    hot.duration = Duration::from_millis(500);
    opts.hot = Some(hot);
    let report = run(&opts, |_| {}).await.unwrap();
    assert!(report.results.is_empty() && report.leases.is_empty() && report.floor.is_none());

    let held = report.held.as_ref().expect("held ran");
    assert_eq!((held.leases, held.renewing, held.lost, held.lost_fired, held.release_errors), (150, 150, 0, 0, 0));
    assert_eq!((held.acquire.ops, held.acquire_first.ops, held.acquire_last.ops, held.release.ops), (150, 75, 75, 150));
    assert!(held.renew_calls > 0 && held.largest_renew_batch > 0, "renewal ran while holding: {held:?}");
    assert!(held.idle_probe.samples > 0 && held.probe.samples > 0 && held.probe.errors == 0, "{held:?}");
    assert!(held.churn_cycles.is_some_and(|c| c > 0) && held.churn_errors == 0, "{held:?}");

    let hot = report.hot.as_ref().expect("hot ran");
    assert_eq!((hot.tasks, hot.procs, hot.never_acquired, hot.overlaps, hot.release_errors), (12, 1, 0, 0, 0));
    assert!(hot.acquisitions >= 12 && hot.per_task_min >= 1, "{hot:?}");
    assert!((0.0..=1.0).contains(&hot.reacquired_share), "{hot:?}");
    assert!(hot.acquire_calls_per_acquisition >= 1.0 && hot.store_commands_per_acquisition.is_none(), "{hot:?}");

    let table = report.to_string();
    assert!(table.contains("held: 150 leases") && table.contains("hot: 12 tasks"), "{table}");
    let back: BenchReport = serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
    assert_eq!(back.hot.map(|h| h.acquisitions), Some(hot.acquisitions));

    // Several processes need a way to start them; without it, a typed error before any work.
    let mut opts = options(&dir);
    let mut hot = holdfast_bench::HotOptions::new(4);
    hot.procs = 2;
    opts.hot = Some(hot);
    assert!(matches!(run(&opts, |_| {}).await, Err(holdfast::Error::InvalidInput { what: "procs", .. })));
}
