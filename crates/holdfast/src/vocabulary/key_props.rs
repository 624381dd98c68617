//! Property tests of key and TTL validation (`key.rs`): the rules in
//! [`LockKey`]'s docs, exactly, for arbitrary text.

use std::time::Duration;

use proptest::prelude::*;

use crate::vocabulary::prop_support::config;

use super::*;

/// The rule as `LockKey`'s docs state it, written out independently:
/// 1 to 256 bytes of UTF-8, none of U+0000..U+001F or U+007F..U+009F.
fn documented_rule(key: &str) -> bool {
    let forbidden = |c: char| matches!(c as u32, 0x00..=0x1F | 0x7F..=0x9F);
    (1..=256).contains(&key.len()) && !key.chars().any(forbidden)
}

/// Text around the limits: any characters (control ones often), lengths
/// around 256 bytes, multi-byte characters straddling the limit.
fn any_key() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,300}",
        "[a-z/]{250,260}",
        "[a-zé€😀]{60,140}",
        "[\\x00-\\x20\\x7e-\\xa0a]{0,8}",
        prop::collection::vec(any::<char>(), 0..80).prop_map(|c| c.into_iter().collect()),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// `LockKey::new` never panics, accepts exactly what the docs allow
    /// (its error a typed `InvalidInput` for `key`), and an accepted key's
    /// text is the input unchanged.
    #[test]
    fn keys_follow_the_documented_rule(key in any_key()) {
        match LockKey::new(key.clone()) {
            Ok(k) => {
                prop_assert!(documented_rule(&key), "accepted {:?}", key);
                prop_assert_eq!(k.as_str(), key.as_str());
                prop_assert_eq!(k.to_string(), key);
            }
            Err(Error::InvalidInput { what: "key", .. }) => prop_assert!(!documented_rule(&key), "refused {:?}", key),
            Err(other) => prop_assert!(false, "{:?} gave {:?}", key, other),
        }
    }

    /// Arbitrary bytes: those that are UTF-8 follow the same rule; the
    /// limit counts bytes, not characters.
    #[test]
    fn key_limit_counts_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(text) = String::from_utf8(bytes) {
            prop_assert_eq!(LockKey::new(text.clone()).is_ok(), documented_rule(&text), "{:?}", text);
        }
    }

    /// `check_ttl` accepts exactly `MIN_TTL..=MAX_TTL`, any duration
    /// (`Duration::MAX` included) without panicking.
    #[test]
    fn ttl_range_is_exact(secs in prop_oneof![any::<u64>(), 0u64..90_000], nanos in 0u32..1_000_000_000) {
        let ttl = Duration::new(secs, nanos);
        prop_assert_eq!(check_ttl(ttl).is_ok(), (MIN_TTL..=MAX_TTL).contains(&ttl), "{:?}", ttl);
    }

    /// Owner tokens round-trip through hex and bytes.
    #[test]
    fn tokens_round_trip(value in any::<u128>(), text in ".{0,40}") {
        let token = OwnerToken::from_bytes(value.to_be_bytes());
        prop_assert_eq!(token.as_u128(), value);
        prop_assert_eq!(OwnerToken::from_hex(&token.to_hex()), Some(token));
        if let Some(parsed) = OwnerToken::from_hex(&text) {
            prop_assert!(text.eq_ignore_ascii_case(&parsed.to_hex()), "{:?}", text);
        }
    }
}

/// The edges of the rule, spelled out.
#[test]
fn key_rule_edges() {
    assert!(LockKey::new("é".repeat(128)).is_ok(), "256 bytes");
    assert!(LockKey::new(format!("{}é", "a".repeat(255))).is_err(), "257 bytes in 256 characters");
    assert!(LockKey::new("\u{9F}").is_err() && LockKey::new("\u{A0}").is_ok());
    assert!(check_ttl(Duration::MAX).is_err() && check_ttl(MIN_TTL).is_ok() && check_ttl(MAX_TTL).is_ok());
}
