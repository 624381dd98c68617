//! Time and clock drift, as both models abstract them.
//!
//! Time is discrete. One tick of real time advances every clock by one. Only
//! durations matter to a lease protocol (a store compares its own clock with
//! its own earlier reading, a client likewise), so a clock's offset is
//! irrelevant and only its *rate* counts. Rate drift is modelled as a budget:
//! a store's clock may, at any step the checker picks, run one tick ahead on
//! its own, at most `drift` times over a run. The clients' clocks are the
//! reference ("real time"): a client clock running ahead would only make that
//! client stricter (its validity ends sooner), whereas a store clock running
//! ahead is the dangerous direction (a key expires while its holder still
//! counts on it). The durations a client and a store measure for the same
//! interval therefore differ by at most `drift` ticks, the bound a client
//! subtracts from its validity.
//!
//! Timers are kept relative (ticks remaining, ticks elapsed) rather than as
//! absolute readings, so that states that differ only by when they happened
//! collapse into one and the state space is finite without a time horizon.

/// How far one node's clock has run ahead of real time so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClockGain {
    ticks_ahead: u8,
}

impl ClockGain {
    /// True if the clock may still run one tick ahead without exceeding `drift`.
    pub fn may_run_ahead(self, drift: u8) -> bool {
        self.ticks_ahead < drift
    }

    /// Records that the clock ran one tick ahead of real time.
    pub fn run_ahead(&mut self) {
        self.ticks_ahead = self.ticks_ahead.saturating_add(1);
    }

    /// Ticks this clock has gained on real time.
    pub fn ticks_ahead(self) -> u8 {
        self.ticks_ahead
    }
}

/// One tick of a countdown (a lease's remaining time); stops at zero, which
/// means "expired".
pub fn count_down(remaining: &mut u8) {
    *remaining = remaining.saturating_sub(1);
}

/// One tick of an elapsed-time counter, capped at `cap`: past the cap every
/// value means the same thing to the protocol ("too late"), and capping keeps
/// the state space finite.
pub fn count_up(elapsed: &mut u8, cap: u8) {
    if *elapsed < cap {
        *elapsed += 1;
    }
}
