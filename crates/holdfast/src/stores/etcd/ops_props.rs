//! Property tests of the etcd store's key layout and queue entry values
//! (`ops.rs`): lock prefixes never nest, and an entry's value reads back
//! as written; arbitrary keys and values never panic the reader.

use proptest::prelude::*;

use crate::backend::prop_modes::any_mode;
use crate::vocabulary::prop_support::config;

use super::ops::*;
use crate::backend::LeaseMode;
use crate::vocabulary::key::{LockKey, OwnerToken};

/// Key text rich in the characters the prefix escapes (`/`, `%`) and in
/// escapes themselves.
fn key_text() -> impl Strategy<Value = String> {
    prop_oneof!["[a/%2F5]{1,8}", "[a-z/%]{1,12}(%2F|%25)?[a-z/]{0,4}"]
}

fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..=max).prop_map(|chars| chars.into_iter().collect())
}

proptest! {
    #![proptest_config(config())]

    /// Two different keys' prefixes never nest (a prefix read of one never
    /// sees the other's waiters), and each lies under the namespace.
    #[test]
    fn lock_prefixes_never_nest(a in key_text(), b in key_text(), namespace in "[a-z/]{0,6}") {
        let (ka, kb) = (LockKey::new(a.clone()).expect("key"), LockKey::new(b.clone()).expect("key"));
        let (pa, pb) = (lock_prefix(&namespace, &ka), lock_prefix(&namespace, &kb));
        prop_assert!(pa.starts_with(namespace.as_bytes()) && pa.ends_with(b"/"));
        if a == b {
            prop_assert_eq!(pa, pb);
        } else {
            prop_assert!(!pa.starts_with(&pb) && !pb.starts_with(&pa), "{:?} and {:?} nest", a, b);
        }
    }

    /// The value `entry_value` writes under `own_key` reads back as the
    /// same mode, label and (for a share) mark; and so does the value
    /// `rewritten_value` writes when a key is shrunk to a share in place
    /// (a writer's or a mutex's key keeps its name). Labels never hold a
    /// NUL (`check_label` refuses it before any I/O).
    #[test]
    fn entries_read_back_as_written(
        token in any::<u128>(),
        mode in any_mode(),
        shrunk_to in any_mode(),
        label in text(24).prop_map(|l| l.replace('\0', "")),
        marked in any::<bool>(),
    ) {
        let token = OwnerToken::from_bytes(token.to_be_bytes());
        let key = own_key(b"holdfast/k/", token, mode);
        prop_assert!(key.starts_with(b"holdfast/k/"));
        let entry = entry_from(&key, entry_value(mode, &label, marked).as_bytes());
        prop_assert_eq!(entry.mode, mode);
        prop_assert_eq!(&entry.label, &label);
        prop_assert_eq!(entry.marked, marked && mode.limit().is_some());
        if let Ok(smaller) = crate::backend::admission::shrunk(mode, shrunk_to) {
            let entry = entry_from(&key, rewritten_value(&key, smaller, &label, marked).as_bytes());
            prop_assert_eq!((entry.mode, entry.label, entry.marked), (smaller, label, marked));
        }
    }

    /// Arbitrary keys and values never panic the reader; a share's value
    /// that does not parse reads as exclusive, the mode that admits least,
    /// and anything that is not a share key, or a shrunk one (its value
    /// after a NUL), is never marked.
    #[test]
    fn arbitrary_entries_never_panic(
        key in prop::collection::vec(any::<u8>(), 0..40),
        suffix in prop::sample::select(vec![&b""[..], b"~s", b"~w"]),
        value in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..40),
            "\x00?[0-9 ]{0,12}(held)?\n?[a-z]{0,4}".prop_map(String::into_bytes),
        ],
    ) {
        let key = [key.as_slice(), suffix].concat();
        let entry = entry_from(&key, &value);
        if !key.ends_with(b"~s") && !is_shrunk(&value) {
            prop_assert!(!entry.marked && entry.mode.limit().is_none());
        } else if entry.mode.limit().is_none() {
            prop_assert_eq!(entry.mode, LeaseMode::Exclusive);
        }
    }
}
