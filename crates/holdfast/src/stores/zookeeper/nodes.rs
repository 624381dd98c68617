//! The znode layout: lock key -> parent path, queue node names, node data, ACLs.
//!
//! ```text
//! {root}/{enc(key)}                    CONTAINER node, one per key (deleted by the server once empty)
//! {root}/{enc(key)}/{tag}-{token}-{seq} EPHEMERAL_SEQUENTIAL node, one per holder or waiter;
//!                                      tag: lk (exclusive), wr (writer), sh{weight} (share)
//! ```
//!
//! The queue is in sequence order while the sequences are unique, and in
//! creation order (`czxid`) past the wrap of the parent's child version (see
//! [`by_sequence`] and `docs.md`).

use zookeeper_client as zk;

use crate::backend::LeaseMode;
use crate::vocabulary::key::OwnerToken;

/// The kind of a queue node, told by its name's tag: `lk` for an exclusive
/// lease (a mutex's nodes are named as they always were), `wr` for a
/// writer, `sh{weight}` for a share (a permit or a reader). A share's limit
/// is in its data, where `resize` can change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// An exclusive lease.
    Exclusive,
    /// A read-write lock's writer.
    Writer,
    /// A share of this weight.
    Share(u32),
}

impl NodeKind {
    /// The kind of node a request in `mode` creates.
    pub fn of(mode: LeaseMode) -> Self {
        match mode {
            LeaseMode::Shared { weight, .. } => NodeKind::Share(weight),
            LeaseMode::Writer => NodeKind::Writer,
            _ => NodeKind::Exclusive,
        }
    }

    fn tag(self) -> String {
        match self {
            NodeKind::Exclusive => "lk".to_owned(),
            NodeKind::Writer => "wr".to_owned(),
            NodeKind::Share(w) => format!("sh{w}"),
        }
    }

    /// The lease mode of a node of this kind, a share's under `limit`.
    pub fn mode(self, limit: u32) -> LeaseMode {
        match self {
            NodeKind::Exclusive => LeaseMode::Exclusive,
            NodeKind::Writer => LeaseMode::Writer,
            NodeKind::Share(weight) => LeaseMode::Shared { weight, limit },
        }
    }
}

/// Encodes a lock key into one path segment: ASCII letters, digits, `-` and
/// `_` stay, every other byte of the UTF-8 becomes `%XX`. So `/`, `.`, `..`,
/// spaces and non-ASCII never reach ZooKeeper as path syntax, and two keys
/// never share a segment.
pub fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The parent (container) node of a key.
pub fn parent_path(root: &str, key: &str) -> String {
    format!("{root}/{}", encode_key(key))
}

/// The path prefix a waiter in `mode` creates its sequential node with.
pub fn node_prefix(parent: &str, token: OwnerToken, mode: LeaseMode) -> String {
    format!("{parent}/{}", node_name_prefix(token, mode))
}

/// The name prefix of `token`'s node in `mode`: `{tag}-{32 hex}-`.
pub fn node_name_prefix(token: OwnerToken, mode: LeaseMode) -> String {
    format!("{}-{}-", NodeKind::of(mode).tag(), token.to_hex())
}

/// The data stored in a queue node: the token (and a share's limit) on the
/// first line, the holder's label after it.
pub fn node_data(token: OwnerToken, mode: LeaseMode, label: &str) -> Vec<u8> {
    match mode.limit() {
        Some(limit) => format!("{} {limit}\n{label}", token.to_hex()),
        None => format!("{}\n{label}", token.to_hex()),
    }
    .into_bytes()
}

/// The label from a node's data.
pub fn label_of(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    text.split_once('\n').map(|(_, l)| l.to_owned()).unwrap_or_default()
}

/// A share's limit from its node's data.
pub fn limit_of(data: &[u8]) -> Option<u32> {
    let text = String::from_utf8_lossy(data);
    text.split('\n').next()?.split(' ').nth(1)?.parse().ok()
}

/// Whether a resize marked the node's share as holding (see
/// `admission::holding_in_queue`).
pub fn marked_of(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    text.split('\n').next().and_then(|first| first.split(' ').nth(2)) == Some("held")
}

/// The fence of a node's grant: its creation zxid, unless the node was
/// made again in place by a shrink ([`shrunk_data`]), whose data carries the
/// fence of the grant it replaced (`f=N` on the first line).
pub fn fence_of(data: &[u8], czxid: i64) -> u64 {
    let text = String::from_utf8_lossy(data);
    let carried = text.split('\n').next().and_then(|first| first.split(' ').find_map(|f| f.strip_prefix("f=")));
    carried.and_then(|f| f.parse().ok()).unwrap_or_else(|| u64::try_from(czxid).unwrap_or(0))
}

/// A node's data with its label replaced, and a share's limit and mark
/// replaced where given (a fence carried by a shrunk node stays).
pub fn rewrite(data: &[u8], limit: Option<u32>, marked: Option<bool>, label: &str) -> Vec<u8> {
    let text = String::from_utf8_lossy(data);
    let first = text.split('\n').next().unwrap_or_default();
    let token = first.split(' ').next().unwrap_or_default();
    let fence = first.split(' ').find(|f| f.starts_with("f=")).map(|f| format!(" {f}")).unwrap_or_default();
    match (limit.or_else(|| limit_of(data)), marked.unwrap_or_else(|| marked_of(data))) {
        (Some(limit), true) => format!("{token} {limit} held{fence}\n{label}"),
        (Some(limit), false) => format!("{token} {limit}{fence}\n{label}"),
        (None, _) => format!("{token}{fence}\n{label}"),
    }
    .into_bytes()
}

/// The data of the node that replaces a shrunk one: the token, the share's
/// limit, marked as holding (it was admitted), the fence of the grant it
/// replaces, and the label.
pub fn shrunk_data(token: OwnerToken, limit: u32, fence: u64, label: &str) -> Vec<u8> {
    format!("{} {limit} held f={fence}\n{label}", token.to_hex()).into_bytes()
}

/// The name of the node that replaces `name` (of `token`) in `mode`: the
/// same sequence number, so the same place in the queue while the queue is
/// ordered by sequence; `None` past the wrap (ordered by creation there, so
/// a new node would lose its place) or for a foreign name.
pub fn renamed(name: &str, token: OwnerToken, mode: LeaseMode) -> Option<String> {
    let (_, _, seq) = parse_name(name)?;
    if !(0..=LAST_ORDERED_SEQUENCE).contains(&seq) {
        return None;
    }
    let digits = name.rsplit('-').next()?;
    Some(format!("{}{digits}", node_name_prefix(token, mode)))
}

/// A queue node's kind, token (hex) and the sequence number ZooKeeper
/// appended to its name; `None` for foreign children. ZooKeeper formats its
/// signed 32-bit counter with `%010d`: `0000000042`, and past the wrap
/// `-2147483648` or `-000000042`.
pub fn parse_name(name: &str) -> Option<(NodeKind, &str, i64)> {
    let (tag, rest) = name.split_once('-')?;
    let kind = match tag {
        "lk" => NodeKind::Exclusive,
        "wr" => NodeKind::Writer,
        t => NodeKind::Share(t.strip_prefix("sh")?.parse().ok().filter(|w| *w > 0)?),
    };
    let (token, seq) = rest.split_at_checked(32)?;
    let seq = seq.strip_prefix('-')?;
    let digits = seq.strip_prefix('-').unwrap_or(seq);
    let ok = token.bytes().all(|b| b.is_ascii_hexdigit())
        && seq.len() >= 10
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit());
    if ok { Some((kind, token, seq.parse().ok()?)) } else { None }
}

/// The sequence number of a queue node's name, `None` for foreign children.
pub fn sequence_of(name: &str) -> Option<i64> {
    parse_name(name).map(|(_, _, seq)| seq)
}

/// The kind of a queue node by its name (foreign names read as exclusive).
pub fn kind_of(name: &str) -> NodeKind {
    parse_name(name).map_or(NodeKind::Exclusive, |(kind, _, _)| kind)
}

/// Whether `name` is a queue node of `token`, of any kind.
pub fn is_of_token(name: &str, token: OwnerToken) -> bool {
    parse_name(name).is_some_and(|(_, t, _)| t == token.to_hex())
}

/// How many nodes of `queue` (in grant order), from the head, hold the key
/// by the lease model's queue rule, shares read under `limit`.
pub fn admitted(queue: &[String], limit: u32) -> usize {
    crate::backend::admission::admitted_in_queue(queue.iter().map(|n| kind_of(n).mode(limit)))
}

/// The queue nodes among a parent's children (foreign names dropped), unordered.
pub fn queue_nodes(children: Vec<String>) -> Vec<String> {
    children.into_iter().filter(|c| sequence_of(c).is_some()).collect()
}

/// The last sequence number that ZooKeeper hands out only once. A parent's
/// child version is a signed 32-bit counter; ZooKeeper (3.5.5 and later)
/// never lets the committed counter decrease, so once it reaches
/// `2147483647` every later child is numbered `2147483647` again, or, for
/// creates prepared before the previous one committed, the wrapped negative
/// numbers. Below this bound sequences are unique and follow creation order.
const LAST_ORDERED_SEQUENCE: i64 = i32::MAX as i64 - 1;

/// The queue nodes among `children` in grant order by their sequence
/// numbers, when the names alone tell it (every sequence in
/// `0..=2147483646`); otherwise `Err` with the queue nodes, to be ordered
/// by creation ([`by_creation`]).
pub fn by_sequence(children: Vec<String>) -> Result<Vec<String>, Vec<String>> {
    let mut q: Vec<(i64, String)> = children.into_iter().filter_map(|c| sequence_of(&c).map(|s| (s, c))).collect();
    if q.iter().any(|(s, _)| !(0..=LAST_ORDERED_SEQUENCE).contains(s)) {
        return Err(q.into_iter().map(|(_, c)| c).collect());
    }
    q.sort();
    Ok(q.into_iter().map(|(_, c)| c).collect())
}

/// Queue nodes in grant order by creation: their `czxid`, which increases
/// with every write of the ensemble, wrap or not.
pub fn by_creation(mut nodes: Vec<(i64, String)>) -> Vec<String> {
    nodes.sort();
    nodes.into_iter().map(|(_, c)| c).collect()
}

/// ACLs of nodes holdfast creates. With credentials: the creating identity
/// (digest `user`) may do everything, anyone else may only read. Without:
/// open to anyone (ZooKeeper's `world:anyone`), as an unauthenticated session
/// has no identity to grant rights to.
pub fn acls(authenticated: bool) -> zk::Acls<'static> {
    static CREATOR_ALL_ANYONE_READ: [zk::Acl; 2] = [
        zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
        zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
    ];
    if authenticated { zk::Acls::new(&CREATOR_ALL_ANYONE_READ) } else { zk::Acls::anyone_all() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_one_safe_segment() {
        assert_eq!(encode_key("orders/42"), "orders%2F42");
        assert_eq!(encode_key(".."), "%2E%2E");
        assert_eq!(encode_key("ü"), "%C3%BC");
        assert_eq!(encode_key("a-b_C9"), "a-b_C9");
        assert_ne!(encode_key("a/b"), encode_key("a%2Fb"));
    }

    #[test]
    fn queue_order_by_sequence() {
        let t = OwnerToken::random();
        let a = format!("{}0000000010", node_name_prefix(t, LeaseMode::Exclusive));
        let b = format!("{}0000000002", node_name_prefix(OwnerToken::random(), LeaseMode::Writer));
        let q = by_sequence(vec![a.clone(), "foreign".into(), b.clone(), "lk-x".into(), "lk-".into()]);
        assert_eq!(q, Ok(vec![b.clone(), a.clone()]));
        assert_eq!(sequence_of(&a), Some(10));
        assert_eq!(label_of(&node_data(t, LeaseMode::Exclusive, "host:1")), "host:1");
        assert!(is_of_token(&a, t) && !is_of_token(&b, t));
    }

    #[test]
    fn names_and_data_tell_the_mode() {
        let t = OwnerToken::random();
        let share = LeaseMode::Shared { weight: 3, limit: 8 };
        let name = format!("{}0000000007", node_name_prefix(t, share));
        assert_eq!(parse_name(&name).map(|(k, _, s)| (k, s)), Some((NodeKind::Share(3), 7)));
        assert_eq!(kind_of(&name).mode(8), share);
        let data = node_data(t, share, "me\nand more");
        assert_eq!((limit_of(&data), label_of(&data)), (Some(8), "me\nand more".to_owned()));
        let resized = rewrite(&data, Some(5), Some(true), "you");
        assert_eq!((limit_of(&resized), label_of(&resized), marked_of(&resized)), (Some(5), "you".to_owned(), true));
        let relabelled = rewrite(&resized, None, None, "them");
        assert_eq!((limit_of(&relabelled), marked_of(&relabelled)), (Some(5), true));
        assert!(!marked_of(&data));
        // A shrunk node keeps its place and carries its grant's fence through rewrites.
        let writer = format!("{}0000000042", node_name_prefix(t, LeaseMode::Writer));
        let read = LeaseMode::Shared { weight: 1, limit: 8 };
        let reader = renamed(&writer, t, read).expect("an ordered name");
        assert_eq!((kind_of(&reader), sequence_of(&reader)), (NodeKind::Share(1), Some(42)));
        let shrunk = shrunk_data(t, 8, 77, "me");
        assert_eq!((fence_of(&shrunk, 99), limit_of(&shrunk), marked_of(&shrunk)), (77, Some(8), true));
        assert_eq!(fence_of(&rewrite(&shrunk, Some(4), Some(false), "you"), 99), 77);
        assert_eq!(fence_of(&data, 99), 99, "an unshrunk node's fence is its czxid");
        assert_eq!(renamed(&format!("{}2147483647", node_name_prefix(t, LeaseMode::Writer)), t, read), None);
        assert_eq!(limit_of(&node_data(t, LeaseMode::Exclusive, "x 9")), None);
        for bad in ["sh0-", "sh-", "shx-", "xx-"] {
            assert_eq!(parse_name(&format!("{bad}{}-0000000001", t.to_hex())), None, "{bad}");
        }
        let q: Vec<String> = [share, share, LeaseMode::Writer, share]
            .iter()
            .map(|m| format!("{}0000000001", node_name_prefix(OwnerToken::random(), *m)))
            .collect();
        assert_eq!(admitted(&q, 8), 2);
        assert_eq!(admitted(&q, 5), 1);
    }

    /// The names ZooKeeper writes at and past the wrap of a parent's child
    /// version (`%010d` of a signed 32-bit counter) are recognised, and none
    /// of them is ordered by its number: a new node named `2147483647` or
    /// `-2147483645` must not sort ahead of the holder.
    #[test]
    fn names_past_the_wrap_are_ordered_by_creation() {
        let name = |seq: &str| format!("{}{seq}", node_name_prefix(OwnerToken::random(), LeaseMode::Exclusive));
        let holder = name("2147483646");
        assert_eq!(sequence_of(&holder), Some(2_147_483_646));
        for (seq, n) in [
            ("2147483647", 2_147_483_647),
            ("-2147483648", -2_147_483_648),
            ("-2147483645", -2_147_483_645),
            ("-000000042", -42),
            ("0000000000", 0),
        ] {
            assert_eq!(sequence_of(&name(seq)), Some(n), "{seq}");
        }
        for bad in ["-", "--1", "000000001", "-00000001x", "0000000001-"] {
            assert_eq!(sequence_of(&name(bad)), None, "{bad}");
        }
        for past in ["2147483647", "-2147483648", "-2147483645"] {
            let late = name(past);
            let children = vec![late.clone(), holder.clone()];
            assert_eq!(by_sequence(children), Err(vec![late.clone(), holder.clone()]), "{past}");
            // By creation (czxid) the holder comes first, whatever the names say.
            assert_eq!(by_creation(vec![(9, late.clone()), (7, holder.clone())]), vec![holder.clone(), late]);
        }
        assert!(by_sequence(vec![holder, name("0000000003")]).is_ok());
    }
}
