//! The one admission rule of the lease model ([`LeaseMode`]). The stores
//! that keep a key's leases and reservations as rows and decide in a
//! transaction read the key's unexpired rows, ask [`decide`], and write
//! what it says; the stores that keep them as a queue in arrival order ask
//! [`admitted_in_queue`], the same rule over a queue. Keeping the rule here, once, is what makes a
//! semaphore or a read-write lock mean the same on every such store.

use crate::backend::{LeaseMode, UNLIMITED};

/// How a lease mode is stored: one small integer plus weight and limit.
pub const MODE_EXCLUSIVE: i64 = 0;
/// See [`MODE_EXCLUSIVE`].
pub const MODE_WRITER: i64 = 1;
/// See [`MODE_EXCLUSIVE`].
pub const MODE_SHARED: i64 = 2;

/// `(mode, weight, limit)` as stored; exclusive modes store weight 1, limit 0.
pub fn encode(mode: LeaseMode) -> (i64, i64, i64) {
    match mode {
        LeaseMode::Exclusive => (MODE_EXCLUSIVE, 1, 0),
        LeaseMode::Writer => (MODE_WRITER, 1, 0),
        LeaseMode::Shared { weight, limit } => (MODE_SHARED, weight.into(), limit.into()),
    }
}

/// The mode stored as `(mode, weight, limit)`; an unknown code reads as
/// exclusive, the mode that admits least.
pub fn decode(mode: i64, weight: i64, limit: i64) -> LeaseMode {
    match mode {
        MODE_SHARED => LeaseMode::Shared {
            weight: u32::try_from(weight).unwrap_or(u32::MAX),
            limit: u32::try_from(limit).unwrap_or(UNLIMITED),
        },
        MODE_WRITER => LeaseMode::Writer,
        _ => LeaseMode::Exclusive,
    }
}

/// One unexpired row of a key: a held lease or a waiting request's reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The owner token's bytes.
    pub token: [u8; 16],
    /// The lease's mode.
    pub mode: LeaseMode,
    /// `true` for a held lease, `false` for a reservation.
    pub held: bool,
    /// A held lease's fence, or a reservation's place (taken from the same
    /// counter when the reservation was first made, so older is smaller).
    pub order: u64,
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The token already holds the key (a retry whose reply was lost):
    /// extend that lease and return its fence.
    AlreadyHeld {
        /// The held lease's fence.
        fence: u64,
    },
    /// Grant a new lease (replacing the token's reservation, if any).
    Grant,
    /// Refuse. `reserve` says whether a waiting request of this mode leaves
    /// (or refreshes) a reservation; `keep_order` is the place of the
    /// token's live reservation, if it has one, to keep when refreshing it.
    Refuse {
        /// Whether the mode reserves.
        reserve: bool,
        /// The token's existing reservation's place.
        keep_order: Option<u64>,
    },
    /// The request names another limit than the key's shared leases.
    Conflict(String),
}

/// Decides a request of `token` in `mode` against the key's unexpired
/// `rows`, by the rule in [`LeaseMode`]'s docs.
pub fn decide(token: [u8; 16], mode: LeaseMode, rows: &[Row]) -> Decision {
    if let Some(own) = rows.iter().find(|r| r.held && r.token == token) {
        return Decision::AlreadyHeld { fence: own.order };
    }
    let own_place = rows.iter().find(|r| !r.held && r.token == token).map(|r| r.order);
    let refuse = Decision::Refuse { reserve: mode.reserves(), keep_order: own_place };
    let others = || rows.iter().filter(|r| r.token != token);
    if mode.is_exclusive() {
        return if others().any(|r| r.held) { refuse } else { Decision::Grant };
    }
    let (weight, limit) = (u64::from(mode.weight()), mode.limit().unwrap_or(UNLIMITED));
    if let Some(other) = others().filter_map(|r| r.mode.limit()).find(|l| *l != limit) {
        return Decision::Conflict(conflict_reason(limit, other));
    }
    // Older than this request: every reservation when it has none.
    let older = |r: &&Row| own_place.is_none_or(|mine| r.order < mine);
    let mut taken = weight;
    for r in others() {
        match (r.held, r.mode) {
            (true, LeaseMode::Shared { weight, .. }) => taken += u64::from(weight),
            (true, _) => return refuse,
            (false, LeaseMode::Shared { weight, .. }) if older(&r) => taken += u64::from(weight),
            (false, LeaseMode::Writer) if older(&r) => return refuse,
            (false, _) => {}
        }
    }
    if taken <= u64::from(limit) { Decision::Grant } else { refuse }
}

/// For the stores that keep a key's leases as one queue in arrival order
/// (etcd, ZooKeeper): how many entries, from the head, hold the key. The
/// rule is the same as [`decide`]'s with every entry ahead of a request
/// counted as held, which makes the queue strictly fair: an exclusive
/// entry is admitted only at the head; a shared one when no exclusive entry
/// is ahead and its weight plus those ahead is at most its limit. An entry
/// that is not admitted holds back every entry behind it (a waiting writer
/// holds back later readers, a large request later small ones), so the
/// admitted entries are always a prefix of the queue, and a later entry is
/// never admitted before an earlier one.
pub fn admitted_in_queue(queue: impl IntoIterator<Item = LeaseMode>) -> usize {
    holding_in_queue(queue.into_iter().map(|m| (m, false)))
}

/// [`admitted_in_queue`] for a queue whose entries may be marked as
/// holding (`true`): a [`Backend::resize`](crate::backend::Backend::resize)
/// marks the entries that held before it, so that holders above a lowered
/// limit are still told apart from waiters. A marked entry holds whatever
/// the limit; its weight counts against the entries behind it. (Marks never
/// change who is admitted next: every entry ahead of a waiter counts
/// against it either way.)
pub fn holding_in_queue(queue: impl IntoIterator<Item = (LeaseMode, bool)>) -> usize {
    let mut taken = 0u64;
    let mut admitted = 0;
    for (mode, marked) in queue {
        match mode {
            LeaseMode::Shared { weight, limit } if marked || taken + u64::from(weight) <= u64::from(limit) => {
                taken += u64::from(weight);
            }
            _ if admitted == 0 && mode.is_exclusive() => return 1,
            _ => break,
        }
        admitted += 1;
    }
    admitted
}

/// For queue stores: the conflict of a shared request in `mode` with the
/// shared entries `ahead` of it, which name another limit; checked when the
/// request first joins the queue (a later [`Backend::resize`] rewrites
/// every entry's limit, its own too).
///
/// [`Backend::resize`]: crate::backend::Backend::resize
pub fn conflict_in_queue(mode: LeaseMode, ahead: impl IntoIterator<Item = LeaseMode>) -> Option<String> {
    let asked = mode.limit()?;
    ahead.into_iter().filter_map(|m| m.limit()).find(|l| *l != asked).map(|held| conflict_reason(asked, held))
}

/// Why a shared request under `asked` conflicts with a key held under `held`.
pub fn conflict_reason(asked: u32, held: u32) -> String {
    let name =
        |l: u32| if l == UNLIMITED { "a read-write lock".to_owned() } else { format!("a semaphore of {l} permits") };
    format!("asked for a share of {}, but the key is held as {}", name(asked), name(held))
}

/// What a [`Backend::shrink`](crate::backend::Backend::shrink) of a lease
/// held in mode `held` to `to` stores: the smaller mode, or why `to` is not
/// smaller (the store answers [`Error::InvalidInput`](crate::Error::InvalidInput)
/// with it, changing nothing). An exclusive lease becomes a share of weight
/// 1 under `to`'s limit; a share keeps its limit and takes the smaller weight.
pub fn shrunk(held: LeaseMode, to: LeaseMode) -> Result<LeaseMode, String> {
    let LeaseMode::Shared { weight: to_weight, limit: to_limit } = to else {
        return Err(format!("{to:?} is not smaller than any lease: shrink to a shared mode"));
    };
    match held {
        LeaseMode::Exclusive | LeaseMode::Writer if to_weight == 1 && to_limit >= 1 => Ok(to),
        LeaseMode::Exclusive | LeaseMode::Writer => {
            Err(format!("an exclusive lease shrinks to a share of weight 1 under a limit of at least 1, not {to:?}"))
        }
        LeaseMode::Shared { weight, limit } if (1..weight).contains(&to_weight) => {
            Ok(LeaseMode::Shared { weight: to_weight, limit })
        }
        LeaseMode::Shared { weight, .. } => {
            Err(format!("a share of weight {weight} shrinks to a weight from 1 to {}, not {to_weight}", weight - 1))
        }
    }
}

/// What a store's shrink step found, before it is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shrink {
    /// The lease was made smaller.
    Shrunk,
    /// The token holds no unexpired lease of the key.
    NotHeld,
    /// The mode asked for is not smaller than the held one: why.
    NotSmaller(String),
}

impl Shrink {
    /// The answer of [`Backend::shrink`](crate::backend::Backend::shrink).
    pub fn answer(self) -> crate::vocabulary::error::Result<bool> {
        match self {
            Shrink::Shrunk => Ok(true),
            Shrink::NotHeld => Ok(false),
            Shrink::NotSmaller(reason) => Err(crate::vocabulary::error::Error::invalid("shrink", reason)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: u8, mode: LeaseMode, held: bool, order: u64) -> Row {
        Row { token: [t; 16], mode, held, order }
    }

    fn shared(weight: u32, limit: u32) -> LeaseMode {
        LeaseMode::Shared { weight, limit }
    }

    #[test]
    fn exclusive_needs_no_other_lease_and_ignores_reservations() {
        assert_eq!(decide([1; 16], LeaseMode::Exclusive, &[]), Decision::Grant);
        let reserved = [row(2, LeaseMode::Writer, false, 5), row(3, shared(1, 4), false, 6)];
        assert_eq!(decide([1; 16], LeaseMode::Exclusive, &reserved), Decision::Grant);
        let held = [row(2, shared(1, 4), true, 7)];
        assert_eq!(decide([1; 16], LeaseMode::Writer, &held), Decision::Refuse { reserve: true, keep_order: None });
        assert_eq!(decide([1; 16], LeaseMode::Exclusive, &held), Decision::Refuse { reserve: false, keep_order: None });
    }

    #[test]
    fn a_retry_finds_its_grant() {
        let rows = [row(1, LeaseMode::Exclusive, true, 9), row(2, LeaseMode::Exclusive, false, 3)];
        assert_eq!(decide([1; 16], LeaseMode::Exclusive, &rows), Decision::AlreadyHeld { fence: 9 });
    }

    #[test]
    fn permits_sum_to_the_limit() {
        let rows = [row(2, shared(2, 4), true, 1), row(3, shared(1, 4), true, 2)];
        assert_eq!(decide([1; 16], shared(1, 4), &rows), Decision::Grant);
        assert_eq!(decide([1; 16], shared(2, 4), &rows), Decision::Refuse { reserve: true, keep_order: None });
    }

    #[test]
    fn an_older_reservation_keeps_its_weight() {
        // 2 of 4 held; a request for 2 waits (place 5): a later request for
        // 1 would leave no room for it, so it is refused; the reserved one is not.
        let rows = [row(2, shared(2, 4), true, 1), row(3, shared(2, 4), false, 5)];
        assert_eq!(decide([1; 16], shared(1, 4), &rows), Decision::Refuse { reserve: true, keep_order: None });
        assert_eq!(decide([3; 16], shared(2, 4), &rows), Decision::Grant);
    }

    #[test]
    fn a_waiting_writer_holds_back_later_readers_only() {
        let r = shared(1, UNLIMITED);
        let rows = [row(2, r, true, 1), row(3, LeaseMode::Writer, false, 5), row(4, r, false, 4)];
        // A new reader queues behind the writer...
        assert_eq!(decide([1; 16], r, &rows), Decision::Refuse { reserve: true, keep_order: None });
        // ...but a reader that waited before the writer came is not held back.
        assert_eq!(decide([4; 16], r, &rows), Decision::Grant);
        // The writer waits for the held reader.
        assert_eq!(decide([3; 16], LeaseMode::Writer, &rows), Decision::Refuse { reserve: true, keep_order: Some(5) });
    }

    #[test]
    fn mixed_limits_conflict() {
        let rows = [row(2, shared(1, 8), true, 1)];
        assert!(matches!(decide([1; 16], shared(1, 4), &rows), Decision::Conflict(_)));
        assert!(matches!(decide([1; 16], shared(1, UNLIMITED), &rows), Decision::Conflict(_)));
        let waiting = [row(2, shared(1, 8), false, 1)];
        assert!(matches!(decide([1; 16], shared(1, 4), &waiting), Decision::Conflict(_)));
    }

    #[test]
    fn a_queue_admits_a_prefix_in_order() {
        let (r, w, x) = (shared(1, UNLIMITED), LeaseMode::Writer, LeaseMode::Exclusive);
        assert_eq!(admitted_in_queue([]), 0);
        assert_eq!(admitted_in_queue([x, r]), 1);
        assert_eq!(admitted_in_queue([r, r, w, r]), 2, "a waiting writer holds back later readers");
        assert_eq!(admitted_in_queue([w, r]), 1);
        assert_eq!(admitted_in_queue([r, x]), 1);
        // 4 permits: 2 + 1 fit, the next 2 does not, and the 1 behind it waits too.
        assert_eq!(admitted_in_queue([shared(2, 4), shared(1, 4), shared(2, 4), shared(1, 4)]), 2);
        assert_eq!(admitted_in_queue([shared(4, 4), shared(1, 4)]), 1);
    }

    #[test]
    fn marked_holders_hold_above_a_lowered_limit() {
        // 2 + 1 held of 4, resized to 2: both still hold, a new 1 waits.
        let queue = [(shared(2, 2), true), (shared(1, 2), true), (shared(1, 2), false)];
        assert_eq!(holding_in_queue(queue), 2);
        assert_eq!(admitted_in_queue(queue.map(|(m, _)| m)), 1, "unmarked, the second looks like a waiter");
        // Once the first goes, the second (1 of 2) and the next (2 of 2) fit.
        assert_eq!(holding_in_queue([(shared(1, 2), true), (shared(1, 2), false)]), 2);
    }

    #[test]
    fn a_queue_conflict_is_another_limit_ahead() {
        assert!(conflict_in_queue(shared(1, 4), [LeaseMode::Exclusive, shared(2, 4)]).is_none());
        assert!(conflict_in_queue(shared(1, 4), [shared(1, 5)]).is_some());
        assert!(conflict_in_queue(shared(1, UNLIMITED), [shared(1, 5)]).is_some());
        assert!(conflict_in_queue(LeaseMode::Writer, [shared(1, 5)]).is_none());
    }

    #[test]
    fn only_a_smaller_mode_is_a_shrink() {
        let r = shared(1, UNLIMITED);
        assert_eq!(shrunk(LeaseMode::Writer, r), Ok(r));
        assert_eq!(shrunk(LeaseMode::Exclusive, shared(1, 3)), Ok(shared(1, 3)));
        assert!(shrunk(LeaseMode::Writer, shared(2, 3)).is_err());
        assert!(shrunk(LeaseMode::Writer, LeaseMode::Exclusive).is_err());
        // A share keeps the key's limit, whatever `to` names.
        assert_eq!(shrunk(shared(3, 4), shared(1, 9)), Ok(shared(1, 4)));
        assert!(shrunk(shared(3, 4), shared(3, 4)).is_err(), "not smaller");
        assert!(shrunk(shared(3, 4), shared(0, 4)).is_err(), "weight 0");
        assert!(shrunk(r, r).is_err(), "a repeated downgrade");
        assert!(shrunk(r, LeaseMode::Writer).is_err(), "an upgrade");
    }

    #[test]
    fn modes_round_trip() {
        for m in [LeaseMode::Exclusive, LeaseMode::Writer, shared(3, 7), shared(1, UNLIMITED)] {
            let (a, b, c) = encode(m);
            assert_eq!(decode(a, b, c), m);
        }
    }
}
