//! The plain-text report: the summary (naming the primitive and its
//! property), the per-fault table with a note in words under each row that
//! has findings within a documented weakness, a legend of the columns, each
//! guarantee with its verdict, and every violation with the events around it.

use std::fmt::Write as _;

use super::findings::{FREE_BOUND, Findings, RESTART_WEAKNESS, Row, finding_words, weakness_note};
use super::record::{Micros, Record};

/// A duration for people, in the unit that reads best: `750 µs`, `1.5 ms`,
/// `988 ms`, `1.5 s`, `10 s` (never `10000ms`).
pub fn ms(us: Micros) -> String {
    let shown = holdfast_verify::properties::human(std::time::Duration::from_micros(us.unsigned_abs()));
    if us < 0 { format!("-{shown}") } else { shown }
}

/// The guarantees and whether each held: (name, ok, detail). The first two
/// are the primitive's property and its fences, in its own words.
pub fn guarantees(f: &Findings) -> Vec<(String, bool, String)> {
    let count = |g: &str| f.violations.iter().filter(|v| v.guarantee == g).count();
    let weak = |g: &str| f.weaknesses.iter().filter(|v| v.guarantee == g).count();
    let also = |g: &str| match weak(g) {
        0 => String::new(),
        n => format!("; {n} within documented weaknesses"),
    };
    let total = f.total();
    let free = total.longest_free.map_or("no holder was killed".to_owned(), |l| format!("longest {}", ms(l)));
    let property = f.property();
    vec![
        (
            property.exclusion(),
            count("exclusion") == 0,
            format!("{} unexpected{}", finding_words("exclusion", total.double_grants), also("exclusion")),
        ),
        (
            property.fencing().to_owned(),
            count("fencing") == 0,
            format!("{} unexpected{}", finding_words("fencing", count("fencing") as u64), also("fencing")),
        ),
        (
            "register: no stale write accepted".to_owned(),
            count("stale write") == 0,
            format!("{} accepted{}", total.stale_accepted, also("stale write")),
        ),
        (
            "writes only while the lease is believed held".to_owned(),
            count("belief") == 0,
            format!("{} outside", count("belief")),
        ),
        (
            "expiry: a killed holder's key is granted again within the store's lease + 1 s".to_owned(),
            count("expiry") == 0,
            format!("{free} (bound {} + 1 s = {})", ms(f.expiry), ms(f.expiry + FREE_BOUND)),
        ),
    ]
}

/// The per-fault table's column names, as the text report prints them (the
/// HTML table shows the same columns, from the same cells).
pub const ROW_COLUMNS: [&str; 13] = [
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
    "weakness",
];

/// What each column counts, for the legend of both reports.
pub const COLUMN_LEGEND: [(&str, &str); 13] = [
    ("fault", "the fault findings follow (the latest on one of their processes within 4 x TTL + 1 s); none: no fault"),
    ("injected", "faults of this kind injected"),
    ("on-holder", "of which hit a process that held the lock"),
    ("past-ttl", "pauses longer than the TTL"),
    (
        "double-grants",
        "unexpected moments the primitive's property broke: two holders (mutex), more than N permits (semaphore), a writer beside anyone (rwlock), two leaders (election)",
    ),
    ("fence-faults", "unexpected fences (terms) repeated or going backwards"),
    ("stale-accepted", "writes the register took with a fence below the highest (must be 0)"),
    ("stale-refused", "stale writes the register refused: the fence at work"),
    ("late-writes", "writes that reached the register after their writer's belief ended"),
    ("lost()", "holders that saw lost() or failed their lease check"),
    ("longest-free", "the longest a killed holder's key stood free before the next grant"),
    ("ran-after-loss", "holders that acted after their lease ran out (the longest, in brackets)"),
    (
        "weakness",
        "findings within a documented weakness of the store (not counted as unexpected; the note under the row names it)",
    ),
];

/// One row of the per-fault table: its cells after the fault's name, in
/// [`ROW_COLUMNS`] order. Both reports print these cells.
pub fn row_cells(r: &Row) -> [String; 12] {
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
        r.longest_free.map_or("-".to_owned(), ms).replace(' ', ""),
        if r.ran_after_loss == 0 {
            "0".to_owned()
        } else {
            format!("{} ({})", r.ran_after_loss, ms(r.longest_after_loss).replace(' ', ""))
        },
        r.weak_total().to_string(),
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
    let t = f.total();
    let weak = |g: &str| f.weaknesses.iter().filter(|v| v.guarantee == g).count();
    let _ = writeln!(s, "store              {store}");
    let _ = writeln!(s, "primitive          {}", f.primitive_name());
    let _ = writeln!(s, "property           {}", f.property().exclusion());
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
    // The rows count only what was unexpected; documented weaknesses apart.
    let _ = writeln!(
        s,
        "double grants      {} unexpected; {} within documented weaknesses",
        t.double_grants,
        weak("exclusion")
    );
    let _ = writeln!(
        s,
        "fence faults       {} unexpected; {} within documented weaknesses",
        t.fence_faults,
        weak("fencing")
    );
    let _ = writeln!(s, "stale accepted     {}", t.stale_accepted);
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
        if let Some(note) = weakness_note(&row) {
            let _ = writeln!(s, "          {name}: {note}");
        }
    }
    let _ = writeln!(s, "\ncolumns:");
    for (column, what) in COLUMN_LEGEND {
        let _ = writeln!(s, "  {column:<15} {what}");
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
        let _ =
            writeln!(s, "\nWEAKNESS {} at {} (documented: {}): {}", v.guarantee, ms(v.at), RESTART_WEAKNESS, v.what);
    }
    let verdict = if f.ok() {
        match f.weaknesses.len() {
            0 => "ok: every guarantee held".to_owned(),
            n => format!("ok: every guarantee held, but for {n} findings within documented weaknesses"),
        }
    } else {
        let broken: Vec<_> = guarantees(f).into_iter().filter(|g| !g.1).map(|g| g.0).collect();
        format!("BROKEN: {}", broken.join("; "))
    };
    let _ = writeln!(
        s,
        "\nmarks: ok = held; BROKEN = an unexpected violation (exit 1); WEAKNESS = a finding within a documented weakness of the store (exit 0)"
    );
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
