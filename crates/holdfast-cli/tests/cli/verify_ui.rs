//! `holdfast verify` as a person reads it: each `--primitive` checked with
//! its own property and named in the report, the progress line (on a
//! terminal only), and the HTML report's legend, time axis, short fences and
//! weakness marks, in headless Chromium.

use std::path::Path;
use std::time::Duration;

use holdfast_cli::cli::FaultKind;
use holdfast_cli::commands::verify::record::{GrantHold, Phase, Record};
use holdfast_cli::commands::verify::{check, html, report};

use crate::Env;
use crate::verify::{chromium, field};

fn number(stdout: &str, name: &str) -> u64 {
    field(stdout, name).parse().unwrap_or_else(|e| panic!("{name}: {e}\n{stdout}"))
}

/// Runs `verify --primitive PRIMITIVE` on `target` for 8 s with a pause and a
/// kill, 3 workers, TTL 1 s; asserts exit 0, no unexpected violation, a
/// report naming the primitive and its property, and a run that was not
/// vacuous. Returns stdout.
fn primitive_ok(env: &Env, target: &[&str], primitive: &str, property: &str, out: &Path) -> String {
    let output = env
        .cmd()
        .arg("verify")
        .args(target)
        .args(["--primitive", primitive, "--workers", "3", "--duration", "8s", "--ttl", "1s", "--faults", "pause,kill"])
        .arg("--out")
        .arg(out)
        .timeout(Duration::from_secs(90))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{primitive}: {stdout}\n{stderr}");
    // Not a terminal: no progress line on stderr.
    assert!(!stderr.contains("violations so far"), "{stderr}");
    assert!(stdout.contains(&format!("primitive          {primitive}")), "{stdout}");
    assert!(stdout.contains(&format!("property           {property}")), "{stdout}");
    assert!(stdout.contains(&format!("ok     {property}: 0 double grants unexpected")), "{stdout}");
    assert_eq!(number(&stdout, "double grants"), 0, "{stdout}");
    assert_eq!(number(&stdout, "fence faults"), 0, "{stdout}");
    assert_eq!(number(&stdout, "stale accepted"), 0, "{stdout}");
    assert!(number(&stdout, "grants") >= 4, "{stdout}");
    assert!(number(&stdout, "faults injected") >= 2, "{stdout}");
    assert!(number(&stdout, "pauses past ttl") >= 1, "{stdout}");
    assert!(number(&stdout, "lost seen") + number(&stdout, "stale refused") >= 1, "{stdout}");
    assert!(stdout.contains("result             ok"), "{stdout}");
    println!("{primitive}:\n{stdout}");
    stdout
}

#[test]
fn verify_sqlite_semaphore_keeps_its_permit_bound() {
    let env = Env::new();
    let property = "permit bound: never more than 2 permits' weight held at once";
    let stdout = primitive_ok(&env, &["--backend", &env.url], "semaphore", property, &env.path("out"));
    assert!(stdout.contains("primitive          semaphore (2 permits)"), "{stdout}");
    // Shared holders write nothing: the register saw no write.
    assert_eq!(number(&stdout, "writes accepted"), 0, "{stdout}");
    let history = std::fs::read_to_string(env.path("out").join("history.jsonl")).unwrap();
    assert!(history.contains("\"hold\":{\"permits\":2}"), "some grants take 2 permits");
}

#[test]
fn verify_sqlite_rwlock_keeps_writers_alone() {
    let env = Env::new();
    let property = "read-write exclusion: a writer holds alone; readers share";
    let stdout = primitive_ok(&env, &["--backend", &env.url], "rwlock", property, &env.path("out"));
    // Writers write to the fenced register; readers do not.
    assert!(number(&stdout, "writes accepted") >= 1, "{stdout}");
    let history = std::fs::read_to_string(env.path("out").join("history.jsonl")).unwrap();
    assert!(history.contains("\"hold\":\"read\""), "readers took part");
}

#[test]
fn verify_sqlite_election_has_one_leader_at_a_time() {
    let env = Env::new();
    let property = "election safety: at most one leader at a time";
    let stdout = primitive_ok(&env, &["--backend", &env.url], "election", property, &env.path("out"));
    assert!(stdout.contains("ok     terms increase"), "{stdout}");
}

/// A server store, each new primitive at once (three runs side by side on
/// one Redis, each on its own key).
#[test]
fn verify_redis_semaphore_rwlock_and_election() {
    let server = holdfast_verify::servers::redis::RedisServer::start();
    let url = server.url();
    let runs = [
        ("semaphore", "permit bound: never more than 2 permits' weight held at once"),
        ("rwlock", "read-write exclusion: a writer holds alone; readers share"),
        ("election", "election safety: at most one leader at a time"),
    ];
    std::thread::scope(|s| {
        for (primitive, property) in runs {
            let url = url.clone();
            s.spawn(move || {
                let env = Env::new();
                primitive_ok(&env, &["--backend", &url], primitive, property, &env.path("out"));
            });
        }
    });
}

#[test]
fn verify_primitive_usage_errors_and_no_test_kit_in_help() {
    let env = Env::new();
    let out = env.cmd().args(["verify", "--backend", &env.url, "--primitive", "barrier"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let out = env.cmd().args(["verify", "--backend", &env.url, "--permits", "3"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "--permits without the semaphore: {out:?}");
    let help = env.cmd().args(["verify", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).to_lowercase();
    assert!(help.contains("--primitive") && help.contains("semaphore"), "{help}");
    assert!(!help.contains("testkit") && !help.contains("test kit"), "users never see the test kit: {help}");
}

/// On a terminal, one line on stderr rewritten in place: time, fault,
/// operations, violations so far.
#[test]
fn verify_shows_a_progress_line_on_a_terminal() {
    let env = Env::new();
    let args =
        format!("verify --backend {} --duration 2s --ttl 1s --faults --out {}", env.url, env.path("out").display());
    let out = crate::terminal::on_a_terminal(&env, &args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("/ 2 s | no fault yet |") && text.contains(" grants, "), "no progress line: {text:?}");
    assert!(text.contains("\r"), "the line is rewritten in place: {text:?}");
    assert!(text.contains("result             ok"), "{text}");
}

const TTL: i64 = 1_000_000;
/// A fence of 16 digits, as some stores hand out.
const BIG: u64 = 1_732_000_000_004_821;

fn grant(t: i64, lane: u32, fence: u64) -> Record {
    Record::Grant { t, lane, pid: 100 + lane, fence, deadline: t + TTL - 10_000, hold: GrantHold::Exclusive }
}

fn release(t: i64, lane: u32, fence: u64) -> Record {
    Record::Release { t, lane, pid: 100 + lane, fence, deadline: t + TTL }
}

/// A run on a store without persistence: a double grant right after a
/// restart (its documented weakness), and one long after it (unexpected).
fn weak_history() -> Vec<Record> {
    let restart = |t, phase| Record::Fault { t, kind: FaultKind::Restart, lane: 0, pid: 0, phase, holder: false };
    vec![
        Record::Start {
            t: 0,
            store: "redis".into(),
            ttl: TTL,
            expiry: 0,
            workers: 2,
            faults: vec![FaultKind::Restart],
            restart_keeps_state: Some(false),
            primitive: Default::default(),
            permits: 0,
        },
        grant(100_000, 0, BIG),
        restart(200_000, Phase::Start),
        restart(300_000, Phase::End),
        grant(400_000, 1, BIG + 1),
        release(600_000, 0, BIG),
        release(700_000, 1, BIG + 1),
        // 9 s later, no fault near: two holders is unexpected.
        grant(9_000_000, 0, BIG + 2),
        grant(9_200_000, 1, BIG + 3),
        release(9_500_000, 0, BIG + 2),
        release(9_600_000, 1, BIG + 3),
        Record::End { t: 10_000_000 },
    ]
}

/// The text report's rows agree with its summary and name the weakness in words.
#[test]
fn verify_report_counts_weaknesses_apart_and_names_them_in_each_row() {
    let records = weak_history();
    let f = check::check(&records);
    let text = report::text(&f, &records, "redis");
    assert!(text.contains("double grants      1 unexpected; 1 within documented weaknesses"), "{text}");
    let restart = text.lines().find(|l| l.starts_with("restart ")).unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = restart.split_whitespace().collect();
    assert_eq!((cols[4], cols.last().copied()), ("0", Some("1")), "restart: 0 unexpected, 1 within: {text}");
    assert!(
        text.contains(
            "restart: 1 double grant, all within the documented weakness: a restart of a store without durable writes"
        ),
        "{text}"
    );
    assert!(text.contains("see docs/guarantees.md"), "{text}");
    let total = text.lines().find(|l| l.starts_with("total ")).unwrap();
    assert_eq!(total.split_whitespace().nth(4), Some("1"), "the total row says 1 unexpected, as the summary: {text}");
    assert!(text.contains("WEAKNESS exclusion at 400 ms"), "{text}");
    assert!(text.contains("\nBROKEN exclusion at 9.2 s"), "{text}");
}

/// The page of that history in Chromium: a dashed weakness mark apart from
/// the red violation mark, fences of 16 digits shortened in their bars with
/// the full value in the tooltip, the axis in s/ms, and a legend item for
/// every kind of thing drawn.
#[test]
fn verify_html_marks_weaknesses_and_shortens_fences_and_explains_everything() {
    let env = Env::new();
    let records = weak_history();
    let f = check::check(&records);
    let page = env.path("report.html");
    std::fs::write(&page, html::render(&f, &records, "redis")).unwrap();
    let dom = chromium(&["--window-size=1600,900", "--dump-dom", &format!("file://{}", page.display())]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert_eq!(dom.matches("class=\"weakness\"").count(), 1, "one weakness mark: {dom}");
    assert_eq!(dom.matches("class=\"violation\"").count(), 1, "one violation mark: {dom}");
    let fences: Vec<&str> = texts(&dom, "class=\"fence\"");
    assert!(!fences.is_empty(), "{dom}");
    for fence in &fences {
        assert!(fence.chars().count() <= 5 && fence.starts_with('\u{2026}'), "fence label {fence:?} not shortened");
    }
    assert!(dom.contains(&format!("fence {BIG} ")), "the full fence in a tooltip: {dom}");
    check_axis_and_legend(&dom);
    assert!(dom.contains("all within the documented weakness"), "the restart row's note: {dom}");
}

/// The texts of the elements whose start tag contains `marker`.
pub fn texts<'a>(dom: &'a str, marker: &str) -> Vec<&'a str> {
    dom.match_indices(marker)
        .filter_map(|(at, _)| {
            let rest = &dom[at..];
            let open = rest.find('>')? + 1;
            let close = rest[open..].find('<')?;
            Some(&rest[open..open + close])
        })
        .collect()
}

/// Axis labels in human units (`2 s`, `500 ms`, never `2000ms`), and a
/// legend item for every `data-kind` drawn.
pub fn check_axis_and_legend(dom: &str) {
    let ticks = texts(dom, "class=\"tick\"");
    assert!(ticks.len() >= 3, "{dom}");
    for tick in &ticks {
        let (n, unit) = tick.split_once(' ').unwrap_or_else(|| panic!("tick {tick:?} has no unit"));
        assert!(["s", "ms", "\u{b5}s"].contains(&unit) && n.parse::<f64>().is_ok(), "tick {tick:?}");
        assert!(!(unit == "ms" && n.parse::<f64>().unwrap() >= 1000.0), "tick {tick:?}: seconds, please");
    }
    assert!(dom.contains("<ul id=\"legend\">"), "no legend: {dom}");
    let mut drawn: Vec<&str> = dom
        .match_indices("data-kind=\"")
        .flat_map(|(at, m)| dom[at + m.len()..].split('"').next().unwrap_or("").split_whitespace())
        .collect();
    drawn.sort_unstable();
    drawn.dedup();
    assert!(drawn.len() >= 4, "{drawn:?}");
    for kind in drawn {
        assert!(dom.contains(&format!("<li data-for=\"{kind}\">")), "{kind} is drawn but not in the legend");
    }
}
