//! Examples of `holdfast-lock` a user would copy, in `examples/`:
//! `cron_job` (a scheduled job run by one instance at a time), `flash_sale`
//! (stock sold once under per-item locks) and `web_handler` (a request
//! handler that refuses a second copy of the same work). Each runs against
//! SQLite in a temporary directory:
//!
//! ```text
//! cargo run -p holdfast-examples --example cron_job
//! ```
//!
//! This library is empty: a package needs a target of its own, and the
//! examples are the point.
