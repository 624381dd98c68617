//! The ground floor: the words every other floor speaks. Errors, keys and
//! owner tokens, capabilities, secrets, URL options and their redaction,
//! metric names, and the one source of randomness. Nothing here imports
//! any other floor of the crate.

pub(crate) mod capability;
#[cfg(feature = "simulation")]
pub mod entropy;
#[cfg(not(feature = "simulation"))]
pub(crate) mod entropy;
pub(crate) mod error;
pub(crate) mod key;
pub mod metrics;
#[cfg(test)]
pub(crate) mod prop_support;
pub(crate) mod secret;
pub(crate) mod store_error;
pub(crate) mod url_options;
pub(crate) mod url_text;
