//! The znode layout: lock key -> parent path, queue node names, node data, ACLs.
//!
//! ```text
//! {root}/{enc(key)}                    CONTAINER node, one per key (deleted by the server once empty)
//! {root}/{enc(key)}/lk-{token}-{seq}   EPHEMERAL_SEQUENTIAL node, one per holder or waiter
//! ```
//!
//! The queue is in sequence order while the sequences are unique, and in
//! creation order (`czxid`) past the wrap of the parent's child version (see
//! [`by_sequence`] and `docs.md`).

use zookeeper_client as zk;

use crate::key::OwnerToken;

/// Node-name prefix of queue nodes.
const PREFIX: &str = "lk-";

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

/// The path prefix a waiter creates its sequential node with.
pub fn node_prefix(parent: &str, token: OwnerToken) -> String {
    format!("{parent}/{}", node_name_prefix(token))
}

/// The name prefix of `token`'s node: `lk-{32 hex}-`.
pub fn node_name_prefix(token: OwnerToken) -> String {
    format!("{PREFIX}{}-", token.to_hex())
}

/// The data stored in a queue node: the token and the holder's label.
pub fn node_data(token: OwnerToken, label: &str) -> Vec<u8> {
    format!("{}\n{label}", token.to_hex()).into_bytes()
}

/// The label from a node's data.
pub fn label_of(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    text.split_once('\n').map(|(_, l)| l.to_owned()).unwrap_or_default()
}

/// The sequence number ZooKeeper appended to a queue node's name, `None`
/// for foreign children. ZooKeeper formats its signed 32-bit counter with
/// `%010d`: `0000000042`, and past the wrap `-2147483648` or `-000000042`.
pub fn sequence_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix(PREFIX)?;
    let (token, seq) = rest.split_at_checked(32)?;
    let seq = seq.strip_prefix('-')?;
    let digits = seq.strip_prefix('-').unwrap_or(seq);
    let ok = token.bytes().all(|b| b.is_ascii_hexdigit())
        && seq.len() >= 10
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit());
    if ok { seq.parse().ok() } else { None }
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
        let a = format!("{}0000000010", node_name_prefix(t));
        let b = format!("{}0000000002", node_name_prefix(OwnerToken::random()));
        let q = by_sequence(vec![a.clone(), "foreign".into(), b.clone(), "lk-x".into(), "lk-".into()]);
        assert_eq!(q, Ok(vec![b, a.clone()]));
        assert_eq!(sequence_of(&a), Some(10));
        assert_eq!(label_of(&node_data(t, "host:1")), "host:1");
    }

    /// The names ZooKeeper writes at and past the wrap of a parent's child
    /// version (`%010d` of a signed 32-bit counter) are recognised, and none
    /// of them is ordered by its number: a new node named `2147483647` or
    /// `-2147483645` must not sort ahead of the holder.
    #[test]
    fn names_past_the_wrap_are_ordered_by_creation() {
        let name = |seq: &str| format!("{}{seq}", node_name_prefix(OwnerToken::random()));
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
