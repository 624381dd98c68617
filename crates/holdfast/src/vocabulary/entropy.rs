//! Where the client core's randomness comes from: owner tokens, the
//! jitter of fallback polls, store-retry and release backoffs.
//!
//! Normally that is the thread-local CSPRNG. With the `simulation` feature
//! a thread may be given a seeded generator instead
//! ([`seed_this_thread`]), so that a simulated run on a single-threaded
//! runtime replays bit for bit from its seed. Nothing else changes: the
//! same code paths draw the same number of values either way.

use std::cell::RefCell;

use rand::rngs::StdRng;

thread_local! {
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's source of randomness.
pub(crate) fn with_rng<T>(f: impl FnOnce(&mut dyn rand::RngCore) -> T) -> T {
    // `f` only draws numbers: it never comes back here while the cell is borrowed.
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(seeded) => f(seeded),
        None => f(&mut rand::rng()),
    })
}

/// Makes this thread's client-core randomness a generator seeded with
/// `seed` until the returned guard is dropped, for deterministic simulation.
///
/// Owner tokens drawn from a seeded generator are predictable and repeat
/// across runs with the same seed: **never in production**. The feature
/// that exposes this (`simulation`) is off by default and is not part of
/// `all-backends`.
#[cfg(feature = "simulation")]
pub fn seed_this_thread(seed: u64) -> SeededThread {
    use rand::SeedableRng;
    SEEDED.with(|s| *s.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
    SeededThread { _not_send: std::marker::PhantomData }
}

/// Restores the thread-local CSPRNG on drop (see [`seed_this_thread`]).
#[cfg(feature = "simulation")]
#[derive(Debug)]
#[must_use = "the seed applies until this guard is dropped"]
pub struct SeededThread {
    _not_send: std::marker::PhantomData<*const ()>,
}

#[cfg(feature = "simulation")]
impl Drop for SeededThread {
    fn drop(&mut self) {
        SEEDED.with(|s| *s.borrow_mut() = None);
    }
}
