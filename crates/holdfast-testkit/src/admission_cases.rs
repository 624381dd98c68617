//! One table of admission cases for the lease model's one rule
//! (`holdfast::backend::admission::decide`), written once and run against
//! every encoding of that rule: the Rust function itself (this module's
//! tests), the Lua port that Redis runs, and each SQL store's acquire on
//! rows seeded into its real tables (`crates/holdfast/tests/admission/`).
//!
//! A case is a key's rows (held leases and reservations, some of them
//! expired), one request, and what the rule says. Every case is a state a
//! store can really be in: at most one exclusive or writer lease held, never
//! beside held shares (the stores keep it in one lease row or hash); held
//! shares under one limit; reservations only of the modes that reserve; and
//! a token with at most one row. A retry asks in the mode it holds, as the
//! client's retries do. Orders are small numbers (1..=[`MAX_ORDER`]); the
//! stores seed their fence counter at [`MAX_ORDER`], so a new grant's fence
//! is above every seeded order.

use holdfast::backend::admission::{Decision, Row};
use holdfast::backend::{LeaseMode, UNLIMITED};

/// The highest order (fence or place) any case seeds.
pub const MAX_ORDER: u64 = 100;

/// The token of the request in most cases; the others are 2..=9. Token
/// bytes are `[n; 16]` ([`token`]), so none is the all-zero token the SQL
/// stores keep for the gate of shares.
pub const ME: u8 = 1;

/// The owner token bytes of token number `n`.
pub fn token(n: u8) -> [u8; 16] {
    [n; 16]
}

/// One row of a key as a case seeds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seed {
    /// Its token number (see [`token`]).
    pub token: u8,
    /// Its lease mode.
    pub mode: LeaseMode,
    /// A held lease (`true`) or a reservation.
    pub held: bool,
    /// A held lease's fence, or a reservation's place.
    pub order: u64,
    /// Seeded already expired: every store must ignore it.
    pub expired: bool,
}

/// What the rule says of a case's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// A new grant, whose fence is above every order the key ever had.
    Grant,
    /// The token already holds the key: the same grant, this fence.
    AlreadyHeld(u64),
    /// Refused. A waiting request of this mode would reserve (`reserve`),
    /// keeping its reservation's place if it has a live one (`keep`); a
    /// non-waiting try just gets nothing.
    Refuse {
        /// Whether the mode reserves.
        reserve: bool,
        /// The place of the token's live reservation.
        keep: Option<u64>,
    },
    /// The request names another limit than the key's shares.
    Conflict,
}

/// One case.
#[derive(Debug, Clone)]
pub struct Case {
    /// A name that says what it checks, shown when it fails.
    pub name: &'static str,
    /// The key's rows before the request.
    pub rows: Vec<Seed>,
    /// The request's token number.
    pub token: u8,
    /// The request's mode.
    pub mode: LeaseMode,
    /// What the rule says.
    pub expect: Expect,
}

impl Case {
    /// The unexpired rows, as a store hands them to the rule.
    pub fn live_rows(&self) -> Vec<Row> {
        self.rows
            .iter()
            .filter(|s| !s.expired)
            .map(|s| Row { token: token(s.token), mode: s.mode, held: s.held, order: s.order })
            .collect()
    }

    /// Whether `decision` is what the case expects.
    pub fn accepts(&self, decision: &Decision) -> bool {
        match (self.expect, decision) {
            (Expect::Grant, Decision::Grant) | (Expect::Conflict, Decision::Conflict(_)) => true,
            (Expect::AlreadyHeld(f), Decision::AlreadyHeld { fence }) => f == *fence,
            (Expect::Refuse { reserve, keep }, Decision::Refuse { reserve: r, keep_order }) => {
                reserve == *r && keep == *keep_order
            }
            _ => false,
        }
    }
}

const X: LeaseMode = LeaseMode::Exclusive;
const W: LeaseMode = LeaseMode::Writer;
/// A reader of a read-write lock.
const R: LeaseMode = LeaseMode::Shared { weight: 1, limit: UNLIMITED };

const fn s(weight: u32, limit: u32) -> LeaseMode {
    LeaseMode::Shared { weight, limit }
}

const fn held(token: u8, mode: LeaseMode, order: u64) -> Seed {
    Seed { token, mode, held: true, order, expired: false }
}

const fn waits(token: u8, mode: LeaseMode, order: u64) -> Seed {
    Seed { token, mode, held: false, order, expired: false }
}

const fn expired(seed: Seed) -> Seed {
    Seed { expired: true, ..seed }
}

fn case(name: &'static str, rows: &[Seed], token: u8, mode: LeaseMode, expect: Expect) -> Case {
    Case { name, rows: rows.to_vec(), token, mode, expect }
}

/// A refusal of a mode that reserves, without a place of its own.
const QUEUE: Expect = Expect::Refuse { reserve: true, keep: None };
/// A refusal of an exclusive request (which never reserves).
const BUSY: Expect = Expect::Refuse { reserve: false, keep: None };

/// Every case.
pub fn cases() -> Vec<Case> {
    use Expect::{AlreadyHeld, Conflict, Grant};
    let keep = |place| Expect::Refuse { reserve: true, keep: Some(place) };
    vec![
        // An empty key admits every mode.
        case("empty key, exclusive", &[], ME, X, Grant),
        case("empty key, writer", &[], ME, W, Grant),
        case("empty key, reader", &[], ME, R, Grant),
        case("empty key, all permits at once", &[], ME, s(4, 4), Grant),
        // Exclusive leases exclude each other and every share.
        case("exclusive vs held exclusive", &[held(2, X, 10)], ME, X, BUSY),
        case("writer vs held exclusive", &[held(2, X, 10)], ME, W, QUEUE),
        case("reader vs held exclusive", &[held(2, X, 10)], ME, R, QUEUE),
        case("exclusive vs held writer", &[held(2, W, 10)], ME, X, BUSY),
        case("reader vs held writer", &[held(2, W, 10)], ME, R, QUEUE),
        case("permit vs held writer", &[held(2, W, 10)], ME, s(1, 4), QUEUE),
        case("writer vs held readers", &[held(2, R, 10), held(3, R, 11)], ME, W, QUEUE),
        case("exclusive vs one held permit", &[held(2, s(1, 4), 10)], ME, X, BUSY),
        // Shares add up to the limit.
        case("reader joins readers", &[held(2, R, 10), held(3, R, 11)], ME, R, Grant),
        case("permits within the limit", &[held(2, s(2, 4), 10), held(3, s(1, 4), 11)], ME, s(1, 4), Grant),
        case("permits over the limit", &[held(2, s(2, 4), 10), held(3, s(1, 4), 11)], ME, s(2, 4), QUEUE),
        case("no permit left", &[held(2, s(4, 4), 10)], ME, s(1, 4), QUEUE),
        case("a weight that fills what is left", &[held(2, s(1, 5), 10)], ME, s(4, 5), Grant),
        // The limit lives with the key.
        case("another semaphore size", &[held(2, s(1, 8), 10)], ME, s(1, 4), Conflict),
        case("a reader on a semaphore", &[held(2, s(1, 4), 10)], ME, R, Conflict),
        case("a permit on a read-write lock", &[held(2, R, 10)], ME, s(1, 4), Conflict),
        case("another size, only waiting", &[waits(2, s(1, 8), 10)], ME, s(1, 4), Conflict),
        case("another size, expired", &[expired(held(2, s(1, 8), 10))], ME, s(1, 4), Grant),
        case("a writer names no limit", &[waits(2, s(1, 8), 10)], ME, W, Grant),
        // Reservations: exclusive requests barge, shares keep the order.
        case("exclusive barges past reservations", &[waits(2, W, 10), waits(3, s(1, 4), 11)], ME, X, Grant),
        case(
            "an older reservation keeps its permits",
            &[held(2, s(2, 4), 10), waits(3, s(2, 4), 20)],
            ME,
            s(1, 4),
            QUEUE,
        ),
        case(
            "a reservation is admitted at its place",
            &[held(2, s(2, 4), 10), waits(3, s(2, 4), 20)],
            3,
            s(2, 4),
            Grant,
        ),
        case(
            "a newer reservation does not hold back an older one",
            &[held(2, s(2, 4), 10), waits(3, s(2, 4), 30), waits(ME, s(2, 4), 20)],
            ME,
            s(2, 4),
            Grant,
        ),
        case(
            "a large request is not starved by small ones",
            &[held(2, s(1, 3), 10), waits(3, s(3, 3), 20)],
            ME,
            s(1, 3),
            QUEUE,
        ),
        case(
            "a reserved request still over the limit keeps its place",
            &[held(2, s(3, 4), 10), waits(ME, s(2, 4), 20)],
            ME,
            s(2, 4),
            keep(20),
        ),
        // A waiting writer holds back later readers (no writer starvation).
        case("a waiting writer holds back a new reader", &[held(2, R, 10), waits(3, W, 20)], ME, R, QUEUE),
        case(
            "a reader that waited before the writer goes first",
            &[held(2, R, 10), waits(3, W, 20), waits(ME, R, 15)],
            ME,
            R,
            Grant,
        ),
        case(
            "a reader that came after the writer keeps waiting",
            &[held(2, R, 10), waits(3, W, 20), waits(ME, R, 25)],
            ME,
            R,
            keep(25),
        ),
        case("the waiting writer waits for the readers", &[held(2, R, 10), waits(ME, W, 20)], ME, W, keep(20)),
        // A retry whose reply was lost finds its grant, whatever else holds.
        case("retry of a held exclusive lease", &[held(ME, X, 10)], ME, X, AlreadyHeld(10)),
        case(
            "retry of a held exclusive lease, a reservation made since",
            &[held(ME, X, 10), waits(2, W, 20)],
            ME,
            X,
            AlreadyHeld(10),
        ),
        case("retry of a held writer", &[held(ME, W, 12), waits(2, R, 30)], ME, W, AlreadyHeld(12)),
        case(
            "retry of a held permit, key full",
            &[held(ME, s(2, 4), 10), held(2, s(2, 4), 11)],
            ME,
            s(2, 4),
            AlreadyHeld(10),
        ),
        // Expired rows count for nothing.
        case("an expired exclusive lease", &[expired(held(2, X, 10))], ME, X, Grant),
        case("an expired writer lease", &[expired(held(2, W, 10))], ME, R, Grant),
        case("expired permits free the limit", &[expired(held(2, s(4, 4), 10))], ME, s(4, 4), Grant),
        case("an expired writer reservation", &[held(2, R, 10), expired(waits(3, W, 20))], ME, R, Grant),
        case("the writer's readers expired", &[expired(held(2, R, 10)), waits(ME, W, 20)], ME, W, Grant),
        case(
            "an expired reservation is no place",
            &[held(2, s(2, 4), 10), waits(3, s(2, 4), 20), expired(waits(ME, s(2, 4), 15))],
            ME,
            s(2, 4),
            QUEUE,
        ),
        case(
            "some permits expired",
            &[held(2, s(1, 2), 10), expired(held(3, s(1, 2), 11)), expired(held(4, s(1, 2), 12))],
            ME,
            s(1, 2),
            Grant,
        ),
        // Mixed.
        case(
            "readers, a waiting writer, older and newer readers",
            &[held(2, R, 10), held(3, R, 11), waits(4, W, 30), waits(ME, R, 25), waits(6, R, 40)],
            ME,
            R,
            Grant,
        ),
        case(
            "permits held, reserved and expired",
            &[held(2, s(2, 6), 10), waits(3, s(2, 6), 20), expired(waits(4, s(4, 6), 15)), waits(ME, s(2, 6), 30)],
            ME,
            s(2, 6),
            Grant,
        ),
        case(
            "permits held, reserved ahead, full",
            &[held(2, s(3, 6), 10), waits(3, s(2, 6), 20), waits(ME, s(2, 6), 30)],
            ME,
            s(2, 6),
            keep(30),
        ),
    ]
}

/// Checks that the table keeps its promises (valid states only), so a
/// store test never seeds what no store could hold.
pub fn check_well_formed(case: &Case) -> Result<(), String> {
    let live: Vec<&Seed> = case.rows.iter().filter(|s| !s.expired).collect();
    let exclusive_held = live.iter().filter(|s| s.held && s.mode.is_exclusive()).count();
    let shares_held = live.iter().filter(|s| s.held && !s.mode.is_exclusive()).count();
    if exclusive_held > 1 || (exclusive_held == 1 && shares_held > 0) {
        return Err("an exclusive lease held beside other leases".into());
    }
    let mut limits = live.iter().filter(|s| s.held).filter_map(|s| s.mode.limit());
    if let Some(first) = limits.next() {
        if limits.any(|l| l != first) {
            return Err("held shares under two limits".into());
        }
    }
    if case.rows.iter().any(|s| !s.held && s.mode == LeaseMode::Exclusive) {
        return Err("a reservation of an exclusive request".into());
    }
    let mut tokens: Vec<u8> = case.rows.iter().map(|s| s.token).collect();
    tokens.sort_unstable();
    if tokens.windows(2).any(|w| w[0] == w[1]) || tokens.contains(&0) {
        return Err("a token with two rows, or the all-zero token".into());
    }
    if case.rows.iter().any(|s| s.order == 0 || s.order > MAX_ORDER) {
        return Err(format!("an order outside 1..={MAX_ORDER}"));
    }
    let own_held = case.rows.iter().find(|s| s.token == case.token && s.held && !s.expired);
    if own_held.is_some_and(|s| s.mode != case.mode) {
        return Err("a retry in another mode than the one held".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use holdfast::backend::admission::decide;

    use super::*;

    /// The Rust rule passes every case, and every case is a state a store can be in.
    #[test]
    fn rust_decide_passes_every_case() {
        let all = cases();
        assert!(all.len() >= 25, "{} cases", all.len());
        let mut failed = Vec::new();
        for c in &all {
            if let Err(why) = check_well_formed(c) {
                failed.push(format!("{}: not a valid state: {why}", c.name));
                continue;
            }
            let got = decide(token(c.token), c.mode, &c.live_rows());
            if !c.accepts(&got) {
                failed.push(format!("{}: expected {:?}, decide said {got:?}", c.name, c.expect));
            }
        }
        assert!(failed.is_empty(), "{} of {} cases failed:\n{}", failed.len(), all.len(), failed.join("\n"));
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = cases().iter().map(|c| c.name).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "two cases share a name");
    }
}
