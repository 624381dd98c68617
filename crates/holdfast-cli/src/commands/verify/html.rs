//! The HTML report: one self-contained file (no network), a summary table
//! on top (naming the primitive and its property), the per-fault table with
//! a note on each row that has findings within a documented weakness, and a
//! zoomable timeline with one lane per worker slot showing grants (with
//! their fences), writes (refused ones marked), `lost()`, faults,
//! violations and weaknesses (marked apart), with a legend of all of it.
//! The tables and the legend are plain HTML; the timeline is drawn by the
//! embedded script from the embedded JSON.

use std::fmt::Write as _;

use serde_json::json;

use super::check::Findings;
use super::findings::{RESTART_WEAKNESS, weakness_note};
use super::record::{GrantHold, Phase, Record};
use super::report::{COLUMN_LEGEND, ROW_COLUMNS, fault_rows, guarantees, ms, row_cells};

const SCRIPT: &str = include_str!("timeline.js");

/// The timeline's legend: every colour, band, mark and lane it draws, each
/// item named by the `data-kind` the script gives what it draws (a test
/// checks that every kind drawn has its item). Swatch colours are the
/// script's.
const LEGEND: &[(&str, &str, &str)] = &[
    (
        "lane",
        "<svg width=\"28\" height=\"14\"><line x1=\"0\" x2=\"28\" y1=\"13\" y2=\"13\" stroke=\"#ddd\"/><text x=\"0\" y=\"10\" font-size=\"9\">w 0</text></svg>",
        "a lane: one worker slot (\"worker N\"); a worker killed by a fault is replaced by a new process in the same lane",
    ),
    (
        "axis",
        "<svg width=\"28\" height=\"14\"><text x=\"0\" y=\"11\" font-size=\"9\">1.5 s</text></svg>",
        "the axis: time since the run began, in s or ms; every time on the page is on one clock (CLOCK_MONOTONIC)",
    ),
    (
        "grant-released",
        "<svg width=\"28\" height=\"14\"><rect width=\"28\" height=\"14\" fill=\"#6c6\" stroke=\"#333\"/></svg>",
        "a grant, believed from its acquire's return until its holder began to release",
    ),
    (
        "grant-lost",
        "<svg width=\"28\" height=\"14\"><rect width=\"28\" height=\"14\" fill=\"#f93\" stroke=\"#333\"/></svg>",
        "a grant that ended when its holder saw lost() or failed its lease check",
    ),
    (
        "grant-deadline",
        "<svg width=\"28\" height=\"14\"><rect width=\"28\" height=\"14\" fill=\"#e55\" stroke=\"#333\"/></svg>",
        "a grant whose lease ran out locally before its holder noticed (a paused holder): its belief ends at the deadline",
    ),
    (
        "grant-died",
        "<svg width=\"28\" height=\"14\"><rect width=\"28\" height=\"14\" fill=\"#aaa\" stroke=\"#333\"/></svg>",
        "a grant whose holder died (killed)",
    ),
    (
        "grant-run-end",
        "<svg width=\"28\" height=\"14\"><rect width=\"28\" height=\"14\" fill=\"#9cf\" stroke=\"#333\"/></svg>",
        "a grant still held when the run ended",
    ),
    (
        "shared",
        "<svg width=\"28\" height=\"14\"><rect width=\"28\" height=\"14\" fill=\"#6c6\" fill-opacity=\"0.55\" stroke=\"#333\" stroke-dasharray=\"3,2\"/><text x=\"2\" y=\"11\" font-size=\"9\">R</text></svg>",
        "a dashed, paler bar: a shared grant, a reader (R) or a semaphore's permits (\u{d7}N: N permits); shared grants may overlap up to the primitive's bound",
    ),
    (
        "fence-label",
        "<svg width=\"28\" height=\"14\"><text x=\"0\" y=\"11\" font-size=\"9\">\u{2026}4821</text></svg>",
        "the number in a bar: the grant's fence (an election's term); a fence of more than 5 digits shows its last 4 after \u{2026}, the full value is in the bar's tooltip (hover)",
    ),
    (
        "write-accepted",
        "<svg width=\"28\" height=\"14\"><line x1=\"14\" x2=\"14\" y1=\"1\" y2=\"13\" stroke=\"#36c\"/></svg>",
        "a thin blue tick: a write the fenced register accepted",
    ),
    (
        "write-refused",
        "<svg width=\"28\" height=\"14\"><line x1=\"14\" x2=\"14\" y1=\"1\" y2=\"13\" stroke=\"#d00\" stroke-width=\"3\"/></svg>",
        "a thick red tick: a stale write the register refused (the fence at work)",
    ),
    (
        "holding",
        "<svg width=\"28\" height=\"14\"><line x1=\"14\" x2=\"14\" y1=\"4\" y2=\"13\" stroke=\"#777\"/></svg>",
        "a short grey tick: a shared holder checked its lease still held (readers and permits write nothing)",
    ),
    (
        "pause",
        "<svg width=\"28\" height=\"14\"><rect width=\"28\" height=\"14\" fill=\"#f88\" fill-opacity=\"0.35\"/></svg>",
        "a shaded red band in a lane: the worker was paused (SIGSTOP past its lease, then SIGCONT)",
    ),
    (
        "slow",
        "<svg width=\"28\" height=\"14\"><rect width=\"28\" height=\"14\" fill=\"#fc8\" fill-opacity=\"0.35\"/></svg>",
        "a shaded amber band in a lane: the worker was stalled for part of its TTL (slow)",
    ),
    (
        "partition",
        "<svg width=\"28\" height=\"14\"><rect width=\"28\" height=\"14\" fill=\"#8cf\" fill-opacity=\"0.35\"/></svg>",
        "a shaded blue band in a lane: the worker ran on, cut off from the store (partition)",
    ),
    (
        "server",
        "<svg width=\"28\" height=\"14\"><rect width=\"28\" height=\"14\" fill=\"#96f\" fill-opacity=\"0.25\"/></svg>",
        "a shaded purple band across every lane: a server fault, a restart or a leader kill (labelled)",
    ),
    (
        "kill",
        "<svg width=\"28\" height=\"14\"><text x=\"8\" y=\"12\" font-size=\"13\">\u{2715}</text></svg>",
        "a cross: the worker was killed (SIGKILL)",
    ),
    (
        "mark-lost",
        "<svg width=\"28\" height=\"14\"><circle cx=\"14\" cy=\"7\" r=\"4\" fill=\"#f60\"/></svg>",
        "an orange dot: the holder saw lost()",
    ),
    (
        "mark-error",
        "<svg width=\"28\" height=\"14\"><circle cx=\"14\" cy=\"7\" r=\"4\" fill=\"#900\"/></svg>",
        "a dark red dot: a store call failed (the message is in its tooltip)",
    ),
    (
        "violation",
        "<svg width=\"28\" height=\"14\"><line x1=\"14\" x2=\"14\" y1=\"0\" y2=\"14\" stroke=\"#d00\" stroke-width=\"3\"/></svg>",
        "a solid red line across every lane: an unexpected violation (the run fails)",
    ),
    (
        "weakness",
        "<svg width=\"28\" height=\"14\"><line x1=\"14\" x2=\"14\" y1=\"0\" y2=\"14\" stroke=\"#e90\" stroke-width=\"3\" stroke-dasharray=\"3,2\"/></svg>",
        "a dashed amber line across every lane: a finding within a documented weakness of the store (the run does not fail; see the list below)",
    ),
];

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
        .map(|b| {
            let hold = match b.hold {
                GrantHold::Exclusive => json!("exclusive"),
                GrantHold::Read => json!("read"),
                GrantHold::Permits(n) => json!(n),
            };
            // Fences as strings: a 16-digit one is past what a JS number holds exactly.
            json!({"lane": b.lane, "pid": b.pid, "fence": b.fence.to_string(), "start": b.start, "end": b.end,
                   "cause": format!("{:?}", b.cause), "hold": hold})
        })
        .collect();
    let mut writes = Vec::new();
    let mut marks = Vec::new();
    let mut holdings = Vec::new();
    let mut faults: Vec<serde_json::Value> = Vec::new();
    for r in records {
        match r {
            Record::Write { t, lane, fence, accepted, highest, .. } => {
                writes.push(json!({"lane": lane, "t": t, "fence": fence.to_string(), "accepted": accepted,
                                   "highest": highest.to_string()}));
            }
            Record::Holding { t, lane, fence, .. } => {
                holdings.push(json!({"lane": lane, "t": t, "fence": fence.to_string()}));
            }
            Record::Lost { t, lane, fence, .. } => {
                marks.push(json!({"lane": lane, "t": t, "kind": "lost", "what": format!("lost() fence {fence}")}))
            }
            Record::Error { t, lane, message, .. } => {
                marks.push(json!({"lane": lane, "t": t, "kind": "error", "what": format!("error: {message}")}))
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
    let line = |v: &super::check::Violation| json!({"at": v.at, "guarantee": v.guarantee, "what": v.what});
    let violations: Vec<_> = f.violations.iter().map(line).collect();
    let weaknesses: Vec<_> = f.weaknesses.iter().map(line).collect();
    json!({"lanes": lanes.unwrap_or(1), "end": f.end, "ttl": f.ttl, "grants": grants, "writes": writes,
           "holdings": holdings, "marks": marks, "faults": faults, "violations": violations,
           "weaknesses": weaknesses, "weakness": RESTART_WEAKNESS})
}

/// The whole page.
pub fn render(f: &Findings, records: &[Record], store: &str) -> String {
    let t = f.total();
    let mut h = String::new();
    let verdict = if f.ok() { "ok: every guarantee held" } else { "BROKEN" };
    let _ = write!(
        h,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>holdfast verify: {store}</title><style>\
body{{font:14px sans-serif;margin:16px}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right;white-space:nowrap}}\
th{{background:#eee}}td.note{{text-align:left;color:#850;white-space:normal}}.ok{{color:#060}}.broken{{color:#b00;font-weight:bold}}.weak{{color:#850}}\
#timeline{{border:1px solid #999;overflow-x:auto;width:100%}}#legend{{columns:2;font-size:12px}}#legend li{{list-style:none;break-inside:avoid;margin:2px 0}}\
#legend svg{{vertical-align:middle;margin-right:6px}}dl{{font-size:12px}}dt{{font-weight:bold;float:left;width:120px}}dd{{margin-left:130px}}\
button{{margin-right:4px}}</style></head><body><h1>holdfast verify: {store}</h1>\
<p id=\"primitive\">{primitive}: {property}</p><p id=\"verdict\" class=\"{}\">{verdict}</p>",
        if f.ok() { "ok" } else { "broken" },
        store = esc(store),
        primitive = esc(&f.primitive_name()),
        property = esc(&f.property().exclusion()),
    );
    let weak = |g: &str| f.weaknesses.iter().filter(|v| v.guarantee == g).count();
    let _ = write!(
        h,
        "<table id=\"summary\"><tr><th>ttl</th><th>run</th><th>grants</th><th>writes accepted</th><th>writes refused</th>\
<th>faults</th><th>double grants (unexpected)</th><th>double grants within documented weaknesses</th><th>stale accepted</th>\
<th>stale refused</th><th>lost()</th><th>longest free</th><th>findings within documented weaknesses</th></tr>\
<tr><td>{}</td><td>{}</td><td class=\"grants\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"double-grants\">{}</td>\
<td class=\"weak-double-grants\">{}</td><td class=\"stale-accepted\">{}</td><td class=\"stale-refused\">{}</td><td>{}</td>\
<td>{}</td><td class=\"weaknesses\">{}</td></tr></table>",
        ms(f.ttl),
        ms(f.end),
        f.beliefs.len(),
        f.writes.0,
        f.writes.1,
        t.injected,
        t.double_grants,
        weak("exclusion"),
        t.stale_accepted,
        t.stale_refused,
        t.lost,
        t.longest_free.map_or("-".to_owned(), ms),
        f.weaknesses.len()
    );
    h.push_str("<h2>Per fault</h2><table id=\"faults\"><tr>");
    for column in ROW_COLUMNS {
        let _ = write!(h, "<th>{}</th>", esc(column));
    }
    h.push_str("<th>note</th></tr>");
    for (name, row) in fault_rows(f) {
        let _ = write!(h, "<tr data-fault=\"{name}\"><th>{name}</th>");
        for cell in row_cells(&row) {
            let _ = write!(h, "<td>{}</td>", esc(&cell));
        }
        let note = weakness_note(&row).unwrap_or_default();
        let _ = write!(h, "<td class=\"note\">{}</td></tr>", esc(&note));
    }
    h.push_str("</table><dl id=\"columns\">");
    for (column, what) in COLUMN_LEGEND {
        let _ = write!(h, "<dt>{}</dt><dd>{}</dd>", esc(column), esc(what));
    }
    h.push_str("</dl><h2>Guarantees</h2><ul id=\"guarantees\">");
    for (name, ok, detail) in guarantees(f) {
        let class = if ok { "ok" } else { "broken" };
        let _ = write!(
            h,
            "<li class=\"{class}\">{} {}: {}</li>",
            if ok { "ok" } else { "BROKEN" },
            esc(&name),
            esc(&detail)
        );
    }
    h.push_str(
        "</ul><h2>Timeline</h2><p>Wheel or the buttons zoom, drag or scroll pans; hover anything for its details.</p>\
<div><button id=\"zin\">zoom in</button><button id=\"zout\">zoom out</button><button id=\"zfit\">fit</button>\
<span id=\"zoom\"></span></div><div id=\"timeline\"></div><h3>Legend</h3><ul id=\"legend\">",
    );
    for (kind, swatch, what) in LEGEND {
        let _ = write!(h, "<li data-for=\"{kind}\">{swatch}{}</li>", esc(what));
    }
    h.push_str("</ul><h2>Violations</h2><ol id=\"violations\">");
    if f.violations.is_empty() {
        h.push_str("<li>none</li>");
    }
    for v in &f.violations {
        let _ = write!(h, "<li class=\"broken\">{} at {}: {}</li>", v.guarantee, ms(v.at), esc(&v.what));
    }
    let _ = write!(
        h,
        "</ol><h2>Within documented weaknesses</h2><p class=\"weak\">The one verify knows: {}</p><ol id=\"weaknesses\">",
        esc(RESTART_WEAKNESS)
    );
    if f.weaknesses.is_empty() {
        h.push_str("<li>none</li>");
    }
    for v in &f.weaknesses {
        let _ = write!(h, "<li class=\"weak\">{} at {}: {}</li>", v.guarantee, ms(v.at), esc(&v.what));
    }
    // JSON in a script element: escape `<` so no `</script>` can end it.
    let json = data(f, records).to_string().replace('<', "\\u003c");
    let _ = write!(
        h,
        "</ol><script id=\"data\" type=\"application/json\">{json}</script><script>{SCRIPT}</script></body></html>"
    );
    h
}
