//! URLs of the composites built over other stores: `layered://FAST|AUTH`
//! and `fallback://S1|S2|...|ARBITER`.
//!
//! Each `|`-separated part is a whole store URL, as it would be given on
//! its own (with its own credentials and options). The composite's own
//! options, if any, come first as a part that starts with `?`:
//! `fallback://?mode_ttl_ms=6000|redis://h:6379|postgres://u@h/db`.
//! A part may be any store URL but another `|` composite (build nested
//! composites in code); `redlock://` parts are fine.

use std::sync::Arc;

use crate::backend::Backend;
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::url_options::{Opt, UrlOptions};

pub(crate) use crate::vocabulary::url_text::COMPOSITE_SCHEMES;

/// A parsed composite URL.
pub(crate) struct CompositeUrl {
    /// The store URLs, in the order written.
    pub(crate) parts: Vec<String>,
    /// The composite's own options.
    pub(crate) options: UrlOptions,
}

/// Splits `url` (scheme `scheme`, one of [`COMPOSITE_SCHEMES`]) into its
/// store URLs and options, checking the options against `known`. Needs at
/// least `min_parts` parts and at most `max_parts`.
pub(crate) fn parse(
    url: &str,
    scheme: &'static str,
    known: &'static [Opt],
    parts: std::ops::RangeInclusive<usize>,
) -> Result<CompositeUrl> {
    let bad = |why: String| Error::invalid("url", format!("{}: {why}", crate::vocabulary::url_text::redact_url(url)));
    let rest = match url.split_once("://") {
        Some((s, rest)) if s.eq_ignore_ascii_case(scheme) => rest,
        _ => return Err(bad(format!("expected {scheme}://STORE_URL|STORE_URL..."))),
    };
    let mut pieces: Vec<&str> = rest.split('|').collect();
    let query = match pieces.first() {
        Some(first) if first.starts_with('?') => {
            let q = &first[1..];
            pieces.remove(0);
            q
        }
        _ => "",
    };
    let options = UrlOptions::parse(scheme, query, known)?;
    if !parts.contains(&pieces.len()) {
        return Err(bad(format!(
            "{scheme}:// takes {} store URLs separated by '|', got {}",
            if parts.start() == parts.end() {
                parts.start().to_string()
            } else {
                format!("{} to {}", parts.start(), parts.end())
            },
            pieces.len()
        )));
    }
    for p in &pieces {
        let Some((s, _)) = p.split_once("://") else {
            return Err(bad(format!(
                "{:?} is not a store URL (no scheme)",
                crate::vocabulary::url_text::redact_url(p)
            )));
        };
        if COMPOSITE_SCHEMES.iter().any(|c| c.eq_ignore_ascii_case(s)) {
            return Err(bad(format!("a part cannot be a {s}:// URL itself; build nested composites in code")));
        }
    }
    Ok(CompositeUrl { parts: pieces.into_iter().map(str::to_owned).collect(), options })
}

impl CompositeUrl {
    /// Connects every part, all at once. A part that cannot be reached
    /// (a retryable error) is not an error: it is deferred, connected in the
    /// background and failing every call until then
    /// ([`connect_or_defer`](crate::stores::connect_or_defer)), so that a
    /// composite starts during the outage of a member it exists to ride out.
    pub(crate) async fn connect(&self, connect: crate::backend::ConnectFn) -> Result<Vec<Arc<dyn Backend>>> {
        let opened = futures::future::join_all(self.parts.iter().map(|u| connect(u))).await;
        opened.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[Opt] = &[Opt::new("mode_ttl_ms")];

    #[test]
    fn parts_and_leading_options() {
        let u = parse(
            "fallback://?mode_ttl_ms=6000|redis://:pw@a:1?timeout_ms=5|sqlite:///tmp/x.db",
            "fallback",
            KNOWN,
            2..=8,
        )
        .expect("parses");
        assert_eq!(u.parts, ["redis://:pw@a:1?timeout_ms=5", "sqlite:///tmp/x.db"]);
        assert_eq!(
            u.options.duration_ms("mode_ttl_ms", 1..=100_000).expect("ms"),
            Some(std::time::Duration::from_secs(6))
        );
    }

    #[test]
    fn bad_composites_are_typed_errors_without_passwords() {
        for (scheme, bad) in [
            ("layered", "layered://redis://:secret@a:1"),
            ("layered", "layered://redis://:secret@a:1|b:2"),
            ("layered", "layered://redis://:secret@a:1|fallback://x:1|y:2"),
            ("fallback", "fallback://?nope=1|redis://:secret@a:1|redis://b:2"),
            ("fallback", "redis://:secret@a:1"),
        ] {
            match parse(bad, scheme, KNOWN, 2..=2) {
                Err(Error::InvalidInput { reason, .. }) => assert!(!reason.contains("secret"), "{reason}"),
                other => panic!("{bad:?}: {:?}", other.map(|u| u.parts)),
            }
        }
    }

    #[test]
    fn redaction_covers_every_part() {
        assert_eq!(
            crate::vocabulary::url_text::redact_url("layered://redis://:pw@a:1|postgres://u:pw@h/db").as_str(),
            "layered://redis://:***@a:1|postgres://u:***@h/db"
        );
    }
}
