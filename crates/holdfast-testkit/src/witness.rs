//! A witness of a critical section, kept outside the lock store.
//!
//! Used by `holdfast demo`, `holdfast verify` and the conformance suite to
//! check a lock from the outside: processes that believe they hold the lock
//! [`enter`](Witness::enter) a directory on the local file system, and the
//! witness records every violation it can see: two holders inside at once, a
//! fence that did not increase, a counter that was oversold.
//!
//! The directory holds `inside` (created with `O_EXCL` on entry, removed on
//! exit: a second holder finds it present), `fences` (one line per grant, in
//! entry order) and `violations` (one line per violation).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// A critical-section witness rooted at a directory shared by all participants.
#[derive(Debug, Clone)]
pub struct Witness {
    dir: PathBuf,
}

/// What the witness saw, read back by [`Witness::report`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Entries recorded.
    pub entries: u64,
    /// Times a holder entered while another was inside.
    pub overlaps: u64,
    /// The most holders seen inside at once (1 when all is well).
    pub max_inside: u64,
    /// Whether every fence was greater than the one recorded before it.
    pub fences_increasing: bool,
    /// The last value of the shared counter.
    pub counter: i64,
}

/// Proof of being inside; [`Witness::exit`] consumes it.
#[derive(Debug)]
pub struct Inside {
    overlapped: bool,
}

impl Witness {
    /// A witness in `dir`, created if missing.
    pub fn new(dir: impl AsRef<Path>) -> io::Result<Self> {
        fs::create_dir_all(dir.as_ref())?;
        Ok(Witness { dir: dir.as_ref().to_path_buf() })
    }

    /// Starts a fresh witness with the shared counter set to `counter`.
    pub fn reset(&self, counter: i64) -> io::Result<()> {
        for f in ["inside", "fences", "violations"] {
            let _ = fs::remove_file(self.dir.join(f));
        }
        fs::write(self.dir.join("counter"), counter.to_string())
    }

    /// Records entry with `fence`. Call only while holding the lock.
    pub fn enter(&self, fence: u64) -> io::Result<Inside> {
        let overlapped = match OpenOptions::new().write(true).create_new(true).open(self.dir.join("inside")) {
            Ok(_) => false,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => true,
            Err(e) => return Err(e),
        };
        if overlapped {
            self.violation(&format!("overlap: fence {fence} entered while another holder was inside"))?;
        }
        let mut fences = OpenOptions::new().append(true).create(true).open(self.dir.join("fences"))?;
        writeln!(fences, "{fence}")?;
        Ok(Inside { overlapped })
    }

    /// Reads the shared counter (call while inside).
    pub fn counter(&self) -> io::Result<i64> {
        let mut s = String::new();
        File::open(self.dir.join("counter"))?.read_to_string(&mut s)?;
        s.trim().parse().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Writes the shared counter (call while inside).
    pub fn set_counter(&self, value: i64) -> io::Result<()> {
        let mut f = OpenOptions::new().write(true).open(self.dir.join("counter"))?;
        f.set_len(0)?;
        f.seek(SeekFrom::Start(0))?;
        write!(f, "{value}")?;
        f.sync_data()
    }

    /// Records exit.
    pub fn exit(&self, inside: Inside) -> io::Result<()> {
        if !inside.overlapped {
            fs::remove_file(self.dir.join("inside"))?;
        }
        Ok(())
    }

    fn violation(&self, line: &str) -> io::Result<()> {
        let mut f = OpenOptions::new().append(true).create(true).open(self.dir.join("violations"))?;
        writeln!(f, "{line}")
    }

    /// Reads back what was recorded.
    pub fn report(&self) -> io::Result<Report> {
        let fences: Vec<u64> = match fs::read_to_string(self.dir.join("fences")) {
            Ok(s) => s.lines().filter_map(|l| l.trim().parse().ok()).collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let overlaps = match fs::read_to_string(self.dir.join("violations")) {
            Ok(s) => s.lines().filter(|l| l.starts_with("overlap")).count() as u64,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(Report {
            entries: fences.len() as u64,
            overlaps,
            max_inside: if fences.is_empty() {
                0
            } else if overlaps > 0 {
                2
            } else {
                1
            },
            fences_increasing: fences.windows(2).all(|w| w[0] < w[1]),
            counter: self.counter()?,
        })
    }
}
