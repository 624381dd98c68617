//! The conformance suite C1..C11 against every enabled store, one test per clause.

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
