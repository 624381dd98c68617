//! `sqlite://PATH[?options]` parsing.

use std::path::PathBuf;
use std::time::Duration;

use crate::vocabulary::error::{Error, Result};

use super::STORE;
use crate::backend::wait::PollBounds;
use crate::vocabulary::url_options::{Opt, UrlOptions};

/// Settings of the SQLite store, from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    /// The database file; created if missing (not its directory), unless
    /// [`must_exist`](Self::must_exist).
    pub path: PathBuf,
    /// `mode=rw`: open an existing file only, never create one (for tools
    /// that only read, so a mistyped path is an error rather than a new,
    /// empty store). Default `mode=rwc`: create the file if missing.
    pub must_exist: bool,
    /// `synchronous=full`: fsync every commit, so fences also survive an OS
    /// crash or power loss. Default `normal` (survives process crashes).
    pub synchronous_full: bool,
    /// How long a transaction waits for another process's write lock
    /// (`timeout_ms`, alias `busy_timeout_ms`).
    pub busy_timeout: Duration,
    /// Fallback poll bounds for waiters in other processes.
    pub poll: PollBounds,
}

/// The options of `sqlite://` URLs (see the "URL options" table in the store's docs).
pub(crate) const OPTIONS: &[Opt] = &[
    Opt::new("synchronous"),
    Opt::new("mode"),
    Opt::new("timeout_ms").or(&["busy_timeout_ms"]),
    Opt::new("poll_min_ms"),
    Opt::new("poll_max_ms"),
];

impl SqliteConfig {
    /// The database file, for errors.
    pub(crate) fn endpoint(&self) -> String {
        self.path.display().to_string()
    }

    /// Parses `sqlite://PATH?synchronous=full&timeout_ms=5000&poll_max_ms=10`.
    /// `sqlite:///abs/path.db` is absolute, `sqlite://rel/path.db` relative.
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url.strip_prefix("sqlite://").ok_or_else(|| {
            Error::invalid("url", format!("{:?} is not a sqlite:// URL", crate::vocabulary::url_text::redact_url(url)))
        })?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if path.is_empty() {
            return Err(Error::invalid("url", "sqlite:// needs a file path, e.g. sqlite:///var/lib/app/locks.db"));
        }
        let opts = UrlOptions::parse("sqlite", query, OPTIONS)?;
        // SQLite takes its busy timeout as a C int of milliseconds.
        const ANY_MS: std::ops::RangeInclusive<u64> = 0..=i32::MAX as u64;
        let poll = PollBounds {
            min: opts.duration_ms("poll_min_ms", ANY_MS)?.unwrap_or(Duration::from_millis(1)),
            max: opts.duration_ms("poll_max_ms", ANY_MS)?.unwrap_or(Duration::from_millis(10)),
        };
        if poll.min.is_zero() || poll.max < poll.min {
            return Err(Error::invalid("url", "need 0 < poll_min_ms <= poll_max_ms"));
        }
        Ok(SqliteConfig {
            path: PathBuf::from(path),
            must_exist: opts.choice("mode", &[("rw", true), ("rwc", false)])?.unwrap_or(false),
            synchronous_full: opts.choice("synchronous", &[("full", true), ("normal", false)])?.unwrap_or(false),
            busy_timeout: opts.duration_ms("timeout_ms", ANY_MS)?.unwrap_or(Duration::from_secs(5)),
            poll,
        })
    }

    /// Refuses a path whose directory, or under `mode=rw` whose file, does
    /// not exist, naming what is missing (SQLite itself only says it cannot
    /// open the file).
    pub(super) fn check_path(&self) -> Result<()> {
        // Say which part of the path is missing: SQLite only says it
        // cannot open the file. A directory is never created (a mistyped
        // path would quietly become a new, empty store).
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.is_dir()
        {
            return Err(Error::said(
                STORE,
                false,
                format!(
                    "{STORE} at {}: directory {} does not exist (holdfast does not create directories): create \
                     it, or fix the path",
                    self.path.display(),
                    dir.display()
                ),
            ));
        }
        if self.must_exist && !self.path.exists() {
            return Err(Error::said(
                STORE,
                false,
                format!(
                    "{STORE} at {}: no such database file (mode=rw opens an existing file only): fix the path, \
                     or take a lock on it first",
                    self.path.display()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths_and_options() {
        let c = SqliteConfig::from_url("sqlite:///tmp/x.db?synchronous=full&poll_max_ms=20").unwrap();
        assert_eq!(c.path, PathBuf::from("/tmp/x.db"));
        assert!(c.synchronous_full);
        assert_eq!(c.poll.max, Duration::from_millis(20));
        assert_eq!(SqliteConfig::from_url("sqlite://rel.db").unwrap().path, PathBuf::from("rel.db"));
        assert!(SqliteConfig::from_url("sqlite:///x.db?mode=rw").unwrap().must_exist);
        assert!(!SqliteConfig::from_url("sqlite:///x.db?mode=rwc").unwrap().must_exist);
        for bad in [
            "sqlite://",
            "sqlite:///x?nope=1",
            "sqlite:///x?synchronous=off",
            "sqlite:///x?poll_min_ms=0",
            "sqlite:///x?mode=ro",
        ] {
            assert!(matches!(SqliteConfig::from_url(bad), Err(Error::InvalidInput { .. })), "{bad}");
        }
    }

    /// Every option under its common name and under each older name: both
    /// spellings give the same config, and one that differs from the default.
    #[test]
    fn common_names_and_aliases() {
        let base = SqliteConfig::from_url("sqlite:///x.db").unwrap();
        for (old, common) in [
            ("busy_timeout_ms=700", "timeout_ms=700"),
            ("synchronous=full", "synchronous=FULL"),
            ("mode=rw", "mode=RW"),
            ("poll_min_ms=2", "poll_min_ms=2"),
            ("poll_max_ms=30", "poll_max_ms=30"),
        ] {
            let old = SqliteConfig::from_url(&format!("sqlite:///x.db?{old}")).unwrap();
            assert_eq!(old, SqliteConfig::from_url(&format!("sqlite:///x.db?{common}")).unwrap(), "{common}");
            assert_ne!(old, base, "{common} changed nothing");
        }
        let err = SqliteConfig::from_url("sqlite:///x.db?prefix=a").unwrap_err().to_string();
        assert!(err.contains("\"prefix\"") && err.contains("timeout_ms (or busy_timeout_ms)"), "{err}");
    }
}
