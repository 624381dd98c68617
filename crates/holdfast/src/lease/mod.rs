//! Leases held by a client: the one owner of lease time. Each lease's local
//! deadline, `lost()` and `expiring()` are in [`state`]; the one renewal task
//! per client, which renews due leases in batched calls of bounded size and
//! releases a lease whose deadline passed unrenewed (a session-bound store,
//! or SQLite's session rows, would keep it), is in [`renewer`]. The renewer stands on releasing
//! (`crate::lease::release`), which stands on [`state`] alone: no circle.

#[cfg(test)]
mod drift_props;
// Only Redis hands a released lease to a waiting task of its client.
#[cfg(feature = "redis")]
pub(crate) mod handover;
pub(crate) mod lock_options;
pub(crate) mod release;
mod renewer;
pub(crate) mod state;
mod ticks;

pub(crate) use renewer::Renewer;
pub(crate) use state::drift_margin;
pub(crate) use state::{Horizon, LeaseState};
