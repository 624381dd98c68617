//! The plain-text report: the summary, the per-fault table, each guarantee
//! with its verdict, and every violation with the events around it.

use std::fmt::Write as _;

use super::check::{FREE_BOUND, Findings, Row};
use super::record::{Micros, Record};

/// Milliseconds, for people.
pub fn ms(us: Micros) -> String {
    if us.abs() >= 10_000_000 { format!("{:.1}s", us as f64 / 1e6) } else { format!("{:.1}ms", us as f64 / 1e3) }
}

/// The totals over every fault, less what broke only as a documented
/// weakness (counted apart, in [`Findings::weaknesses`]).
pub fn counted(f: &Findings) -> Row {
    let mut total = f.total();
    for w in &f.weaknesses {
        match w.guarantee {
            "exclusion" => total.double_grants = total.double_grants.saturating_sub(1),
            "fencing" => total.fence_faults = total.fence_faults.saturating_sub(1),
            "stale write" => total.stale_accepted = total.stale_accepted.saturating_sub(1),
            _ => {}
        }
    }
    total
}

/// The guarantees and whether each held: (name, ok, detail).
pub fn guarantees(f: &Findings) -> Vec<(&'static str, bool, String)> {
    let count = |g: &str| f.violations.iter().filter(|v| v.guarantee == g).count();
    let total = counted(f);
    let free = total.longest_free.map_or("no holder was killed".to_owned(), |l| format!("longest {}", ms(l)));
    vec![
        ("exclusion: never two holders", count("exclusion") == 0, format!("{} double grants", total.double_grants)),
        ("fencing: fences strictly increase", count("fencing") == 0, format!("{} fence faults", count("fencing"))),
        ("register: no stale write accepted", count("stale write") == 0, format!("{} accepted", total.stale_accepted)),
        ("writes only while the lease is believed held", count("belief") == 0, format!("{} outside", count("belief"))),
        (
            "expiry: a killed holder's key is free within the store's lease + 1s",
            count("expiry") == 0,
            format!("{free} (bound {} + 1s = {})", ms(f.expiry), ms(f.expiry + FREE_BOUND)),
        ),
    ]
}

/// The per-fault table's column names, as the text report prints them (the
/// HTML table shows the same columns, from the same cells).
pub const ROW_COLUMNS: [&str; 12] = [
    "fault",
    "injected",
    "on-holder",
    "past-ttl",
    "double-grants",
    "fence-faults",
    "stale-accepted",
    "stale-refused",
    "late-writes",
    "lost()",
    "longest-free",
    "ran-after-loss",
];

/// One row of the per-fault table: its cells after the fault's name, in
/// [`ROW_COLUMNS`] order. Both reports print these cells.
pub fn row_cells(r: &Row) -> [String; 11] {
    [
        r.injected.to_string(),
        r.on_holders.to_string(),
        r.past_ttl.to_string(),
        r.double_grants.to_string(),
        r.fence_faults.to_string(),
        r.stale_accepted.to_string(),
        r.stale_refused.to_string(),
        r.late_writes.to_string(),
        r.lost.to_string(),
        r.longest_free.map_or("-".to_owned(), ms),
        if r.ran_after_loss == 0 {
            "0".to_owned()
        } else {
            format!("{} ({})", r.ran_after_loss, ms(r.longest_after_loss))
        },
    ]
}

/// The per-fault rows with the total last: (fault, row).
pub fn fault_rows(f: &Findings) -> Vec<(&'static str, Row)> {
    f.rows.iter().map(|(n, r)| (*n, r.clone())).chain([("total", f.total())]).collect()
}

/// A text line of cells, each right-aligned to its column name's width.
fn text_line<'a>(cells: impl IntoIterator<Item = &'a str>) -> String {
    let mut line = String::new();
    for (i, (cell, column)) in cells.into_iter().zip(ROW_COLUMNS).enumerate() {
        if i == 0 {
            let _ = write!(line, "{cell:<9}");
        } else {
            let _ = write!(line, " {cell:>w$}", w = column.len());
        }
    }
    line
}

/// The whole text report.
pub fn text(f: &Findings, records: &[Record], store: &str) -> String {
    let mut s = String::new();
    let (t, c) = (f.total(), counted(f));
    let _ = writeln!(s, "store              {store}");
    let _ = writeln!(s, "ttl                {}", ms(f.ttl));
    if f.expiry > f.ttl {
        let _ =
            writeln!(s, "store lease        {} (a dead holder's lease lasts this long on this store)", ms(f.expiry));
    }
    let _ = writeln!(s, "run                {}", ms(f.end));
    let _ = writeln!(s, "grants             {}", f.beliefs.len());
    let _ = writeln!(s, "writes accepted    {}", f.writes.0);
    let _ = writeln!(s, "writes refused     {}", f.writes.1);
    let _ = writeln!(s, "store errors       {}", f.errors);
    let _ = writeln!(s, "faults injected    {}", t.injected);
    let _ = writeln!(s, "pauses past ttl    {}", t.past_ttl);
    // Outside documented weaknesses; those are counted on the `weaknesses` line.
    let _ = writeln!(s, "double grants      {}", c.double_grants);
    let _ = writeln!(s, "fence faults       {}", c.fence_faults);
    let _ = writeln!(s, "stale accepted     {}", c.stale_accepted);
    let _ = writeln!(s, "stale refused      {}", t.stale_refused);
    let _ = writeln!(s, "late writes        {}", t.late_writes);
    let _ = writeln!(s, "lost seen          {}", t.lost);
    let _ = writeln!(s, "longest free       {}", t.longest_free.map_or("-".to_owned(), ms));
    let _ = writeln!(s, "ran after loss     {} (longest {})", t.ran_after_loss, ms(t.longest_after_loss));
    let _ = writeln!(s, "weaknesses         {}", f.weaknesses.len());
    let _ = writeln!(s);
    let _ = writeln!(s, "{}", text_line(ROW_COLUMNS));
    for (name, row) in fault_rows(f) {
        let cells = row_cells(&row);
        let _ = writeln!(s, "{}", text_line([name].into_iter().chain(cells.iter().map(String::as_str))));
    }
    let _ = writeln!(s);
    for (name, ok, detail) in guarantees(f) {
        let _ = writeln!(s, "{:<6} {name}: {detail}", if ok { "ok" } else { "BROKEN" });
    }
    for v in &f.violations {
        let _ = writeln!(s, "\nBROKEN {} at {}: {}", v.guarantee, ms(v.at), v.what);
        let _ = writeln!(s, "  events around it:");
        for r in around(records, v.at, f.ttl, &v.pids) {
            let _ = writeln!(s, "    {:>10}  {}", ms(r.t()), serde_json::to_string(r).unwrap_or_default());
        }
    }
    for v in &f.weaknesses {
        let _ = writeln!(
            s,
            "\nWEAKNESS (documented: a restart without persistence loses locks) {} at {}: {}",
            v.guarantee,
            ms(v.at),
            v.what
        );
    }
    let verdict = if f.ok() {
        "ok: every guarantee held".to_owned()
    } else {
        let broken: Vec<_> = guarantees(f).into_iter().filter(|g| !g.1).map(|g| g.0).collect();
        format!("BROKEN: {}", broken.join("; "))
    };
    let _ = writeln!(s, "\nresult             {verdict}");
    s
}

/// Up to 16 records within two TTLs before and one after `at` that concern
/// `pids` or are faults or grants.
pub fn around<'a>(records: &'a [Record], at: Micros, ttl: Micros, pids: &[u32]) -> Vec<&'a Record> {
    let concerns = |r: &Record| match r {
        Record::Grant { pid, .. }
        | Record::Write { pid, .. }
        | Record::Lost { pid, .. }
        | Record::Release { pid, .. }
        | Record::Fault { pid, .. } => pids.contains(pid) || matches!(r, Record::Grant { .. } | Record::Fault { .. }),
        _ => false,
    };
    let mut near: Vec<&Record> =
        records.iter().filter(|r| r.t() >= at - 2 * ttl && r.t() <= at + ttl && concerns(r)).collect();
    if near.len() > 16 {
        let i = near.iter().position(|r| r.t() >= at).unwrap_or(near.len()).saturating_sub(8);
        near = near[i.min(near.len() - 16)..][..16].to_vec();
    }
    near
}
