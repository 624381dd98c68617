//! `holdfast status KEY...`: who holds each key, as far as the store can tell.

use serde::Serialize;

use crate::cli::StatusArgs;
use crate::duration;
use crate::exit::{Failure, OK};

/// One key's status, as printed by `--json`.
#[derive(Debug, Serialize)]
struct Row {
    key: String,
    held: bool,
    holder: Option<String>,
    fence: Option<u64>,
    ttl_left_ms: Option<u64>,
    waiters: Option<u64>,
}

/// Prints the status of every key, in the order given.
pub async fn status(args: StatusArgs) -> Result<u8, Failure> {
    for key in &args.keys {
        holdfast::LockKey::new(key.as_str())?;
    }
    let client = super::connect(&args.backend.url()?, None).await?;
    let mut rows = Vec::with_capacity(args.keys.len());
    for key in &args.keys {
        let st = client.status(key).await?;
        rows.push(Row {
            key: st.key,
            held: st.holder.is_some(),
            holder: st.holder.as_ref().map(|h| h.label.clone()),
            fence: st.holder.as_ref().map(|h| h.fence),
            ttl_left_ms: st.holder.as_ref().and_then(|h| h.ttl_left).map(|d| d.as_millis() as u64),
            waiters: st.waiters,
        });
    }
    if args.json {
        let text =
            serde_json::to_string_pretty(&rows).map_err(|e| Failure::new(crate::exit::INTERNAL, e.to_string()))?;
        crate::say!("{text}");
    } else {
        crate::say!("{}", table(&rows).trim_end_matches('\n'));
    }
    Ok(OK)
}

fn table(rows: &[Row]) -> String {
    let dash = || "-".to_owned();
    let mut cells = vec![["KEY".to_owned(), "HOLDER".into(), "FENCE".into(), "TTL LEFT".into(), "WAITERS".into()]];
    for r in rows {
        cells.push([
            r.key.clone(),
            r.holder.clone().unwrap_or_else(|| "(free)".into()),
            r.fence.map_or_else(dash, |f| f.to_string()),
            r.ttl_left_ms.map_or_else(dash, |ms| duration::show(std::time::Duration::from_millis(ms))),
            r.waiters.map_or_else(dash, |w| w.to_string()),
        ]);
    }
    let widths: Vec<usize> = (0..5).map(|i| cells.iter().map(|c| c[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for c in &cells {
        let line: Vec<String> = c.iter().zip(&widths).map(|(s, w)| format!("{s:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}
