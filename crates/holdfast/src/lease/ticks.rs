//! Instants in 8 bytes, for the renewer's per-lease schedule: a client that
//! holds 100,000 leases keeps three instants of each in its renewal table
//! and one in its ordered schedule, and a `tokio::time::Instant` takes 16
//! bytes (a `timespec`). A [`Tick`] is nanoseconds from the renewer's
//! [`Epoch`], signed (an instant before the epoch, as a grant's start may
//! be, is still exact), with 0 kept out so that `Option<Tick>` is 8 bytes
//! too. It reaches 292 years either side of the epoch; an instant further
//! away is clamped to the end of that range.

use std::num::NonZeroI64;
use std::time::Duration;

use tokio::time::Instant;

const ONE_NS: NonZeroI64 = NonZeroI64::new(1).unwrap();

/// An instant as nanoseconds from an [`Epoch`] (never 0: the epoch itself
/// is 1 ns after it, a difference no schedule notices).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Tick(NonZeroI64);

impl Tick {
    fn from_nanos(nanos: i128) -> Tick {
        let clamped = nanos.clamp(i128::from(i64::MIN + 1), i128::from(i64::MAX)) as i64;
        Tick(NonZeroI64::new(clamped).unwrap_or(ONE_NS))
    }

    /// This tick plus `d`, clamped at the end of the range.
    pub(super) fn plus(self, d: Duration) -> Tick {
        Tick::from_nanos(i128::from(self.0.get()) + d.as_nanos() as i128)
    }
}

/// The instant ticks count from.
#[derive(Clone, Copy, Debug)]
pub(super) struct Epoch(Instant);

impl Epoch {
    pub(super) fn now() -> Epoch {
        Epoch(Instant::now())
    }

    pub(super) fn tick(self, at: Instant) -> Tick {
        let nanos = if at >= self.0 {
            at.duration_since(self.0).as_nanos() as i128
        } else {
            -(self.0.duration_since(at).as_nanos() as i128)
        };
        Tick::from_nanos(nanos)
    }

    /// The instant of `t` (the end of what the clock can count, if `t` is
    /// past it).
    pub(super) fn instant(self, t: Tick) -> Instant {
        let nanos = t.0.get();
        let offset = Duration::from_nanos(nanos.unsigned_abs());
        let at = if nanos >= 0 { self.0.checked_add(offset) } else { self.0.checked_sub(offset) };
        at.unwrap_or(self.0 + Duration::from_secs(86_400 * 365 * 30))
    }
}

#[cfg(test)]
mod tests {
    use super::{Epoch, Tick};
    use std::time::Duration;
    use tokio::time::Instant;

    /// Instants before and after the epoch come back to the nanosecond and
    /// keep their order, and `Option<Tick>` costs no more than a tick.
    #[test]
    fn ticks_keep_instants_and_their_order_in_8_bytes() {
        let epoch = Epoch::now();
        let base = epoch.0;
        let later = base + Duration::from_millis(1500);
        let earlier = base.checked_sub(Duration::from_millis(20)).unwrap_or(base);
        for at in [base + Duration::from_nanos(1), later, earlier] {
            assert_eq!(epoch.instant(epoch.tick(at)), at);
        }
        assert!(epoch.tick(earlier) <= epoch.tick(base) && epoch.tick(base) < epoch.tick(later));
        assert_eq!(epoch.tick(base).plus(Duration::from_millis(1500)), epoch.tick(later).plus(Duration::from_nanos(1)));
        assert_eq!(std::mem::size_of::<Option<Tick>>(), 8);
        let far = epoch.tick(base).plus(Duration::MAX);
        assert!(epoch.instant(far) > Instant::now() + Duration::from_secs(86_400 * 365));
    }
}
