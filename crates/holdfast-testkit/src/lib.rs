//! Test kit of holdfast: real store servers on loopback in temp dirs
//! ([`servers`]), and the conformance suite every backend runs
//! ([`conformance`], clauses C1..C17 and the fault clauses), the fault
//! injection those use ([`faults`]: a TCP proxy, a cancellation harness),
//! a simulated store ([`sim`]) checked by the [`history`] checker, and a
//! [`witness`] of critical sections kept outside the store.
//!
//! [`servers`], [`history`], [`witness`] and the fault proxy live in
//! `holdfast-verify`, the engine of `holdfast verify` and `holdfast demo`
//! (which ship in the CLI, so they are built without `simulation`); they are
//! re-exported here under their old paths.
//!
//! Not a stable API: it exists for holdfast's own tests.

pub mod admission_cases;
pub mod conformance;
pub mod faults;
pub mod sim;

pub use holdfast_verify::{history, servers, witness};
