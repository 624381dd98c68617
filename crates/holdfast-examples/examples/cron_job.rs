//! A scheduled job that runs at most once at a time, however many instances
//! of the service fire the same schedule.
//!
//! Shows `try_acquire` (an instance that finds the job running elsewhere
//! skips this round instead of queueing up), `lost()` (the job stops if its
//! lease is lost while it runs, so it never runs unprotected), and
//! `Client::with_lock`, the short form for "wait a bit, run, release".
//!
//! ```text
//! cargo run -p holdfast-examples --example cron_job
//! ```
//!
//! The instances are three clients in one process here; in production they
//! are separate processes or machines sharing the lock URL.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use holdfast::{Client, LockOptions};

const JOB: &str = "cron:nightly-report";

/// The job itself. Counts how many copies run at once, to show it is one.
async fn nightly_report(running: &AtomicUsize) -> usize {
    let copies = running.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.fetch_sub(1, Ordering::SeqCst);
    copies
}

/// What happened when the schedule fired on one instance.
#[derive(Debug, PartialEq)]
enum Round {
    /// This instance ran the job; `copies` ran at once (always 1).
    Ran { copies: usize },
    /// Another instance was running it.
    Skipped,
    /// The lease was lost mid-run; the job was stopped.
    Abandoned,
}

/// Called by each instance's scheduler.
async fn on_schedule(client: &Client, running: &AtomicUsize) -> holdfast::Result<Round> {
    // The TTL only matters if this process dies: the lease renews itself
    // while the guard lives, however long the job takes.
    let Some(guard) = client.mutex(JOB).ttl(Duration::from_secs(10)).try_acquire().await? else {
        return Ok(Round::Skipped);
    };
    tokio::select! {
        copies = nightly_report(running) => {
            guard.release().await?;
            Ok(Round::Ran { copies })
        }
        // Renewal failed for a whole TTL (the store unreachable): another
        // instance may start the job now, so this one stops here. Dropping
        // the job's future cancels it at its current await point.
        _ = guard.lost() => Ok(Round::Abandoned),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(Client::connect(&url).await?);
    }
    let running = AtomicUsize::new(0);

    for tick in 1..=3 {
        // Every instance's scheduler fires at the same moment.
        let rounds = futures::future::join_all(instances.iter().map(|client| on_schedule(client, &running))).await;
        let rounds: Vec<Round> = rounds.into_iter().collect::<holdfast::Result<_>>()?;
        println!("tick {tick}: {rounds:?}");
        assert_eq!(rounds.iter().filter(|r| **r == Round::Ran { copies: 1 }).count(), 1);
    }

    // A manual run (an admin's "run now" button) waits up to 5 s for a
    // scheduled run to finish, then runs and releases.
    let mut options = LockOptions::with_ttl(Duration::from_secs(10));
    options.wait_timeout = Some(Duration::from_secs(5));
    let copies = instances[0].with_lock(JOB, options, async |_guard| nightly_report(&running).await).await?;
    println!("manual run: {copies} copy running");
    Ok(())
}
