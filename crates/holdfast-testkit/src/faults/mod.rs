//! Fault injection for store tests: a TCP proxy that loses, delays or
//! withholds a store's traffic on demand ([`FaultProxy`], re-exported from
//! `holdfast_verify::proxy`, where it lives for `holdfast verify`), a hostile peer
//! that answers with scripted garbage in place of a store ([`GarbagePeer`]),
//! and a harness that drops a future at each of its suspension points in
//! turn ([`cancel_at`], [`cancel_at_each_suspension`]).
//!
//! Together they reach the cases an ordinary test never meets: a request
//! the store applied whose reply was lost, a release sent to a store that
//! does not answer, a cleanup cancelled half-way, a store that hangs while a
//! client waits. The conformance clauses `f1`..`f4` and `c9_cancel_*` use
//! them on every store.

mod cancel;
mod garbage;

pub use cancel::{CancelAt, Sweep, cancel_at, cancel_at_each_suspension};
pub use garbage::{GarbagePeer, GarbageStats, Protocol, Script, Step, lookalikes};
pub use holdfast_verify::proxy::{Fault, FaultProxy, ProxyStats};
