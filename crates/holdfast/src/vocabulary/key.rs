//! Lock keys, owner tokens and the limits on TTLs, checked before any I/O.

use std::fmt;
use std::time::Duration;

use crate::vocabulary::error::{Error, Result};

/// Longest key accepted, in bytes of UTF-8.
///
/// Long enough for any path-like name, short enough to fit every store's
/// key limits once a backend adds its own prefix (ZooKeeper paths, etcd keys,
/// an indexed `VARCHAR` in MySQL).
pub(crate) const MAX_KEY_BYTES: usize = 256;

/// Shortest lease TTL accepted.
///
/// Renewal runs every `ttl / 3` by default; below this the renewal round trip
/// itself would eat most of the lease.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(50);

/// Longest lease TTL accepted. A lease lives longer than this only by renewal,
/// so a holder that dies frees the key within a day at the very worst.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Longest holder label accepted, in bytes of UTF-8: a client's label
/// ([`ClientOptions::label`](crate::ClientOptions::label)) or an election's
/// value ([`MAX_ELECTION_VALUE_BYTES`](crate::MAX_ELECTION_VALUE_BYTES)).
/// Every store keeps it with the grant, and beyond some size each refuses it
/// its own way, after I/O: etcd's request limit, ZooKeeper's `jute.maxbuffer`
/// (about 1 MiB, past which the server drops the connection and with it the
/// client's session and every lease on it).
pub(crate) const MAX_LABEL_BYTES: usize = 4096;

/// Checks a holder label (`what`: `label`, or `value` for an election's):
/// at most [`MAX_LABEL_BYTES`] bytes, no NUL (PostgreSQL's `text` cannot hold one).
pub(crate) fn check_label(label: &str, what: &'static str) -> Result<()> {
    if label.len() > MAX_LABEL_BYTES {
        return Err(Error::invalid(what, format!("at most {MAX_LABEL_BYTES} bytes, got {}", label.len())));
    }
    if label.contains('\0') {
        return Err(Error::invalid(what, "must not contain NUL (U+0000)"));
    }
    Ok(())
}

/// A validated lock key.
///
/// Rules: 1 to [`MAX_BYTES`](Self::MAX_BYTES) bytes of UTF-8, no control characters
/// (U+0000..U+001F, U+007F..U+009F, so no NUL, tab or newline). Anything else
/// is allowed, quotes, backslashes, `%`, `/`, `*` and non-ASCII included;
/// stores never interpolate a key into a command or a query.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(String);

impl LockKey {
    /// The longest key, in bytes.
    pub const MAX_BYTES: usize = MAX_KEY_BYTES;

    /// Checks a key prefix for [`Client::list`](crate::Client::list): at most [`MAX_BYTES`](Self::MAX_BYTES) bytes,
    /// no control characters (the rules of a key, except that the empty
    /// prefix, every key, is allowed). A bad prefix is [`Error::InvalidInput`]
    /// with `what = "prefix"`, before any I/O.
    pub fn check_prefix(prefix: &str) -> Result<&str> {
        if prefix.len() > MAX_KEY_BYTES {
            return Err(Error::invalid(
                "prefix",
                format!("a key prefix is at most {MAX_KEY_BYTES} bytes, this one has {}", prefix.len()),
            ));
        }
        if let Some(c) = prefix.chars().find(|c| c.is_control()) {
            return Err(Error::invalid(
                "prefix",
                format!("a key prefix must not contain control characters (found U+{:04X})", c as u32),
            ));
        }
        Ok(prefix)
    }

    /// Checks `key` against the rules above.
    pub fn new(key: impl Into<String>) -> Result<Self> {
        let key = key.into();
        if key.is_empty() {
            return Err(Error::invalid("key", "a lock key must not be empty"));
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(Error::invalid(
                "key",
                format!("a lock key is at most {MAX_KEY_BYTES} bytes, this one has {}", key.len()),
            ));
        }
        if let Some(c) = key.chars().find(|c| c.is_control()) {
            return Err(Error::invalid(
                "key",
                format!("a lock key must not contain control characters (found U+{:04X})", c as u32),
            ));
        }
        Ok(LockKey(key))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a lease TTL against [`MIN_TTL`] and [`MAX_TTL`].
pub(crate) fn check_ttl(ttl: Duration) -> Result<Duration> {
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(Error::invalid(
            "ttl",
            format!("a lease TTL must be between {MIN_TTL:?} and {MAX_TTL:?}, got {ttl:?}"),
        ));
    }
    Ok(ttl)
}

/// The random 128-bit value that names one grant.
///
/// Release and renew present it; a store changes a lease only when the token
/// matches, so a stale holder can never free or extend someone else's grant.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// A fresh token from the thread-local CSPRNG.
    pub fn random() -> Self {
        OwnerToken(crate::vocabulary::entropy::with_rng(|rng| rand::Rng::random(rng)))
    }

    /// The token as a number.
    pub fn as_u128(&self) -> u128 {
        self.0
    }

    /// The token's 16 big-endian bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// The token from 16 big-endian bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        OwnerToken(u128::from_be_bytes(bytes))
    }

    /// The token as 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        // The digits are ASCII.
        String::from_utf8_lossy(&self.hex_digits()).into_owned()
    }

    /// The 32 lowercase hex digits of [`to_hex`](Self::to_hex), made
    /// without an allocation or the formatting machinery (a store sends
    /// them with every call).
    pub(crate) fn hex_digits(&self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, d) in out.iter_mut().enumerate() {
            *d = DIGITS[((self.0 >> (124 - 4 * i)) & 0xf) as usize];
        }
        out
    }

    /// Parses 32 hex digits.
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 32 {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(OwnerToken)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only a prefix: enough to correlate logs, not enough to forge a release.
        write!(f, "OwnerToken({:08x}..)", (self.0 >> 96) as u32)
    }
}

#[cfg(test)]
#[path = "key_props.rs"]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_digits_are_the_formatted_token() {
        for v in [0u128, 1, 0xf, 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210, u128::MAX, u128::MAX / 3] {
            let t = OwnerToken(v);
            assert_eq!(t.hex_digits().as_slice(), format!("{v:032x}").as_bytes());
            assert_eq!(t.to_hex(), format!("{v:032x}"));
        }
    }

    #[test]
    fn key_rules() {
        assert!(LockKey::new("orders/42").is_ok());
        assert!(LockKey::new("it's 100% \"quoted\" \\ ünïcode").is_ok());
        assert!(LockKey::new("a".repeat(MAX_KEY_BYTES)).is_ok());
        for bad in [String::new(), "a".repeat(MAX_KEY_BYTES + 1), "nul\0".into(), "line\n".into()] {
            assert!(matches!(LockKey::new(bad), Err(Error::InvalidInput { what: "key", .. })));
        }
    }

    #[test]
    fn ttl_rules() {
        assert!(check_ttl(Duration::from_secs(30)).is_ok());
        assert!(check_ttl(Duration::ZERO).is_err());
        assert!(check_ttl(MIN_TTL - Duration::from_millis(1)).is_err());
        assert!(check_ttl(MAX_TTL + Duration::from_secs(1)).is_err());
    }

    #[test]
    fn token_hex_round_trip() {
        let t = OwnerToken::random();
        assert_eq!(OwnerToken::from_hex(&t.to_hex()), Some(t));
        assert_eq!(OwnerToken::from_bytes(t.to_bytes()), t);
        assert_ne!(OwnerToken::random(), OwnerToken::random());
    }
}
