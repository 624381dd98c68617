//! The conformance suite C1..C11 against every enabled store, one test per clause.

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "sqlite")]
mod sqlite;
