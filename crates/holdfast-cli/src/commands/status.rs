//! `holdfast status KEY...`: who holds each key, as far as the store can tell;
//! `--watch` keeps showing it (see [`watch`]).

mod watch;

use serde::Serialize;

use crate::cli::StatusArgs;
use crate::duration;
use crate::exit::{Failure, OK};

/// One key's status, as printed by `--json` (`status` and `list`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Row {
    key: String,
    held: bool,
    /// The exclusive holder.
    holder: Option<String>,
    fence: Option<u64>,
    ttl_left_ms: Option<u64>,
    /// Holders of shared leases (semaphore permits, readers).
    shared: Vec<Share>,
    /// The permit limit recorded with the shared leases (absent: none held,
    /// or a read-write lock's readers, which have no limit).
    limit: Option<u32>,
    waiters: Option<u64>,
}

/// One shared lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Share {
    holder: String,
    fence: u64,
    ttl_left_ms: Option<u64>,
    weight: u32,
}

fn millis(d: Option<std::time::Duration>) -> Option<u64> {
    d.map(|d| d.as_millis() as u64)
}

impl Row {
    /// The row of one key's status.
    pub(crate) fn of(st: holdfast::LockStatus) -> Row {
        Row {
            held: st.holder.is_some() || !st.shared.is_empty(),
            holder: st.holder.as_ref().map(|h| h.label.clone()),
            fence: st.holder.as_ref().map(|h| h.fence),
            ttl_left_ms: millis(st.holder.as_ref().and_then(|h| h.ttl_left)),
            shared: st
                .shared
                .iter()
                .map(|h| Share {
                    holder: h.label.clone(),
                    fence: h.fence,
                    ttl_left_ms: millis(h.ttl_left),
                    weight: h.weight,
                })
                .collect(),
            limit: st.limit.filter(|l| *l != holdfast::backend::UNLIMITED),
            waiters: st.waiters,
            key: st.key,
        }
    }

    /// The row without its TTLs left, which change at every look: what
    /// `--watch` compares to tell a change.
    fn without_ttls(&self) -> Row {
        let mut r = self.clone();
        r.ttl_left_ms = None;
        r.shared.iter_mut().for_each(|s| s.ttl_left_ms = None);
        r
    }
}

/// Prints the status of every key, in the order given; with `--watch`,
/// again whenever it changes.
pub async fn status(args: StatusArgs) -> Result<u8, Failure> {
    for key in &args.keys {
        holdfast::LockKey::new(key.as_str())?;
    }
    let client = super::connect_read_only(&args.backend).await?;
    if args.watch {
        return watch::watch(&client, &args).await;
    }
    let rows = read(&client, &args.keys).await?;
    print(&rows, args.json)?;
    Ok(OK)
}

/// The status of every key, in the order given.
async fn read(client: &holdfast::Client, keys: &[String]) -> Result<Vec<Row>, Failure> {
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        rows.push(Row::of(client.status(key).await?));
    }
    Ok(rows)
}

/// Prints rows as a table, or as a JSON array.
pub(crate) fn print(rows: &[Row], json: bool) -> Result<(), Failure> {
    if json {
        let text =
            serde_json::to_string_pretty(rows).map_err(|e| Failure::new(crate::exit::INTERNAL, e.to_string()))?;
        crate::say!("{text}");
    } else {
        crate::say!("{}", table(rows).trim_end_matches('\n'));
    }
    Ok(())
}

/// One line per holder (a free key: one line saying so).
pub(crate) fn table(rows: &[Row]) -> String {
    let dash = || "-".to_owned();
    let ttl = |ms: Option<u64>| ms.map_or_else(dash, |ms| duration::show(std::time::Duration::from_millis(ms)));
    let mut cells =
        vec![["KEY".to_owned(), "HOLDER".into(), "MODE".into(), "FENCE".into(), "TTL LEFT".into(), "WAITERS".into()]];
    for r in rows {
        let waiters = r.waiters.map_or_else(dash, |w| w.to_string());
        if let Some(holder) = &r.holder {
            let fence = r.fence.map_or_else(dash, |f| f.to_string());
            cells.push([r.key.clone(), holder.clone(), "exclusive".into(), fence, ttl(r.ttl_left_ms), waiters.clone()]);
        }
        for s in &r.shared {
            let mode = match r.limit {
                Some(limit) => format!("{} of {limit} permits", s.weight),
                None => "read".to_owned(),
            };
            cells.push([
                r.key.clone(),
                s.holder.clone(),
                mode,
                s.fence.to_string(),
                ttl(s.ttl_left_ms),
                waiters.clone(),
            ]);
        }
        if !r.held {
            cells.push([r.key.clone(), "(free)".into(), dash(), dash(), dash(), waiters]);
        }
    }
    let widths: Vec<usize> = (0..6).map(|i| cells.iter().map(|c| c[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for c in &cells {
        let line: Vec<String> = c.iter().zip(&widths).map(|(s, w)| format!("{s:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}
