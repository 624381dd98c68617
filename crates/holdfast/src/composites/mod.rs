//! The composites: stores built from other stores through the contract
//! alone ([`Backend`](crate::backend::Backend)). They open their members'
//! URLs with the [`ConnectFn`](crate::backend::ConnectFn) the registry hands
//! them, so that no composite imports a store or the registry.

pub mod fallback;
pub mod layered;
pub mod redlock;
pub(crate) mod url;
