//! What the demo concludes from the workers' sales and the witnesses.

use holdfast_verify::witness::Report;

/// What the demo concludes from the workers' sales and the witness (one
/// per segment when the stock is segmented).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Items the workers say they sold.
    pub sold: u64,
    /// Stock left in the witnesses, in all.
    pub left: i64,
    /// Sales beyond what left the stock: two workers sold the same item.
    pub oversold: i64,
    /// Segments whose stock went below zero (0 or 1 without segments).
    pub below_zero: u64,
    /// The most holders a witness saw inside at once.
    pub max_inside: u64,
    /// Whether fences rose strictly in entry order, in every witness.
    pub fences_increasing: bool,
    /// Grants the witnesses recorded.
    pub grants: u64,
}

impl Verdict {
    /// Judges a run that started with `stock` items and one witness.
    pub fn new(stock: u64, sold: u64, report: &Report) -> Self {
        Self::segmented(stock, sold, std::slice::from_ref(report))
    }

    /// Judges a run that started with `stock` items split over the
    /// segments whose witnesses reported `reports`.
    pub fn segmented(stock: u64, sold: u64, reports: &[Report]) -> Self {
        let left: i64 = reports.iter().map(|r| r.counter).sum();
        let taken = stock as i64 - left;
        Verdict {
            sold,
            left,
            oversold: sold as i64 - taken,
            below_zero: reports.iter().filter(|r| r.counter < 0).count() as u64,
            max_inside: reports.iter().map(|r| r.max_inside).max().unwrap_or(0),
            fences_increasing: reports.iter().all(|r| r.fences_increasing),
            grants: reports.iter().map(|r| r.entries).sum(),
        }
    }

    /// Whether every invariant held: nothing oversold, everything sold (the
    /// workers stop only when every segment is empty), no stock below zero,
    /// one holder at a time, fences increasing.
    pub fn ok(&self) -> bool {
        self.oversold == 0 && self.left == 0 && self.below_zero == 0 && self.max_inside <= 1 && self.fences_increasing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(counter: i64, max_inside: u64, fences_increasing: bool) -> Report {
        Report { entries: 10, overlaps: max_inside.saturating_sub(1), max_inside, fences_increasing, counter }
    }

    #[test]
    fn verdict_catches_each_broken_invariant() {
        assert!(Verdict::new(10, 10, &report(0, 1, true)).ok());
        let oversold = Verdict::new(10, 11, &report(0, 1, true));
        assert_eq!(oversold.oversold, 1);
        assert!(!oversold.ok());
        assert!(!Verdict::new(10, 10, &report(0, 2, true)).ok());
        assert!(!Verdict::new(10, 10, &report(0, 1, false)).ok());
        assert!(!Verdict::new(10, 11, &report(-1, 1, true)).ok());
        assert!(!Verdict::new(10, 9, &report(1, 1, true)).ok(), "an item left unsold");
    }

    #[test]
    fn segmented_verdict_checks_every_segment() {
        let fine = [report(0, 1, true), report(0, 1, true)];
        let v = Verdict::segmented(20, 20, &fine);
        assert!(v.ok());
        assert_eq!(v.grants, 20);
        // One segment oversold by one, another with one left: the sum hides it, below_zero does not.
        let hidden = Verdict::segmented(20, 20, &[report(-1, 1, true), report(1, 1, true)]);
        assert_eq!((hidden.left, hidden.oversold, hidden.below_zero), (0, 0, 1));
        assert!(!hidden.ok());
        assert!(!Verdict::segmented(20, 20, &[report(0, 1, true), report(0, 2, true)]).ok());
        assert!(!Verdict::segmented(20, 20, &[report(0, 1, false), report(0, 1, true)]).ok());
    }
}
