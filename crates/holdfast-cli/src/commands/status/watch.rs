//! `holdfast status --watch KEY...`: a live view. Every `--interval` it
//! reads the keys again; on a terminal it redraws the table in place (the
//! TTLs count down), elsewhere (a pipe, a log) it prints a new table, under
//! a line with the time, only when a key's holder, fences, shares or
//! waiters changed (with `--json`: one JSON array per line, on change).
//! Ctrl-C (SIGINT) or SIGTERM ends it with exit 0. A store that fails
//! while watched is reported on stderr and read again at the next tick.

use std::io::IsTerminal;
use std::time::SystemTime;

use tokio::signal::unix::{SignalKind, signal};

use super::{Row, read, table};
use crate::cli::StatusArgs;
use crate::exit::{Failure, INTERNAL, OK, UNAVAILABLE};

/// Clears the terminal and puts the cursor top left.
const CLEAR: &str = "\x1b[2J\x1b[H";

/// Watches `args.keys` until Ctrl-C or SIGTERM.
pub(super) async fn watch(client: &holdfast::Client, args: &StatusArgs) -> Result<u8, Failure> {
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| Failure::new(INTERNAL, e.to_string()))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| Failure::new(INTERNAL, e.to_string()))?;
    let tty = std::io::stdout().is_terminal() && !args.json;
    let looping = async {
        let mut shown: Option<Vec<Row>> = None;
        let mut tick = tokio::time::interval(args.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let rows = match read(client, &args.keys).await {
                Ok(rows) => rows,
                Err(f) if f.code == UNAVAILABLE => {
                    eprintln!("holdfast: {} (trying again in {})", f.message, crate::duration::show(args.interval));
                    continue;
                }
                Err(f) => return Err(f),
            };
            let seen: Vec<Row> = rows.iter().map(Row::without_ttls).collect();
            let changed = shown.as_ref() != Some(&seen);
            let now = humantime::format_rfc3339_seconds(SystemTime::now());
            if tty {
                let every = crate::duration::show(args.interval);
                crate::say!("{CLEAR}Every {every}: holdfast status {}    {now}\n", args.keys.join(" "));
                crate::say!("{}", table(&rows).trim_end_matches('\n'));
            } else if changed && args.json {
                let text = serde_json::to_string(&rows).map_err(|e| Failure::new(INTERNAL, e.to_string()))?;
                crate::say!("{text}");
            } else if changed {
                crate::say!("-- {now}\n{}", table(&rows).trim_end_matches('\n'));
            }
            shown = Some(seen);
        }
    };
    tokio::select! {
        r = looping => r,
        _ = sigint.recv() => Ok(OK),
        _ = sigterm.recv() => Ok(OK),
    }
}
