//! The checker on hand-made histories: each broken guarantee is reported,
//! and a clean history with faults is not.

use super::*;
use crate::cli::FaultKind;
use crate::commands::verify::record::{self, Phase};

const TTL: Micros = 1_000_000;

fn start() -> Record {
    Record::Start {
        t: 0,
        store: "test".into(),
        ttl: TTL,
        expiry: 0,
        workers: 2,
        faults: vec![FaultKind::Kill, FaultKind::Pause],
        restart_keeps_state: None,
        primitive: Default::default(),
        permits: 0,
    }
}
fn grant(t: Micros, lane: u32, fence: u64) -> Record {
    Record::Grant { t, lane, pid: 100 + lane, fence, deadline: t + TTL - 10_000, hold: Default::default() }
}
fn release(t: Micros, lane: u32, fence: u64) -> Record {
    Record::Release { t, lane, pid: 100 + lane, fence, deadline: t + TTL }
}
fn write(t: Micros, lane: u32, fence: u64, accepted: bool, highest: u64) -> Record {
    Record::Write { t, issued: t - 100, lane, pid: 100 + lane, fence, deadline: t + TTL, accepted, highest }
}
fn fault(t: Micros, kind: FaultKind, lane: u32, phase: Phase) -> Record {
    Record::Fault { t, kind, lane, pid: 100 + lane, phase, holder: true }
}

fn guarantees_broken(f: &Findings) -> Vec<&'static str> {
    f.violations.iter().map(|v| v.guarantee).collect()
}

#[test]
fn a_clean_history_holds() {
    let h = vec![
        start(),
        grant(10, 0, 1),
        write(20_000, 0, 1, true, 0),
        release(300_000, 0, 1),
        grant(300_500, 1, 2),
        write(301_000, 1, 2, true, 1),
        release(500_000, 1, 2),
        Record::End { t: 600_000 },
    ];
    let f = check(&h);
    assert!(f.ok(), "{:?}", f.violations);
    assert_eq!(f.beliefs.len(), 2);
    assert_eq!(f.writes, (2, 0));
}

#[test]
fn a_double_grant_is_reported() {
    // Lane 0 still believes (no release, deadline ahead) when lane 1 is granted.
    let h = vec![start(), grant(10, 0, 1), grant(200_000, 1, 2), release(400_000, 0, 1), release(500_000, 1, 2)];
    let f = check(&h);
    assert_eq!(guarantees_broken(&f), vec!["exclusion"]);
    assert_eq!(f.total().double_grants, 1);
    assert!(f.violations[0].what.contains("overlap 200 ms"), "{}", f.violations[0].what);
}

#[test]
fn a_paused_holder_past_its_deadline_is_no_double_grant() {
    // Lane 0's belief ends at its deadline (~1 s) though it only saw lost() at 2 s.
    let h = vec![
        start(),
        grant(0, 0, 1),
        fault(100_000, FaultKind::Pause, 0, Phase::Start),
        grant(1_050_000, 1, 2),
        write(1_060_000, 1, 2, true, 0),
        fault(2_000_000, FaultKind::Pause, 0, Phase::End),
        // Sent at 99 ms (checked, believed), stopped before it reached the register.
        Record::Write {
            t: 2_000_100,
            issued: 99_000,
            lane: 0,
            pid: 100,
            fence: 1,
            deadline: 990_000,
            accepted: false,
            highest: 2,
        },
        Record::Lost { t: 2_000_200, lane: 0, pid: 100, fence: 1, deadline: 990_000 },
        release(2_100_000, 1, 2),
    ];
    let f = check(&h);
    assert!(f.ok(), "{:?}", f.violations);
    let pause = &f.rows["pause"];
    assert_eq!((pause.injected, pause.past_ttl, pause.stale_refused, pause.late_writes, pause.lost), (1, 1, 1, 1, 1));
    assert_eq!(pause.ran_after_loss, 1);
    assert_eq!(pause.longest_after_loss, 2_000_200 - 990_000);
}

#[test]
fn a_backwards_or_repeated_fence_is_reported() {
    let h = vec![
        start(),
        grant(10, 0, 5),
        release(100_000, 0, 5),
        grant(200_000, 1, 4),
        release(300_000, 1, 4),
        grant(400_000, 0, 4),
        release(500_000, 0, 4),
    ];
    let f = check(&h);
    assert_eq!(guarantees_broken(&f), vec!["fencing", "fencing"]);
    assert!(f.violations[0].what.contains("goes backwards"), "{}", f.violations[0].what);
    assert!(f.violations[1].what.contains("goes backwards from fence 5"), "{}", f.violations[1].what);
}

#[test]
fn an_accepted_stale_write_is_reported() {
    let h = vec![
        start(),
        grant(10, 0, 1),
        release(100_000, 0, 1),
        grant(100_100, 1, 2),
        write(100_200, 1, 2, true, 0),
        // A register that took the old fence after the newer one.
        Record::Write {
            t: 100_300,
            issued: 50_000,
            lane: 0,
            pid: 100,
            fence: 1,
            deadline: 900_000,
            accepted: true,
            highest: 2,
        },
        release(200_000, 1, 2),
    ];
    let f = check(&h);
    assert_eq!(guarantees_broken(&f), vec!["stale write"]);
    assert_eq!(f.total().stale_accepted, 1);
    assert_eq!(f.total().late_writes, 1);
}

#[test]
fn a_holder_killed_while_its_release_is_in_flight_let_go_when_it_began() {
    // The store freed the key (lane 1 granted at 433 ms) before the release
    // returned; the kill at 508 ms came before the outcome was sent.
    let h = vec![
        start(),
        grant(25_000, 0, 1),
        write(430_000, 0, 1, true, 0),
        Record::Release { t: 430_200, lane: 0, pid: 100, fence: 1, deadline: 1_349_000 },
        grant(433_000, 1, 2),
        fault(508_000, FaultKind::Kill, 0, Phase::Start),
        release(841_000, 1, 2),
    ];
    let f = check(&h);
    assert!(f.ok(), "{:?}", f.violations);
    assert_eq!(f.beliefs[0].cause, EndCause::Released);
}

#[test]
fn a_write_sent_without_belief_is_reported() {
    let h = vec![start(), grant(10, 0, 1), release(100_000, 0, 1), write(200_000, 0, 1, true, 0)];
    let f = check(&h);
    assert_eq!(guarantees_broken(&f), vec!["belief"]);
}

#[test]
fn a_slow_regrant_after_a_kill_is_reported() {
    let h = vec![
        start(),
        grant(10, 0, 1),
        fault(100_000, FaultKind::Kill, 0, Phase::Start),
        Record::Exit { t: 110_000, lane: 0, pid: 100, status: "signal 9".into() },
        // TTL 1 s + 1 s bound: 2.5 s is too late.
        grant(2_600_000, 1, 2),
        release(2_700_000, 1, 2),
    ];
    let f = check(&h);
    assert_eq!(guarantees_broken(&f), vec!["expiry"]);
    assert_eq!(f.rows["kill"].longest_free, Some(2_500_000));
    // The dead holder's belief ended at the kill.
    assert_eq!((f.beliefs[0].end, f.beliefs[0].cause), (100_000, EndCause::Died));
}

#[test]
fn a_prompt_regrant_after_a_kill_holds() {
    let h = vec![
        start(),
        grant(10, 0, 1),
        fault(100_000, FaultKind::Kill, 0, Phase::Start),
        grant(1_050_000, 1, 2),
        release(1_100_000, 1, 2),
    ];
    let f = check(&h);
    assert!(f.ok(), "{:?}", f.violations);
    assert_eq!(f.rows["kill"].longest_free, Some(950_000));
}

#[test]
fn the_history_round_trips_through_json_lines() {
    let h = vec![start(), grant(10, 0, 1), fault(5, FaultKind::Pause, 1, Phase::End), Record::End { t: 9 }];
    let text: String = h.iter().map(|r| serde_json::to_string(r).unwrap() + "\n").collect();
    assert_eq!(record::parse(&text).unwrap(), h);
}

#[test]
fn the_store_lease_is_the_ttl_except_on_etcd() {
    use std::time::Duration;
    let lease = crate::commands::verify::store_lease;
    assert_eq!(lease("redis://h:1", Duration::from_millis(700)), Duration::from_millis(700));
    assert_eq!(lease("etcd://h:1", Duration::from_millis(700)), Duration::from_secs(2));
    assert_eq!(lease("ETCDS://h:1", Duration::from_millis(3100)), Duration::from_secs(4));
}

#[test]
fn the_expiry_bound_follows_the_store_lease() {
    let mut h = vec![
        grant(10, 0, 1),
        fault(100_000, FaultKind::Kill, 0, Phase::Start),
        // 2.2 s: beyond TTL + 1 s, within a 2 s store lease + 1 s.
        grant(2_300_000, 1, 2),
        release(2_400_000, 1, 2),
    ];
    h.insert(
        0,
        Record::Start {
            t: 0,
            store: "etcd".into(),
            ttl: TTL,
            expiry: 2 * TTL,
            workers: 2,
            faults: vec![],
            restart_keeps_state: None,
            primitive: Default::default(),
            permits: 0,
        },
    );
    assert!(check(&h).ok(), "{:?}", check(&h).violations);
    h[0] = start();
    assert_eq!(guarantees_broken(&check(&h)), vec!["expiry"]);
}

fn start_of(primitive: crate::cli::Primitive, permits: u32) -> Record {
    let Record::Start { t, store, ttl, expiry, workers, faults, restart_keeps_state, .. } = start() else {
        unreachable!()
    };
    Record::Start { t, store, ttl, expiry, workers, faults, restart_keeps_state, primitive, permits }
}

fn shared(t: Micros, lane: u32, fence: u64, hold: record::GrantHold) -> Record {
    Record::Grant { t, lane, pid: 100 + lane, fence, deadline: t + TTL - 10_000, hold }
}

/// The semaphore's history is judged by its permits, with the mutex's
/// beliefs: two permits at once are fine on 2, a third is a violation.
#[test]
fn a_semaphore_history_is_judged_by_its_permits() {
    use record::GrantHold::Permits;
    let two = vec![
        start_of(crate::cli::Primitive::Semaphore, 2),
        shared(10, 0, 1, Permits(1)),
        shared(20_000, 1, 2, Permits(1)),
        release(300_000, 0, 1),
        release(310_000, 1, 2),
    ];
    let f = check(&two);
    assert!(f.ok(), "{:?}", f.violations);
    let mut three = two.clone();
    three.insert(3, shared(30_000, 2, 3, Permits(1)));
    let f = check(&three);
    assert_eq!(guarantees_broken(&f), vec!["exclusion"]);
    assert!(f.violations[0].what.contains("3 permits held at once, over the 2"), "{}", f.violations[0].what);
    // The same history as a mutex's: every overlapping pair is a double grant.
    three[0] = start();
    assert_eq!(check(&three).total().double_grants, 3);
}

/// A shared holder's `holding` record proves its belief as a write does:
/// without it the belief would end at the grant's deadline.
#[test]
fn a_shared_holders_check_extends_its_belief() {
    let h = vec![
        start_of(crate::cli::Primitive::Rwlock, 0),
        shared(10, 0, 1, record::GrantHold::Read),
        Record::Holding { t: 900_000, lane: 0, pid: 100, fence: 1, deadline: 1_800_000 },
        shared(1_200_000, 1, 2, record::GrantHold::Exclusive),
        release(1_300_000, 0, 1),
        release(1_400_000, 1, 2),
    ];
    let f = check(&h);
    // The reader still believed (its deadline moved to 1.8 s) when the writer came.
    assert_eq!(guarantees_broken(&f), vec!["exclusion"]);
    assert_eq!(f.beliefs[0].last_act, 1_300_000);
}

#[test]
fn a_history_from_before_primitives_is_a_mutexs() {
    let old = r#"{"ev":"start","t":0,"store":"sqlite","ttl":1000000,"workers":2,"faults":[]}
{"ev":"grant","t":5,"lane":0,"pid":7,"fence":1,"deadline":900000}"#;
    let h = record::parse(old).unwrap();
    let f = check(&h);
    assert_eq!((f.primitive, f.beliefs[0].hold), (crate::cli::Primitive::Mutex, record::GrantHold::Exclusive));
}
