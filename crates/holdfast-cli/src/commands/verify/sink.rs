//! Where records go: appended to `history.jsonl` as they come, kept in
//! memory for the checker, and folded into the parent's view of who holds
//! the lock now (which the fault injector aims at).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::{Arc, Mutex};

use super::record::Record;

/// A lane's current grant, as its worker reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// The worker's process id.
    pub pid: u32,
    /// The grant's fence.
    pub fence: u64,
    /// Whether it holds the key alone (a shared holder writes nothing to
    /// the register, so a pause cannot be aimed at its write).
    pub exclusive: bool,
}

#[derive(Debug)]
struct Inner {
    file: BufWriter<File>,
    records: Vec<Record>,
    holding: BTreeMap<u32, Holding>,
}

/// The run's history, shared by the parent's tasks.
#[derive(Debug, Clone)]
pub struct Sink {
    inner: Arc<Mutex<Inner>>,
}

impl Sink {
    /// A history written to `file`.
    pub fn new(file: File) -> Self {
        let inner = Inner { file: BufWriter::new(file), records: Vec::new(), holding: BTreeMap::new() };
        Sink { inner: Arc::new(Mutex::new(inner)) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends a record.
    pub fn push(&self, record: Record) {
        let mut inner = self.lock();
        match &record {
            Record::Grant { lane, pid, fence, hold, .. } => {
                let exclusive = hold.is_exclusive();
                inner.holding.insert(*lane, Holding { pid: *pid, fence: *fence, exclusive });
            }
            Record::Lost { lane, fence, .. } | Record::Release { lane, fence, .. }
                if inner.holding.get(lane).is_some_and(|h| h.fence == *fence) =>
            {
                inner.holding.remove(lane);
            }
            Record::Exit { lane, pid, .. } if inner.holding.get(lane).is_some_and(|h| h.pid == *pid) => {
                inner.holding.remove(lane);
            }
            _ => {}
        }
        if let Ok(line) = serde_json::to_string(&record) {
            let _ = writeln!(inner.file, "{line}");
        }
        inner.records.push(record);
    }

    /// The lanes that hold a grant now, by their workers' last word.
    pub fn holders(&self) -> Vec<(u32, Holding)> {
        self.lock().holding.iter().map(|(l, h)| (*l, *h)).collect()
    }

    /// Whether worker `pid` holds a grant now.
    pub fn holds(&self, pid: u32) -> bool {
        self.lock().holding.values().any(|h| h.pid == pid)
    }

    /// Every record so far, in the order they came (for the progress line).
    pub fn snapshot(&self) -> Vec<Record> {
        self.lock().records.clone()
    }

    /// Every record so far, sorted by time, and the file flushed.
    pub fn finish(&self) -> std::io::Result<Vec<Record>> {
        let mut inner = self.lock();
        inner.file.flush()?;
        let mut records = inner.records.clone();
        records.sort_by_key(Record::t);
        Ok(records)
    }
}
