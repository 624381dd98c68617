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

/// A witness of a semaphore or a read-write lock, kept outside the store:
/// holders of shared grants across processes claim files in a directory
/// with `O_EXCL`, so the files present are the holders inside.
///
/// A permit holder claims one of `permits` slot files (`slot-<i>`); if all
/// are taken, more than `permits` holders are inside. A reader creates a file
/// of its own and then looks for `writer`; a writer creates `writer` (a second
/// writer finds it present) and then looks for readers' files. Each creates
/// before it looks, so of a reader and a writer inside at once at least one
/// sees the other. Violations go to `violations`, as for [`Witness`].
#[derive(Debug, Clone)]
pub struct SharedWitness {
    dir: PathBuf,
}

/// Proof of being inside a [`SharedWitness`]; give it back to
/// [`SharedWitness::exit`].
#[derive(Debug)]
pub struct Claimed(Vec<PathBuf>);

impl SharedWitness {
    /// A witness in `dir`, created if missing.
    pub fn new(dir: impl AsRef<Path>) -> io::Result<Self> {
        fs::create_dir_all(dir.as_ref())?;
        Ok(SharedWitness { dir: dir.as_ref().to_path_buf() })
    }

    fn create(&self, name: &str) -> io::Result<bool> {
        match OpenOptions::new().write(true).create_new(true).open(self.dir.join(name)) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn violation(&self, line: &str) -> io::Result<()> {
        let mut f = OpenOptions::new().append(true).create(true).open(self.dir.join("violations"))?;
        writeln!(f, "{line}")
    }

    /// Claims `weight` of `permits` slots (call while holding the permits).
    pub fn enter_permits(&self, weight: u32, permits: u32) -> io::Result<Claimed> {
        let mut claimed = Vec::new();
        for i in 0..permits {
            if claimed.len() as u32 == weight {
                break;
            }
            let name = format!("slot-{i}");
            if self.create(&name)? {
                claimed.push(self.dir.join(name));
            }
        }
        if (claimed.len() as u32) < weight {
            self.violation(&format!("overbooked: {weight} permits wanted, only {} of {permits} free", claimed.len()))?;
        }
        Ok(Claimed(claimed))
    }

    /// Enters as a reader named `me` (unique among readers inside).
    pub fn enter_reader(&self, me: &str) -> io::Result<Claimed> {
        let name = format!("reader-{me}");
        if !self.create(&name)? {
            self.violation(&format!("reader {me} entered twice"))?;
        }
        if self.dir.join("writer").exists() {
            self.violation(&format!("reader {me} inside with a writer"))?;
        }
        Ok(Claimed(vec![self.dir.join(name)]))
    }

    /// Enters as the writer.
    pub fn enter_writer(&self) -> io::Result<Claimed> {
        if !self.create("writer")? {
            self.violation("two writers inside")?;
            return Ok(Claimed(Vec::new()));
        }
        for entry in fs::read_dir(&self.dir)? {
            if entry?.file_name().to_string_lossy().starts_with("reader-") {
                self.violation("writer inside with a reader")?;
                break;
            }
        }
        Ok(Claimed(vec![self.dir.join("writer")]))
    }

    /// Leaves: removes the files this holder claimed.
    pub fn exit(&self, claimed: Claimed) -> io::Result<()> {
        for f in claimed.0 {
            fs::remove_file(f)?;
        }
        Ok(())
    }

    /// The violations recorded (empty when all is well).
    pub fn violations(&self) -> io::Result<Vec<String>> {
        match fs::read_to_string(self.dir.join("violations")) {
            Ok(s) => Ok(s.lines().map(str::to_owned).collect()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}
