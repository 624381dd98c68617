//! `holdfast verify`: checks a store's guarantees under faults.
//!
//! W worker processes (this binary, re-run as `holdfast __verify-worker`)
//! loop acquire, critical section, release on one key through the library,
//! on the primitive `--primitive` names (the `held` module hides which).
//! In the critical section exclusive holders write to a fenced register
//! that this process serves on loopback ([`register`]). Meanwhile the
//! `faults` module kills and pauses holders. Every grant, write, `lost()`,
//! release, error and fault goes into one history on one clock ([`clock`],
//! [`record`]), appended to `history.jsonl`; [`check`] reads it back (the
//! primitive's property by `holdfast_verify::properties`) and [`report`]
//! and [`html`] show what it found; [`progress`] shows the run on a terminal.

pub mod check;
pub mod clock;
pub mod crosscheck;
mod faults;
pub mod findings;
mod held;
pub mod html;
mod lanes;
pub mod progress;
pub mod record;
pub mod register;
pub mod report;
mod rules;
pub mod sink;
pub mod spawn;
mod worker;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use worker::worker;

use holdfast_verify::proxy::FaultProxy;

use self::clock::RunClock;
use self::record::{Micros, Record};
use self::register::Register;
use self::sink::Sink;
use crate::cli::{Primitive, VerifyArgs};
use crate::exit::{Failure, INTERNAL, INVARIANT_BROKEN, OK};

/// The parent: starts the register and the workers, injects the faults,
/// checks the history, writes the reports.
pub async fn verify(args: VerifyArgs) -> Result<u8, Failure> {
    let ttl = holdfast::LockOptions::check_ttl(args.ttl).map_err(Failure::from)?;
    if args.duration < Duration::from_millis(100) {
        return Err(Failure::usage("--duration must be at least 100ms"));
    }
    if args.permits.is_some() && args.primitive != Primitive::Semaphore {
        return Err(Failure::usage("--permits goes with --primitive semaphore"));
    }
    let permits = if args.primitive == Primitive::Semaphore { args.permits.unwrap_or(2) } else { 0 };
    let server = match &args.spawn {
        Some(name) => {
            let name = name.clone();
            let started = tokio::task::spawn_blocking(move || spawn::Spawned::start(&name))
                .await
                .map_err(|e| Failure::new(INTERNAL, format!("starting the server: {e}")))??;
            Some(std::sync::Arc::new(std::sync::Mutex::new(started)))
        }
        None => None,
    };
    let (url, keeps_state) = match &server {
        Some(s) => {
            let s = s.lock().unwrap_or_else(|p| p.into_inner());
            (s.url(), s.restart_keeps_state())
        }
        None => (args.backend.url()?, None),
    };
    let partitionable = server.is_some() && spawn::upstream_of(&url).is_some();
    if args.faults.contains(&crate::cli::FaultKind::Partition) && !partitionable {
        return Err(Failure::usage(
            "--faults partition needs --spawn with a one-server store (redis, redis-durable, postgres, mysql, etcd, zookeeper)",
        ));
    }
    for kind in args.faults.iter().filter(|k| k.is_server()) {
        let spawned = server.as_ref().map(|s| s.lock().unwrap_or_else(|p| p.into_inner()));
        let possible = match (kind, &spawned) {
            (crate::cli::FaultKind::Restart, Some(s)) => s.restart_keeps_state().is_some(),
            (_, Some(s)) => s.has_leader(),
            (_, None) => false,
        };
        if !possible {
            let name = check::kind_name(*kind);
            return Err(Failure::usage(format!(
                "--faults {name} needs --spawn with a store that allows it (restart: redis, redis-durable, postgres, mysql, etcd, etcd3; leader: etcd3, zookeeper3)"
            )));
        }
    }
    // Fail fast, once, on a bad URL or a store that is down.
    let client = super::connect(&url, None).await?;
    let store = client.store_name().to_owned();
    drop(client);
    let out = out_dir(args.out.as_ref())?;
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let key = args.key.clone().unwrap_or_else(|| format!("holdfast-verify/{}-{nanos}", std::process::id()));

    let file = std::fs::File::create(out.join("history.jsonl")).map_err(|e| io(&out, e))?;
    let sink = Sink::new(file);
    let clock = RunClock { epoch: clock::now_us() };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| io(&out, e))?;
    let addr = listener.local_addr().map_err(|e| io(&out, e))?;
    let register = Register::new(clock, sink.clone());
    let serving = tokio::spawn(register.clone().serve(listener));
    let ttl_us = ttl.as_micros() as Micros;
    sink.push(Record::Start {
        t: clock.now(),
        store: store.clone(),
        ttl: ttl_us,
        expiry: store_lease(&url, ttl).as_micros() as Micros,
        workers: args.workers,
        faults: args.faults.clone(),
        restart_keeps_state: keeps_state,
        primitive: args.primitive,
        permits,
    });
    crate::say!(
        "holdfast verify: {} workers, {}{}, on {store} ({}), ttl {}, {} of faults: {}",
        args.workers,
        args.primitive.name(),
        if permits > 0 { format!(" of {permits} permits") } else { String::new() },
        holdfast::stores::redact_url(&url),
        crate::duration::show(ttl),
        crate::duration::show(args.duration),
        if args.faults.is_empty() {
            "none".to_owned()
        } else {
            args.faults.iter().map(|k| check::kind_name(*k)).collect::<Vec<_>>().join(",")
        }
    );
    let until = clock.now() + args.duration.as_micros() as Micros;
    // With a partition fault, each lane reaches the store through a proxy of its own.
    let proxies: Vec<std::sync::Arc<FaultProxy>> = match spawn::upstream_of(&url) {
        Some(upstream) if args.faults.contains(&crate::cli::FaultKind::Partition) => {
            (0..args.workers).map(|_| std::sync::Arc::new(FaultProxy::start(upstream))).collect()
        }
        _ => Vec::new(),
    };
    let urls = if proxies.is_empty() {
        vec![url.clone()]
    } else {
        proxies.iter().map(|p| spawn::through_proxy(&url, p.addr()).unwrap_or_else(|| url.clone())).collect()
    };
    let (primitive, register_addr) = (args.primitive, addr.to_string());
    let plan = lanes::Plan { urls, key, register: register_addr, ttl, clock, until, primitive, permits };
    let lanes = lanes::start(plan, args.workers, sink.clone())?;
    let lease = store_lease(&url, ttl);
    let target = faults::Target { sink: sink.clone(), register, server: server.clone(), store_lease: lease, proxies };
    let injector = tokio::spawn(faults::inject(args.faults.clone(), ttl, clock, until, target));
    // Workers stop at `until`, after their release; a wait for the lock may
    // last one TTL more, a pause in flight longer.
    let grace = faults::pause_length(lease) + ttl * 3 + Duration::from_secs(10);
    // Records come late by at most a pause (a stopped worker's), so the
    // line's violations judge the history up to a pause and a TTL ago.
    let settle = (faults::pause_length(lease) + ttl).as_micros() as Micros;
    let progress = progress::Progress::start(sink.clone(), clock, args.duration.as_micros() as Micros, settle);
    let ended = lanes::finish(lanes, args.duration + grace).await;
    if let Some(p) = progress {
        p.finish();
    }
    injector.abort();
    serving.abort();
    sink.push(Record::End { t: clock.now() });
    let records = sink.finish().map_err(|e| io(&out, e))?;
    if !ended {
        return Err(Failure::new(INTERNAL, "verify: workers did not stop in time; they were killed"));
    }
    let mut findings = check::check(&records);
    crosscheck::second_opinion(&mut findings, &records);
    let text = report::text(&findings, &records, &store);
    std::fs::write(out.join("report.txt"), &text).map_err(|e| io(&out, e))?;
    std::fs::write(out.join("report.html"), html::render(&findings, &records, &store)).map_err(|e| io(&out, e))?;
    crate::say!("{text}");
    crate::say!("history, report.txt, report.html: {}", out.display());
    if let Some(server) = server {
        // Stopping a server blocks; not on the runtime's threads.
        let _ = tokio::task::spawn_blocking(move || drop(server)).await;
    }
    Ok(if findings.ok() { OK } else { INVARIANT_BROKEN })
}

/// How long the store keeps a dead holder's lease for a lock of `ttl`,
/// where that is longer than `ttl`: etcd grants leases in whole seconds and
/// at least its minimum, 1.5 x the election timeout rounded up (2 s with
/// etcd's default 1 s election timeout, which this assumes). Others: `ttl`.
/// (ZooKeeper's session timeout is `ttl` clamped to [2, 20] x the server's
/// tickTime; `verify` asks for `ttl` and assumes the server grants it.)
pub fn store_lease(url: &str, ttl: Duration) -> Duration {
    let scheme = url.split_once("://").map_or("", |(s, _)| s).to_ascii_lowercase();
    if scheme == "etcd" || scheme == "etcds" {
        Duration::from_secs(ttl.as_millis().div_ceil(1000).max(2) as u64)
    } else {
        ttl
    }
}

/// `--out`, created if missing; else a new temp dir that is kept.
fn out_dir(out: Option<&PathBuf>) -> Result<PathBuf, Failure> {
    match out {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| Failure::usage(format!("--out {}: {e}", dir.display())))?;
            Ok(dir.clone())
        }
        None => tempfile::Builder::new()
            .prefix("holdfast-verify-")
            .tempdir()
            .map(tempfile::TempDir::keep)
            .map_err(|e| Failure::new(INTERNAL, format!("cannot create a temp dir: {e}"))),
    }
}

fn io(dir: &std::path::Path, e: std::io::Error) -> Failure {
    Failure::new(INTERNAL, format!("verify output in {}: {e}", dir.display()))
}
