//! The exit codes of `holdfast`, in one table.
//!
//! | code | name | when |
//! |---:|---|---|
//! | 0 | ok | the command did what was asked; `run`: CMD exited 0 |
//! | *n* | CMD's status | `run`: CMD exited with *n*; killed by signal *s*: 128 + *s* (as shells report it) |
//! | 1 | invariant broken | `demo`: oversold, two holders inside at once, or fences not increasing; `verify`: a guarantee the store states broke (double grant, fence repeated or backwards, stale write accepted, a killed holder's key free longer than TTL + 1 s) |
//! | 64 | usage | bad flag, bad duration, empty or oversized key or prefix, TTL out of range, malformed or unknown backend URL, a `--kill-after` that does not fit the lease, a busy `--metrics-addr`, `release` without `--force` |
//! | 69 | store unavailable | the lock store failed or could not be reached |
//! | 70 | internal | a bug in holdfast; please report it |
//! | 74 | lease lost | `run`: the lease ran out (or could no longer be renewed in time) while CMD ran; CMD was sent SIGTERM, then SIGKILL after `--kill-after`, before the store could grant the lock to anyone else |
//! | 75 | lock busy | `run`: the lock was still held by someone else when `--wait` ran out (`--wait 0`: at the first try); `--busy-exit CODE` makes it CODE |
//! | 126 | not executable | `run`: CMD was found but could not be executed (as in shells) |
//! | 127 | not found | `run`: CMD was not found (as in shells) |
//! | 128 + *s* | signal | `run`: holdfast got signal *s* (SIGINT, SIGTERM, SIGHUP) while waiting for the lock |
//!
//! Codes 64..78 follow BSD `sysexits.h` (`EX_USAGE`, `EX_UNAVAILABLE`,
//! `EX_SOFTWARE`, `EX_IOERR`, `EX_TEMPFAIL`: "try again later"). As with
//! `timeout(1)`, a CMD that exits with one of holdfast's own codes cannot be
//! told apart from holdfast by the code alone; the one-line message on stderr
//! tells.

use std::fmt;

/// Success.
pub const OK: u8 = 0;
/// `demo`: an invariant was broken (oversold, overlap, fences out of order);
/// `verify`: a guarantee the store states broke.
pub const INVARIANT_BROKEN: u8 = 1;
/// Bad command line or input rejected before any I/O (`EX_USAGE`).
pub const USAGE: u8 = 64;
/// The store failed or is unreachable (`EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// An internal error, a bug (`EX_SOFTWARE`).
pub const INTERNAL: u8 = 70;
/// `run`: the lease was lost while the command ran.
pub const LEASE_LOST: u8 = 74;
/// `run`: the lock stayed busy past `--wait` (`EX_TEMPFAIL`).
pub const BUSY: u8 = 75;
/// `run`: the command could not be executed.
pub const NOT_EXECUTABLE: u8 = 126;
/// `run`: the command was not found.
pub const NOT_FOUND: u8 = 127;

/// The exit-code table as shown at the end of `holdfast --help`.
pub const HELP_TABLE: &str = "\
Exit codes:
    0      ok (run: CMD exited 0)
    n      run: CMD's own exit status; 128+s if CMD was killed by signal s
    1      demo: an invariant broke (oversold, overlap, fences not increasing);
           verify: a guarantee the store states broke (see its report)
    64     usage: bad flag, duration, key, TTL, backend URL, --kill-after that
           does not fit the lease, busy --metrics-addr; release without --force
    69     the lock store failed or is unreachable
    70     internal error (a bug)
    74     run: the lease was lost while CMD ran (CMD got SIGTERM, then SIGKILL)
    75     run: the lock was busy until --wait ran out (--busy-exit CODE: CODE)
    126    run: CMD is not executable
    127    run: CMD not found
    128+s  run: holdfast got signal s while waiting for the lock

Environment:
    HOLDFAST_BACKEND  store URL when --backend is not given
                      (default: sqlite://$XDG_STATE_HOME/holdfast/locks.db)
    RUST_LOG          log filter for stderr (default: error; RUST_LOG=warn adds the
                      library's warnings, such as failed renewals)";

/// A failure: the exit code and the one line printed as `holdfast: {message}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The exit code, from this module's table.
    pub code: u8,
    /// What went wrong, in one line.
    pub message: String,
}

impl Failure {
    /// A failure with `code`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure { code, message: message.into() }
    }

    /// A usage failure (64).
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(USAGE, message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<holdfast::Error> for Failure {
    fn from(e: holdfast::Error) -> Self {
        use holdfast::Error as E;
        let code = match &e {
            E::InvalidInput { .. } | E::Unsupported { .. } | E::FeatureDisabled { .. } | E::Conflict { .. } => USAGE,
            E::Backend { .. } => UNAVAILABLE,
            E::Timeout { .. } => BUSY,
            E::Lost { .. } => LEASE_LOST,
            _ => INTERNAL,
        };
        // A store error's message is complete (store, endpoint, cause, what
        // to do); its sources are the client library's words, said already.
        let message = if code == UNAVAILABLE { e.to_string() } else { error_chain(&e) };
        Failure::new(code, one_line(&message))
    }
}

/// A command-line error in holdfast's one style: `holdfast: WHAT` on one
/// line, and where it helps a `hint: ...` line (clap's tip, or which
/// `--help` to read), instead of clap's multi-line `error:` block.
pub fn clap_error(e: &clap::Error) -> String {
    use clap::error::ErrorKind as K;
    let text = e.render().to_string();
    let mut lines = text.lines();
    let mut what = lines.next().unwrap_or_default().trim_start_matches("error: ").trim().to_owned();
    if e.kind() == K::DisplayHelpOnMissingArgumentOrSubcommand {
        // clap would print the whole help; its first line is the about text.
        what = "no subcommand given".to_owned();
    }
    let mut tip = None;
    let mut usage = None;
    let mut in_block = true;
    for line in lines {
        let line = line.trim();
        if line.is_empty() {
            in_block = false;
        } else if in_block && !line.starts_with("tip:") {
            // The first block's indented lines belong to the message
            // (`the following required arguments were not provided:` and the list).
            what.push(' ');
            what.push_str(line);
        }
        if let Some(t) = line.strip_prefix("tip: ") {
            tip.get_or_insert_with(|| t.to_owned());
        } else if let Some(u) = line.strip_prefix("Usage: ") {
            // `holdfast run [OPTIONS] --key <KEY>`: the command path is the plain words.
            let path: Vec<&str> = u.split_whitespace().take_while(|w| !w.starts_with(['[', '<', '-'])).collect();
            usage.get_or_insert_with(|| path.join(" "));
        }
    }
    let help_hint = match e.kind() {
        K::InvalidValue | K::ValueValidation | K::InvalidUtf8 => None,
        _ => usage.filter(|p| !p.is_empty()).map(|p| format!("see '{p} --help'")),
    };
    match tip.or(help_hint) {
        Some(hint) => format!("holdfast: {}\nhint: {hint}", one_line(&what)),
        None => format!("holdfast: {}", one_line(&what)),
    }
}

/// The error and its sources, joined by `": "`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let text = src.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = src.source();
    }
    s
}

/// Collapses whitespace runs (newlines included) so a message stays on one line.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_errors_map_to_the_table() {
        assert_eq!(Failure::from(holdfast::Error::invalid("key", "empty")).code, USAGE);
        assert_eq!(Failure::from(holdfast::Error::backend("sqlite", true, "down")).code, UNAVAILABLE);
        let timeout = holdfast::Error::Timeout { key: "k".into(), waited: std::time::Duration::from_secs(1) };
        assert_eq!(Failure::from(timeout).code, BUSY);
        assert_eq!(Failure::from(holdfast::Error::Lost { key: "k".into() }).code, LEASE_LOST);
    }

    #[test]
    fn messages_are_one_line() {
        assert_eq!(one_line("a\n  b\tc"), "a b c");
    }
}
