//! The warm-up before the measured workloads ([`BenchOptions::warm_up`]):
//! the store first serves the ordinary lock work a production store serves
//! all day, so that scale figures are taken on tables, keyspaces and
//! statistics with a history, not only on a fresh store (issue 34: a
//! PostgreSQL database lost every one of 100,000 held leases once it had
//! served these workloads, and none when fresh).

use std::sync::Arc;
use std::time::Duration;

use holdfast::Result;

use crate::locker::HoldfastLocker;
use crate::workload::{CycleSpec, Mix, run_cycles};
use crate::{BenchOptions, ProgressEvent, Workload};

/// The workloads of the warm-up, in the order they run.
pub(crate) const WARM_UP: [Workload; 4] =
    [Workload::Uncontended, Workload::Contended, Workload::Semaphore, Workload::RwLock];

/// Runs each of [`WARM_UP`] on holdfast for `each`, with the task counts of
/// `opts`, keys under `prefix`; the shared-lease ones only where the store
/// has shared leases. Returns one line for the report's notes saying what ran.
pub(crate) async fn warm_up(
    holdfast: &Arc<HoldfastLocker>,
    shared_leases: bool,
    opts: &BenchOptions,
    each: Duration,
    prefix: &str,
    progress: &impl Fn(ProgressEvent),
) -> Result<String> {
    let mut done = Vec::new();
    for workload in WARM_UP {
        let (tasks, mix) = match workload {
            Workload::Uncontended => (opts.tasks_uncontended, Mix::Exclusive),
            Workload::Semaphore => (opts.tasks_semaphore, Mix::Semaphore { permits: opts.permits }),
            Workload::RwLock => (opts.tasks_rwlock, Mix::ReadWrite { write_every: 10 }),
            _ => (opts.tasks_contended, Mix::Exclusive),
        };
        if matches!(mix, Mix::Semaphore { .. } | Mix::ReadWrite { .. }) && !shared_leases {
            done.push(format!("{workload} not run (no shared leases)"));
            continue;
        }
        let spec = CycleSpec {
            workload,
            subject: "warm-up".to_owned(),
            tasks,
            duration: each,
            max_cycles: None,
            think_time: Duration::ZERO,
            key_prefix: format!("{prefix}/{workload}"),
            mix,
        };
        let result = run_cycles(holdfast.clone(), &spec, None, progress).await?;
        done.push(format!("{workload} {} cycles", result.cycles));
    }
    Ok(format!("warm-up ({each:?} each, unmeasured): {}", done.join(", ")))
}
