//! The znode layout: lock key -> parent path, queue node names, node data, ACLs.
//!
//! ```text
//! {root}/{enc(key)}                    CONTAINER node, one per key (deleted by the server once empty)
//! {root}/{enc(key)}/lk-{token}-{seq}   EPHEMERAL_SEQUENTIAL node, one per holder or waiter
//! ```

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

/// The sequence number of a queue node name, `None` for foreign children.
pub fn sequence_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix(PREFIX)?;
    let (_, seq) = rest.rsplit_once('-')?;
    if seq.len() < 10 || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    seq.parse().ok()
}

/// Queue node names in queue order (lowest sequence first); foreign names dropped.
pub fn queue(children: Vec<String>) -> Vec<String> {
    let mut q: Vec<(i64, String)> = children.into_iter().filter_map(|c| sequence_of(&c).map(|s| (s, c))).collect();
    q.sort();
    q.into_iter().map(|(_, c)| c).collect()
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
        assert_eq!(queue(vec![a.clone(), "foreign".into(), b.clone(), "lk-x".into()]), vec![b, a.clone()]);
        assert_eq!(sequence_of(&a), Some(10));
        assert_eq!(label_of(&node_data(t, "host:1")), "host:1");
    }
}
