//! `holdfast elect NAME [-- CMD]` and `holdfast elect --observe NAME`:
//! leader election from the shell, as `etcdctl elect NAME [PROPOSAL]` and
//! `etcdctl elect -l NAME`.
//!
//! An election is a lock (the library's [`Election`](holdfast::Election)):
//! its name is the lock key, the leader's value is the grant's label, its
//! term is the grant's fence. So a campaign is `holdfast run` on that key,
//! with the value as the label, asking for grants in campaign order where
//! the store queues waiters: CMD runs while this candidate leads, with the
//! same supervision (a lost leadership stops it, exit 74). Without CMD the
//! candidate leads until a signal. `--observe` prints each new leader.

use std::pin::pin;

use futures::StreamExt;

use crate::cli::{ElectArgs, RunArgs};
use crate::exit::{Failure, OK};

use super::run::{Role, Signals};

/// Campaigns (and runs CMD while leading, or leads until a signal), or observes.
pub async fn elect(args: ElectArgs) -> Result<u8, Failure> {
    if args.observe {
        return observe(args).await;
    }
    let role = Role::Leader { value: args.value.clone() };
    let run = RunArgs {
        backend: args.backend,
        metrics_addr: None,
        key: args.name,
        ttl: args.ttl,
        wait: args.wait,
        kill_after: args.kill_after,
        max_hold: None,
        label: args.value,
        permits: None,
        shared: false,
        fair: false,
        busy_exit: None,
        quiet: args.quiet,
        command: args.command,
    };
    super::run::run_as(run, role).await
}

/// Prints `term T: VALUE` for each new leader, in increasing term, until a
/// signal (exit 0). A term that began and ended between two reads (every
/// 100 ms) is not seen. A store error is printed once, and observing goes on.
async fn observe(args: ElectArgs) -> Result<u8, Failure> {
    holdfast::LockKey::new(args.name.as_str())?;
    let client = super::connect_read_only(&args.backend).await?;
    let election = client.election(args.name.as_str());
    let mut leaders = pin!(election.observe());
    let mut signals = Signals::new()?;
    let mut last_error = None;
    loop {
        tokio::select! {
            next = leaders.next() => match next {
                Some(Ok(leader)) => {
                    crate::say!("term {}: {}", leader.term, leader.value);
                    last_error = None;
                }
                Some(Err(e)) => {
                    let text = Failure::from(e).message;
                    if last_error.as_ref() != Some(&text) {
                        eprintln!("holdfast: warning: cannot read the leader of {:?}: {text}", args.name);
                        last_error = Some(text);
                    }
                }
                None => return Ok(OK),
            },
            _ = signals.recv() => return Ok(OK),
        }
    }
}
