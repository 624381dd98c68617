//! The HTML report: one self-contained file (no network), a summary table
//! on top and a zoomable timeline with one lane per worker slot showing
//! grants (with their fences), writes (refused ones marked), `lost()`,
//! faults and violations. The table is plain HTML; the timeline is drawn
//! by the embedded script from the embedded JSON.

use std::fmt::Write as _;

use serde_json::json;

use super::check::Findings;
use super::record::{Phase, Record};
use super::report::{ROW_COLUMNS, counted, fault_rows, guarantees, ms, row_cells};

const SCRIPT: &str = include_str!("timeline.js");

/// Escapes text for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The page's data, as JSON the script reads.
fn data(f: &Findings, records: &[Record]) -> serde_json::Value {
    let lanes = records.iter().find_map(|r| match r {
        Record::Start { workers, .. } => Some(*workers),
        _ => None,
    });
    let grants: Vec<_> = f
        .beliefs
        .iter()
        .map(|b| json!({"lane": b.lane, "pid": b.pid, "fence": b.fence, "start": b.start, "end": b.end, "cause": format!("{:?}", b.cause)}))
        .collect();
    let mut writes = Vec::new();
    let mut marks = Vec::new();
    let mut faults: Vec<serde_json::Value> = Vec::new();
    for r in records {
        match r {
            Record::Write { t, lane, fence, accepted, highest, .. } => {
                writes.push(json!({"lane": lane, "t": t, "fence": fence, "accepted": accepted, "highest": highest}));
            }
            Record::Lost { t, lane, fence, .. } => {
                marks.push(json!({"lane": lane, "t": t, "what": format!("lost() fence {fence}")}))
            }
            Record::Error { t, lane, message, .. } => {
                marks.push(json!({"lane": lane, "t": t, "what": format!("error: {message}")}))
            }
            Record::Fault { t, kind, lane, pid, phase: Phase::Start, .. } => {
                faults.push(json!({"lane": lane, "pid": pid, "kind": kind, "start": t, "end": t}));
            }
            Record::Fault { t, lane, pid, phase: Phase::End, .. } => {
                if let Some(open) = faults.iter_mut().rev().find(|x| x["pid"] == *pid && x["lane"] == *lane) {
                    open["end"] = json!(t);
                }
            }
            _ => {}
        }
    }
    let violations: Vec<_> =
        f.violations.iter().map(|v| json!({"at": v.at, "guarantee": v.guarantee, "what": v.what})).collect();
    json!({"lanes": lanes.unwrap_or(1), "end": f.end, "ttl": f.ttl, "grants": grants, "writes": writes,
           "marks": marks, "faults": faults, "violations": violations})
}

/// The whole page.
pub fn render(f: &Findings, records: &[Record], store: &str) -> String {
    let t = f.total();
    let mut h = String::new();
    let verdict = if f.ok() { "ok: every guarantee held" } else { "BROKEN" };
    let _ = write!(
        h,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>holdfast verify: {store}</title><style>\
body{{font:14px sans-serif;margin:16px}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}\
th{{background:#eee}}.ok{{color:#060}}.broken{{color:#b00;font-weight:bold}}#timeline{{border:1px solid #999;overflow-x:auto;width:100%}}\
button{{margin-right:4px}}</style></head><body><h1>holdfast verify: {store}</h1>\
<p id=\"verdict\" class=\"{}\">{verdict}</p>",
        if f.ok() { "ok" } else { "broken" },
        store = esc(store)
    );
    let _ = write!(
        h,
        "<table id=\"summary\"><tr><th>ttl</th><th>run</th><th>grants</th><th>writes accepted</th><th>writes refused</th>\
<th>faults</th><th>double grants</th><th>stale accepted</th><th>stale refused</th><th>lost()</th><th>longest free</th>\
<th>documented weaknesses</th></tr>\
<tr><td>{}</td><td>{}</td><td class=\"grants\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"double-grants\">{}</td>\
<td class=\"stale-accepted\">{}</td><td class=\"stale-refused\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr></table>",
        ms(f.ttl),
        ms(f.end),
        f.beliefs.len(),
        f.writes.0,
        f.writes.1,
        t.injected,
        counted(f).double_grants,
        counted(f).stale_accepted,
        t.stale_refused,
        t.lost,
        t.longest_free.map_or("-".to_owned(), ms),
        f.weaknesses.len()
    );
    h.push_str("<h2>Per fault</h2><table id=\"faults\"><tr>");
    for column in ROW_COLUMNS {
        let _ = write!(h, "<th>{}</th>", esc(column));
    }
    h.push_str("</tr>");
    for (name, row) in fault_rows(f) {
        let _ = write!(h, "<tr><th>{name}</th>");
        for cell in row_cells(&row) {
            let _ = write!(h, "<td>{}</td>", esc(&cell));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table><h2>Guarantees</h2><ul id=\"guarantees\">");
    for (name, ok, detail) in guarantees(f) {
        let class = if ok { "ok" } else { "broken" };
        let _ = write!(
            h,
            "<li class=\"{class}\">{} {}: {}</li>",
            if ok { "ok" } else { "BROKEN" },
            esc(name),
            esc(&detail)
        );
    }
    h.push_str(
        "</ul><h2>Timeline</h2><p>Wheel or the buttons zoom, drag or scroll pans. Bars: grants (fence inside; \
green released, orange lost, grey ended by death); ticks: writes (blue accepted, red refused); \
red bands: pauses; purple bands across all lanes: server restarts and leader kills; black cross: kill; orange dot: lost(); purple: violation.</p>\
<div><button id=\"zin\">zoom in</button><button id=\"zout\">zoom out</button><button id=\"zfit\">fit</button>\
<span id=\"zoom\"></span></div><div id=\"timeline\"></div><h2>Violations</h2><ol id=\"violations\">",
    );
    if f.violations.is_empty() {
        h.push_str("<li>none</li>");
    }
    for v in &f.violations {
        let _ = write!(h, "<li>{} at {}: {}</li>", v.guarantee, ms(v.at), esc(&v.what));
    }
    h.push_str("</ol><h2>Documented weaknesses (a restart without persistence)</h2><ol id=\"weaknesses\">");
    if f.weaknesses.is_empty() {
        h.push_str("<li>none</li>");
    }
    for v in &f.weaknesses {
        let _ = write!(h, "<li>{} at {}: {}</li>", v.guarantee, ms(v.at), esc(&v.what));
    }
    // JSON in a script element: escape `<` so no `</script>` can end it.
    let json = data(f, records).to_string().replace('<', "\\u003c");
    let _ = write!(
        h,
        "</ol><script id=\"data\" type=\"application/json\">{json}</script><script>{SCRIPT}</script></body></html>"
    );
    h
}
