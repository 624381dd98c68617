//! Test kit of holdfast: real store servers on loopback in temp dirs
//! ([`servers`]), and the conformance suite every backend runs
//! ([`conformance`], clauses C1..C17 and the fault clauses), the fault
//! injection those use ([`faults`]: a TCP proxy, a cancellation harness),
//! and a [`witness`] of critical sections kept outside the store (also used
//! by `holdfast demo`).
//!
//! Not a stable API: it exists for holdfast's own tests.

pub mod conformance;
pub mod faults;
pub mod history;
pub mod servers;
pub mod sim;
pub mod witness;
