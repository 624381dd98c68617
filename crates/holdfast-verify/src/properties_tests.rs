//! Each property on a history that keeps it and on one that breaks it: a
//! checker that accepted the broken one would fail here.

use std::time::Duration;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn held(holder: u32, fence: u64, hold: Hold, start: u64, end: u64) -> Held {
    Held { holder, fence, hold, start: ms(start), end: ms(end) }
}

fn rules(found: &[Breach]) -> Vec<Rule> {
    found.iter().map(|b| b.rule).collect()
}

#[test]
fn the_mutex_allows_one_holder_and_reports_two() {
    let x = Hold::Exclusive;
    let one_at_a_time = [held(1, 1, x, 0, 100), held(2, 2, x, 100, 200), held(3, 3, x, 250, 300)];
    assert!(exclusion(Property::Mutex, &one_at_a_time).is_empty());
    let two = [held(1, 1, x, 0, 100), held(2, 2, x, 50, 200)];
    let found = exclusion(Property::Mutex, &two);
    assert_eq!(rules(&found), vec![Rule::Exclusion]);
    assert_eq!((found[0].at, found[0].grants.clone()), (ms(50), vec![0, 1]));
}

/// A holder whose lease ran out locally (its belief ends at its deadline)
/// no longer counts, as for the mutex: the next grant after it is no breach.
#[test]
fn a_semaphore_counts_weights_and_lets_expired_leases_go() {
    let p = Hold::Permits;
    let within = [held(1, 1, p(1), 0, 300), held(2, 2, p(1), 100, 400), held(3, 3, p(1), 300, 500)];
    assert!(exclusion(Property::Semaphore { permits: 2 }, &within).is_empty());
    // Holder 1's lease ran out at 300 (its belief ends there) though it never released.
    let expired = [held(1, 1, p(2), 0, 300), held(2, 2, p(2), 300, 600)];
    assert!(exclusion(Property::Semaphore { permits: 2 }, &expired).is_empty());
    // Weights 1 + 2 at 150 on 2 permits: over the bound.
    let over = [held(1, 1, p(1), 0, 300), held(2, 2, p(2), 150, 400)];
    let found = exclusion(Property::Semaphore { permits: 2 }, &over);
    assert_eq!(rules(&found), vec![Rule::Exclusion]);
    assert!(found[0].what.contains("3 permits held at once, over the 2"), "{}", found[0].what);
    // Three permits of weight 1 on 2: the third start breaks it, not the second.
    let three = [held(1, 1, p(1), 0, 300), held(2, 2, p(1), 100, 300), held(3, 3, p(1), 200, 300)];
    let found = exclusion(Property::Semaphore { permits: 2 }, &three);
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].at, found[0].grants.clone()), (ms(200), vec![0, 1, 2]));
    // The same history on 3 permits is fine.
    assert!(exclusion(Property::Semaphore { permits: 3 }, &three).is_empty());
}

#[test]
fn a_rwlock_lets_readers_share_and_keeps_a_writer_alone() {
    let (r, w) = (Hold::Read, Hold::Exclusive);
    let fine = [held(1, 1, r, 0, 300), held(2, 2, r, 100, 400), held(3, 3, w, 400, 500), held(1, 4, r, 500, 600)];
    assert!(exclusion(Property::RwLock, &fine).is_empty());
    let writer_with_reader = [held(1, 1, r, 0, 300), held(2, 2, w, 200, 400)];
    assert_eq!(rules(&exclusion(Property::RwLock, &writer_with_reader)), vec![Rule::Exclusion]);
    let reader_with_writer = [held(1, 1, w, 0, 300), held(2, 2, r, 200, 400)];
    assert_eq!(rules(&exclusion(Property::RwLock, &reader_with_writer)), vec![Rule::Exclusion]);
    let two_writers = [held(1, 1, w, 0, 300), held(2, 2, w, 200, 400)];
    assert_eq!(rules(&exclusion(Property::RwLock, &two_writers)), vec![Rule::Exclusion]);
}

#[test]
fn an_election_has_one_leader_at_a_time_and_increasing_terms() {
    let x = Hold::Exclusive;
    let fine = [held(1, 10, x, 0, 100), held(2, 11, x, 150, 300)];
    assert!(exclusion(Property::Election, &fine).is_empty());
    assert!(fences(&fine).is_empty());
    let two_leaders = [held(1, 10, x, 0, 200), held(2, 11, x, 150, 300)];
    let found = exclusion(Property::Election, &two_leaders);
    assert_eq!(rules(&found), vec![Rule::Exclusion]);
    assert!(found[0].what.starts_with("two leaders"), "{}", found[0].what);
    let term_back = [held(1, 10, x, 0, 100), held(2, 9, x, 150, 300)];
    assert_eq!(rules(&fences(&term_back)), vec![Rule::Fencing]);
    let term_again = [held(1, 10, x, 0, 100), held(2, 10, x, 150, 300)];
    let found = fences(&term_again);
    assert_eq!(rules(&found), vec![Rule::Fencing]);
    assert!(found[0].what.contains("repeats"), "{}", found[0].what);
}

/// Shared grants may begin in either order (granted together, or a slow
/// reply that returns after the other holder is gone); a grant after an
/// exclusive one, and an exclusive one after anything, has a higher fence;
/// a repeat is always a breach.
#[test]
fn shared_fences_may_interleave_but_never_repeat_or_pass_a_writer() {
    let (r, w) = (Hold::Read, Hold::Exclusive);
    let interleaved = [held(1, 5, r, 0, 300), held(2, 4, r, 10, 300), held(3, 6, w, 300, 400)];
    assert!(fences(&interleaved).is_empty());
    let below_writer = [held(1, 5, w, 0, 100), held(2, 4, r, 150, 300)];
    assert_eq!(rules(&fences(&below_writer)), vec![Rule::Fencing]);
    let writer_below_reader = [held(1, 5, r, 0, 100), held(2, 4, w, 150, 300)];
    assert_eq!(rules(&fences(&writer_below_reader)), vec![Rule::Fencing]);
    let slow_reply = [held(1, 5, r, 0, 100), held(2, 4, r, 150, 300)];
    assert!(fences(&slow_reply).is_empty());
    let repeated = [held(1, 5, Hold::Permits(1), 0, 300), held(2, 5, Hold::Permits(1), 10, 300)];
    assert_eq!(rules(&fences(&repeated)), vec![Rule::Fencing]);
}

#[test]
fn empty_beliefs_are_not_grants() {
    let x = Hold::Exclusive;
    // A belief that ended as it began (lost at once) overlaps nothing.
    let h = [held(1, 1, x, 0, 100), held(2, 2, x, 50, 50)];
    assert!(exclusion(Property::Mutex, &h).is_empty());
}

#[test]
fn times_read_in_the_unit_that_fits() {
    let us = Duration::from_micros;
    let cases = [
        (0, "0 s"),
        (750, "750 µs"),
        (1_500, "1.5 ms"),
        (250_000, "250 ms"),
        (1_500_000, "1.5 s"),
        (10_000_000, "10 s"),
    ];
    for (n, shown) in cases {
        assert_eq!(human(us(n)), shown);
    }
}

#[test]
fn the_properties_read_as_words() {
    assert!(Property::Semaphore { permits: 3 }.exclusion().contains("never more than 3 permits"));
    assert!(Property::RwLock.exclusion().contains("a writer holds alone"));
    assert!(Property::Election.fencing().contains("terms increase"));
}
