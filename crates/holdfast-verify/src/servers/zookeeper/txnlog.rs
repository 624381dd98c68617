//! A ZooKeeper transaction log written before the server starts, so that a
//! node begins with a child version (`cversion`) that would otherwise take
//! billions of creates to reach.
//!
//! ZooKeeper names a sequential child after its parent's `cversion`, a signed
//! 32-bit counter (`String.format("%010d", cversion)`), which wraps to
//! negative after 2^31 - 1 creates under one parent. On startup the server
//! replays its log, and a replayed create sets the parent's `cversion` to the
//! value the transaction carries. So a log that creates and deletes one child
//! with `parentCVersion = c` leaves the parent at `c`, and the live server
//! then numbers the next sequential children `c`, `c + 1`, ... across the wrap
//! exactly as it would after `c` real creates.
//!
//! The format is ZooKeeper's own (`FileTxnLog`, jute binary records): a file
//! header (`ZKLG`, version 2, dbid), then per transaction an Adler-32 of the
//! entry, the entry as a length-prefixed buffer (`TxnHeader` + the record),
//! and the end-of-record byte `B`. With no snapshot beside it the server must
//! run with `-Dzookeeper.snapshot.trust.empty=true` to replay it.

use std::path::Path;

/// Jute's `OpCode.create` and `OpCode.delete`.
const OP_CREATE: i32 = 1;
const OP_DELETE: i32 = 2;
/// `ZooDefs.Perms.ALL`.
const PERMS_ALL: i32 = 31;

/// A jute binary record under construction (big-endian, length-prefixed).
#[derive(Default)]
struct Jute(Vec<u8>);

impl Jute {
    fn int(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn long(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn bool(&mut self, v: bool) -> &mut Self {
        self.0.push(u8::from(v));
        self
    }
    fn buffer(&mut self, v: &[u8]) -> &mut Self {
        self.int(i32::try_from(v.len()).expect("jute buffer length"));
        self.0.extend_from_slice(v);
        self
    }
    fn string(&mut self, v: &str) -> &mut Self {
        self.buffer(v.as_bytes())
    }
}

/// One transaction: `TxnHeader` (clientId, cxid, zxid, time, type) + record.
fn txn(zxid: i64, op: i32, record: &Jute) -> Vec<u8> {
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0));
    let mut entry = Jute::default();
    entry.long(0).int(0).long(zxid).long(time).int(op);
    entry.0.extend_from_slice(&record.0);
    entry.0
}

/// A persistent node open to anyone (`world:anyone:cdrwa`); `parent_cversion`
/// -1 lets the server count it as one more child change.
fn create(path: &str, parent_cversion: i32) -> Jute {
    let mut r = Jute::default();
    r.string(path).buffer(b"").int(1).int(PERMS_ALL).string("world").string("anyone");
    r.bool(false).int(parent_cversion);
    r
}

/// Writes `{data_dir}/version-2/log.1`: creates `path` and its ancestors,
/// then creates and deletes one child of it carrying `parentCVersion =
/// cversion`, so the server starts with `path` empty at that child version.
pub(super) fn write_child_version_log(data_dir: &Path, path: &str, cversion: i32) -> std::io::Result<()> {
    assert!(path.starts_with('/') && !path.ends_with('/') && cversion > 0, "bad seed {path:?} {cversion}");
    let mut txns = Vec::new();
    let mut prefix = String::new();
    for segment in path[1..].split('/') {
        prefix.push('/');
        prefix.push_str(segment);
        txns.push((OP_CREATE, create(&prefix, -1)));
    }
    let seed = format!("{path}/seed");
    txns.push((OP_CREATE, create(&seed, cversion)));
    let mut delete = Jute::default();
    delete.string(&seed);
    txns.push((OP_DELETE, delete));

    let mut file = Jute::default();
    file.int(i32::from_be_bytes(*b"ZKLG")).int(2).long(0);
    for (zxid, (op, record)) in (1..).zip(txns) {
        let entry = txn(zxid, op, &record);
        file.long(i64::from(adler2::adler32_slice(&entry))).buffer(&entry);
        file.0.push(b'B');
    }
    let dir = data_dir.join("version-2");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("log.1"), file.0)
}
