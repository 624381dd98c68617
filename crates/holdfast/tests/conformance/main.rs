//! The conformance suite C1..C11 against every enabled store, one test per clause.

#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "zookeeper")]
mod zookeeper;
