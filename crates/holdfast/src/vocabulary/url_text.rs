//! What a store URL says as text, before any store reads it: its scheme,
//! the URL with its passwords hidden, and hints for URLs that do not parse.
//! The vocabulary's floor: it imports nothing of the crate, so that every
//! store, composite and message can use it.

/// The schemes of the composite stores, whose URLs are lists of store URLs: `scheme://part|part|?options`.
pub(crate) const COMPOSITE_SCHEMES: &[&str] = &["layered", "fallback"];

/// The URL with every password replaced by `***`, for logs and messages.
///
/// Hides the password of `user:password@` (with or without a scheme; a
/// password may contain unencoded `/`, `@` or `:`, everything up to the last
/// `@` before the query counts), the value of a `password=` query option, and
/// passwords inside query values that are URLs themselves (PostgreSQL's
/// `listen_url`). Everything else is kept as written. Every error holdfast
/// builds from a URL goes through this.
///
/// ```
/// use holdfast::stores::redact_url;
/// assert_eq!(redact_url("redis://app:s3cret@10.0.0.5:6379/0"), "redis://app:***@10.0.0.5:6379/0");
/// assert_eq!(redact_url("postgres://app@db/x?password=s3cret"), "postgres://app@db/x?password=***");
/// assert_eq!(redact_url("sqlite:///tmp/a@b.db"), "sqlite:///tmp/a@b.db");
/// ```
pub fn redact_url(url: &str) -> String {
    if let Some(composite) = redact_composite(url) {
        return composite;
    }
    let (scheme, rest) = match split_scheme(url) {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let (main, query) = match rest.split_once('?') {
        Some((main, query)) => (main, Some(query)),
        None => (rest, None),
    };
    let mut out = scheme.map(|s| format!("{s}://")).unwrap_or_default();
    match main.rsplit_once('@') {
        // A path such as `/tmp/a@b.db` is not user info.
        Some((userinfo, host)) if !userinfo.starts_with('/') => match userinfo.split_once(':') {
            Some((user, _)) => out.push_str(&format!("{user}:***@{host}")),
            None => out.push_str(main),
        },
        _ => out.push_str(main),
    }
    if let Some(query) = query {
        let pieces: Vec<String> = query.split('&').map(redact_query_piece).collect();
        out.push('?');
        out.push_str(&pieces.join("&"));
    }
    out
}

/// `scheme` and the rest of `scheme://rest`, when what comes before the
/// first `://` is a scheme by RFC 3986 (a letter, then letters, digits, `+`,
/// `-` or `.`). Anything else is no scheme: in `app:pw@h/x?u=redis://h`
/// the text before `://` holds a password, and must neither be quoted as
/// an unknown scheme nor keep the password from being hidden.
pub(crate) fn split_scheme(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    valid.then_some((scheme, rest))
}

/// What must be %-encoded inside a query value; `:`, `/` and `@` may stay,
/// which keeps a redacted nested URL readable.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'&')
    .add(b'+')
    .add(b'=')
    .add(b'<')
    .add(b'>');

/// `password=x` -> `password=***`; a value holding a URL with a password gets
/// that password hidden (and is re-encoded).
fn redact_query_piece(piece: &str) -> String {
    let Some((key, value)) = piece.split_once('=') else { return piece.to_owned() };
    let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
    if decode(key).eq_ignore_ascii_case("password") {
        return format!("{key}=***");
    }
    let inner = decode(value);
    if inner.contains("://") {
        let hidden = redact_url(&inner);
        if hidden != inner {
            let encoded = percent_encoding::utf8_percent_encode(&hidden, QUERY_VALUE);
            return format!("{key}={encoded}");
        }
    }
    piece.to_owned()
}

/// A hint for a URL that did not parse whose password may hold an
/// unencoded `/` (an `@` after the first `/` past the scheme), else `""`.
#[allow(dead_code)] // not every build has a store that needs it
pub(crate) fn slash_hint(url: &str) -> &'static str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let main = rest.split('?').next().unwrap_or(rest);
    match main.split_once('/') {
        Some((_, after)) if after.contains('@') => {
            " (a '/' in the user or password must be percent-encoded: write it as %2F)"
        }
        _ => "",
    }
}

/// `url` with every part's password hidden, if it is a composite URL.
fn redact_composite(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if !COMPOSITE_SCHEMES.iter().any(|c| c.eq_ignore_ascii_case(scheme)) {
        return None;
    }
    let parts: Vec<String> =
        rest.split('|').map(|p| if p.starts_with('?') { p.to_owned() } else { redact_url(p) }).collect();
    Some(format!("{scheme}://{}", parts.join("|")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_url_hides_passwords_only() {
        for (url, shown) in [
            ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
            ("postgres://u:p@h/db?x=1", "postgres://u:***@h/db?x=1"),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("etcd://u:p%40ss@h1:2379,h2:2379", "etcd://u:***@h1:2379,h2:2379"),
            (
                "redis+sentinel://:s3cret@s1:26379,s2:26379,s3:26379/mymaster/0?replicas=1",
                "redis+sentinel://:***@s1:26379,s2:26379,s3:26379/mymaster/0?replicas=1",
            ),
            ("redis+sentinel://u:a/b@s3cret@s1,s2/m", "redis+sentinel://u:***@s1,s2/m"),
            (
                "redis+cluster://:s3cret@n1:7000,n2:7001?timeout_ms=9",
                "redis+cluster://:***@n1:7000,n2:7001?timeout_ms=9",
            ),
            // Unencoded `/`, `@` and `:` in a password (base64 passwords have `/`).
            ("redis://u:ab/c@d:e@h:1/0", "redis://u:***@h:1/0"),
            ("u:s3cret@h:6379", "u:***@h:6379"),
            ("postgres://u@h/db?sslmode=disable&password=s3cret", "postgres://u@h/db?sslmode=disable&password=***"),
            (
                "postgres://h/db?listen_url=postgres%3A%2F%2Fu%3As3cret%40d%2Fdb",
                "postgres://h/db?listen_url=postgres://u:***@d/db",
            ),
            (
                "postgres://h/db?listen_url=postgres%3A%2F%2Fu%40d%2Fdb",
                "postgres://h/db?listen_url=postgres%3A%2F%2Fu%40d%2Fdb",
            ),
            ("sqlite:///tmp/a@b.db", "sqlite:///tmp/a@b.db"),
            ("sqlite:///tmp/a:b@c.db?poll_max_ms=5", "sqlite:///tmp/a:b@c.db?poll_max_ms=5"),
            ("/var/lib/a:b@c.db", "/var/lib/a:b@c.db"),
            ("nonsense", "nonsense"),
            ("", ""),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
            assert!(!redact_url(url).contains("s3cret"), "{url}");
        }
    }
}
