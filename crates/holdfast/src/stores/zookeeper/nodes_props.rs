//! Property tests of the queue node names and data (`nodes.rs`): sequence
//! parsing, grant order across the wrap of the parent's signed 32-bit child
//! counter, and the data's limit, mark and label.

use proptest::prelude::*;

use crate::backend::prop_modes::any_mode;
use crate::vocabulary::prop_support::config;

use super::nodes::*;
use crate::backend::LeaseMode;
use crate::vocabulary::key::OwnerToken;

/// A queue node's name as ZooKeeper writes it: our prefix, then the parent's
/// child counter formatted with Java's `%010d` (which Rust's `{:010}` matches,
/// sign inside the width: `-000000042`).
fn node_name(token: OwnerToken, mode: LeaseMode, seq: i32) -> String {
    format!("{}{seq:010}", node_name_prefix(token, mode))
}

/// The sequence number ZooKeeper gives the `i`-th child created after the
/// counter stood at `start`: before 3.5.5 the counter wraps to negative
/// numbers; since, it stays at `i32::MAX` once there (see
/// `LAST_ORDERED_SEQUENCE`).
fn sequence_at(start: i32, i: usize, saturating: bool) -> i32 {
    let i = i as i32;
    if saturating { start.saturating_add(i) } else { start.wrapping_add(i) }
}

/// The grant order the store computes: by name while the names tell it,
/// else by creation (`czxid`, looked up for each node).
fn grant_order(children: Vec<String>, czxid_of: impl Fn(&str) -> i64) -> Vec<String> {
    match by_sequence(children) {
        Ok(queue) => queue,
        Err(nodes) => by_creation(nodes.into_iter().map(|n| (czxid_of(&n), n)).collect()),
    }
}

/// A start of the counter: anywhere, or within a few creates of either end
/// of the ordered range, where the wrap cases are.
fn any_start() -> impl Strategy<Value = i32> {
    prop_oneof![any::<i32>(), (i32::MAX - 40)..=i32::MAX, i32::MIN..=(i32::MIN + 40), -40..=40i32,]
}

/// Names that are almost queue node names: a real one with one byte
/// replaced, cut short, or with a suffix added, and free text.
fn malformed_name() -> impl Strategy<Value = String> {
    let real = || {
        (any::<u128>(), any_mode(), any::<i32>())
            .prop_map(|(t, m, s)| node_name(OwnerToken::from_bytes(t.to_be_bytes()), m, s))
    };
    prop_oneof![
        ".*",
        (real(), any::<prop::sample::Index>(), any::<char>()).prop_map(|(name, at, c)| {
            let mut chars: Vec<char> = name.chars().collect();
            let at = at.index(chars.len());
            chars[at] = c;
            chars.into_iter().collect()
        }),
        (real(), any::<prop::sample::Index>()).prop_map(|(name, at)| name[..at.index(name.len())].to_owned()),
        (real(), "[-0-9a-zé]{0,14}").prop_map(|(name, tail)| format!("{name}{tail}")),
        "(lk|wr|sh[0-9]{0,3})-[0-9a-f]{30,34}-{1,2}[0-9]{0,12}",
    ]
}

proptest! {
    #![proptest_config(config())]

    /// parse(format(n)) == n: every kind, token and 32-bit sequence (the
    /// wrapped negative ones included) reads back as written.
    #[test]
    fn names_read_back_as_written(token in any::<u128>(), mode in any_mode(), seq in any::<i32>()) {
        let token = OwnerToken::from_bytes(token.to_be_bytes());
        let name = node_name(token, mode, seq);
        let hex = token.to_hex();
        prop_assert_eq!(parse_name(&name), Some((NodeKind::of(mode), hex.as_str(), i64::from(seq))), "{}", name);
        prop_assert_eq!(sequence_of(&name), Some(i64::from(seq)));
        prop_assert_eq!(kind_of(&name), NodeKind::of(mode));
        prop_assert!(is_of_token(&name, token));
        prop_assert_eq!(queue_nodes(vec![name.clone()]), vec![name]);
    }

    /// Malformed names never panic; a name that does parse has a 32-digit
    /// hex token and ends in the digits of the sequence it read.
    #[test]
    fn malformed_names_never_panic(name in malformed_name()) {
        let parsed = parse_name(&name);
        let _ = (kind_of(&name), sequence_of(&name), queue_nodes(vec![name.clone()]));
        if let Some((kind, token, seq)) = parsed {
            prop_assert_eq!(token.len(), 32);
            prop_assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
            prop_assert!(name.ends_with(&seq.unsigned_abs().to_string()), "{} read as {}", name, seq);
            prop_assert!(!matches!(kind, NodeKind::Share(0)));
        }
    }

    /// Nodes created one after another, from any counter start (within a
    /// few of the wrap, or past it), listed in any order and mixed with
    /// foreign children, are granted in creation order, whether the counter
    /// wraps or saturates at `i32::MAX`.
    #[test]
    fn queue_is_in_creation_order_across_the_wrap(
        start in any_start(),
        modes in prop::collection::vec(any_mode(), 1..12),
        saturating in any::<bool>(),
        foreign in prop::collection::vec("[a-z]{0,6}(-[0-9]{0,10})?", 0..3),
        shuffle_seed in any::<u64>(),
    ) {
        let created: Vec<String> = modes
            .iter()
            .enumerate()
            .map(|(i, mode)| node_name(OwnerToken::random(), *mode, sequence_at(start, i, saturating)))
            .collect();
        // The order a child listing comes in is arbitrary: a seeded shuffle.
        let mut listed: Vec<String> = created.iter().cloned().chain(foreign).collect();
        let mut state = shuffle_seed | 1;
        for i in (1..listed.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            listed.swap(i, (state % (i as u64 + 1)) as usize);
        }
        // czxid grows with every write of the ensemble, wrap or not.
        let czxid_of = |name: &str| 1_000 + created.iter().position(|c| c == name).expect("a created node") as i64;
        prop_assert_eq!(grant_order(listed, czxid_of), created);
    }

    /// `by_sequence` answers by name only when every sequence is in the
    /// ordered range, and then sorted; otherwise it hands back exactly the
    /// queue nodes.
    #[test]
    fn by_sequence_orders_only_unambiguous_queues(seqs in prop::collection::vec(any::<i32>(), 0..10)) {
        let names: Vec<String> =
            seqs.iter().map(|s| node_name(OwnerToken::random(), LeaseMode::Exclusive, *s)).collect();
        let ordered = seqs.iter().all(|s| (0..i32::MAX).contains(s));
        match by_sequence(names.clone()) {
            Ok(queue) => {
                prop_assert!(ordered, "{:?} ordered by name", seqs);
                let got: Vec<i64> = queue.iter().map(|n| sequence_of(n).expect("queue node")).collect();
                prop_assert!(got.windows(2).all(|w| w[0] <= w[1]), "{:?}", got);
                prop_assert_eq!(queue.len(), names.len());
            }
            Err(nodes) => {
                prop_assert!(!ordered, "{:?} not ordered by name", seqs);
                prop_assert_eq!(nodes, names);
            }
        }
    }

    /// A node's data gives back its limit and label; a rewrite changes only
    /// what it is asked to. Arbitrary bytes never panic the readers.
    #[test]
    fn node_data_round_trips(
        token in any::<u128>(),
        mode in any_mode(),
        label in ".*",
        new_label in ".*",
        new_limit in prop::option::of(1u32..),
        mark in prop::option::of(any::<bool>()),
        junk in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let token = OwnerToken::from_bytes(token.to_be_bytes());
        let data = node_data(token, mode, &label);
        prop_assert_eq!(limit_of(&data), mode.limit());
        prop_assert_eq!(label_of(&data), label);
        prop_assert!(!marked_of(&data));
        let rewritten = rewrite(&data, new_limit, mark, &new_label);
        prop_assert_eq!(label_of(&rewritten), new_label);
        match mode.limit() {
            Some(limit) => {
                prop_assert_eq!(limit_of(&rewritten), Some(new_limit.unwrap_or(limit)));
                prop_assert_eq!(marked_of(&rewritten), mark.unwrap_or(false));
            }
            None if new_limit.is_none() => prop_assert_eq!(limit_of(&rewritten), None),
            None => {}
        }
        prop_assert!(rewritten.starts_with(token.to_hex().as_bytes()));
        let _ = (limit_of(&junk), label_of(&junk), marked_of(&junk), rewrite(&junk, new_limit, mark, "x"));
    }
}
