//! Mutation tests of shared leases (see [`mutations`](super::mutations)):
//! the one admission rule and the semaphore's request, each bug put back
//! and found by seeded runs of permits and read-write locks beside mutexes
//! (the runner's `shares` config).

use super::mutations::{Mutation, SAFETY, catch};

/// The one admission rule (SQLite, PostgreSQL, MySQL and the simulated
/// store decide with it) with a held writer that does not keep readers
/// out: a read lock is granted beside the write lock.
#[test]
fn admission_readers_beside_a_writer() {
    catch(&Mutation {
        name: "admission: readers beside a held writer",
        file: "crates/holdfast/src/backend/admission.rs",
        original: "            (true, _) => return refuse,",
        mutated: "            (true, LeaseMode::Exclusive) => return refuse,\n            (true, _) => {} // MUTANT: a held writer admits shares",
        config: "shares",
        expect: SAFETY,
    });
}

/// The admission rule without the request's own weight: permits are
/// granted while those held fit, so one more than the limit can be held.
#[test]
fn admission_without_its_own_weight() {
    catch(&Mutation {
        name: "admission: the request's own weight not counted",
        file: "crates/holdfast/src/backend/admission.rs",
        original: "    let mut taken = weight;",
        mutated: "    let mut taken = 0 * weight; // MUTANT: its own weight not counted",
        config: "shares",
        expect: SAFETY,
    });
}

/// A semaphore whose `acquire_many` asks the store for one permit whatever
/// it was asked for: the grant counts as many permits for its holder, one
/// for the store.
#[test]
fn semaphore_asks_for_one_permit() {
    catch(&Mutation {
        name: "semaphore: acquire_many asks for one permit",
        file: "crates/holdfast/src/semaphore.rs",
        original: "        this.weight = n;",
        mutated: "        this.weight = n.min(1); // MUTANT: always one permit",
        config: "shares",
        expect: SAFETY,
    });
}
