//! The etcd requests of the lock recipe: key layout and the transactions.
//!
//! Layout: a lock `K` owns the prefix `{prefix}{enc(K)}/` and each waiter or
//! holder one key under it, `{prefix}{enc(K)}/{token hex}`, attached to the
//! client's session lease, with the holder's label as value. `enc` escapes
//! `%` and `/`, so that the prefix of lock `a` never covers lock `a/b`.
//! The key with the lowest create revision holds the lock; its create
//! revision is the fence (etcd's revision is global and never reused).

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

use crate::key::{LockKey, OwnerToken};

/// The prefix under which the waiters of `key` live.
pub(super) fn lock_prefix(namespace: &str, key: &LockKey) -> Vec<u8> {
    let mut p = String::with_capacity(namespace.len() + key.as_str().len() + 1);
    p.push_str(namespace);
    for c in key.as_str().chars() {
        match c {
            '%' => p.push_str("%25"),
            '/' => p.push_str("%2F"),
            c => p.push(c),
        }
    }
    p.push('/');
    p.into_bytes()
}

/// The key of one waiter (or the holder) under a lock prefix.
pub(super) fn own_key(prefix: &[u8], token: OwnerToken) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(token.to_hex().as_bytes());
    k
}

fn by_create(order: SortOrder) -> GetOptions {
    GetOptions::new().with_prefix().with_sort(SortTarget::Create, order)
}

/// One attempt without waiting: put our key only if the lock's prefix is
/// empty; otherwise read the holder (which may be us, on a retried request).
pub(super) fn try_acquire(prefix: &[u8], own: &[u8], label: &str, lease: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(prefix.to_vec(), CompareOp::Equal, 0).with_prefix()])
        .and_then([TxnOp::put(own.to_vec(), label, Some(PutOptions::new().with_lease(lease)))])
        .or_else([TxnOp::get(prefix.to_vec(), Some(by_create(SortOrder::Ascend).with_limit(1)))])
}

/// Joins the queue: put our key unless it exists (a retried request), and
/// read the two newest keys, which are ours and our predecessor's.
pub(super) fn enqueue(prefix: &[u8], own: &[u8], label: &str, lease: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(own.to_vec(), CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(own.to_vec(), label, Some(PutOptions::new().with_lease(lease))),
            TxnOp::get(prefix.to_vec(), Some(by_create(SortOrder::Descend).with_limit(2))),
        ])
        .or_else([TxnOp::get(own.to_vec(), None)])
}

/// Our key (does it still exist?) and our predecessor: the newest key
/// created before ours.
pub(super) fn position(prefix: &[u8], own: &[u8], my_rev: i64) -> Txn {
    Txn::new().and_then([
        TxnOp::get(own.to_vec(), None),
        TxnOp::get(
            prefix.to_vec(),
            Some(by_create(SortOrder::Descend).with_max_create_revision(my_rev - 1).with_limit(1)),
        ),
    ])
}

/// The header revision of a transaction's response.
pub(super) fn revision(resp: &TxnResponse) -> i64 {
    resp.header().map(|h| h.revision()).unwrap_or(0)
}

/// The key-values read by the `n`-th operation of a transaction, if it was a get.
pub(super) fn kvs(resp: &TxnResponse, n: usize) -> Vec<KeyValue> {
    match resp.op_responses().into_iter().nth(n) {
        Some(TxnOpResponse::Get(mut g)) => g.take_kvs(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_never_nest() {
        let a = lock_prefix("holdfast/", &LockKey::new("a").unwrap());
        let ab = lock_prefix("holdfast/", &LockKey::new("a/b").unwrap());
        let pct = lock_prefix("holdfast/", &LockKey::new("a%2Fb").unwrap());
        assert_eq!(a, b"holdfast/a/");
        assert_eq!(ab, b"holdfast/a%2Fb/");
        assert_eq!(pct, b"holdfast/a%252Fb/");
        assert!(!ab.starts_with(&a) && !pct.starts_with(&ab));
    }
}
