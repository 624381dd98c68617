//! The client core on simulated stores, on tokio's paused clock: seeded
//! fault runs checked by the history checker, and replay.

mod cancel;
mod mutations;
mod scenarios;
mod seeds;
mod share_mutations;
