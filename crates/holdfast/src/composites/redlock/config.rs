//! `redlock://` URLs: one Redis member per address.

use std::time::Duration;

/// How long one call to a member may take by default before it counts as
/// failed for its round.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(250);

/// The URLs of the members (as [`Secret`](crate::Secret)s: they carry the
/// password) of `redlock://[user:pass@]h1:p1,h2:p2[/db][?options]`
/// (each `redis://[user:pass@]h:p[/db][?options]`, the options minus
/// `call_timeout_ms`), and that call timeout if given.
#[cfg_attr(not(feature = "redlock"), allow(dead_code))]
pub(super) fn member_urls(
    url: &str,
) -> crate::vocabulary::error::Result<(Vec<crate::vocabulary::secret::Secret>, Option<Duration>)> {
    let bad = |why: &str| {
        crate::vocabulary::error::Error::invalid(
            "url",
            format!("{}: {why}", crate::vocabulary::url_text::redact_url(url)),
        )
    };
    let rest = match url.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("redlock") => rest,
        _ => return Err(bad("expected redlock://host:port,host:port,...")),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    // Credentials end at the last '@' before the hosts (a password may hold '@').
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, rest),
    };
    let (hosts, db) = match rest.split_once('/') {
        Some((h, d)) => (h, Some(d)),
        None => (rest, None),
    };
    let mut call_timeout = None;
    let mut options = Vec::new();
    for pair in query.into_iter().flat_map(|q| q.split('&')).filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("call_timeout_ms", v)) => {
                let ms: u64 = v.parse().ok().filter(|ms| (1..=60_000).contains(ms)).ok_or_else(|| {
                    bad(&format!("call_timeout_ms must be a whole number of milliseconds in 1..=60000, not {v:?}"))
                })?;
                call_timeout = Some(Duration::from_millis(ms));
            }
            _ => options.push(pair),
        }
    }
    let members: Vec<crate::vocabulary::secret::Secret> = hosts
        .split(',')
        .map(|host| {
            if host.is_empty() {
                return Err(bad("an empty member address"));
            }
            let mut member = String::from("redis://");
            if let Some(u) = userinfo {
                member.push_str(u);
                member.push('@');
            }
            member.push_str(host);
            if let Some(d) = db {
                member.push('/');
                member.push_str(d);
            }
            if !options.is_empty() {
                member.push('?');
                member.push_str(&options.join("&"));
            }
            Ok(crate::vocabulary::secret::Secret::new(member))
        })
        .collect::<crate::vocabulary::error::Result<_>>()?;
    Ok((members, call_timeout))
}

#[cfg(feature = "redlock")]
pub(super) async fn open_url(
    url: &str,
    connect: crate::backend::ConnectFn,
) -> crate::vocabulary::error::Result<super::RedLock> {
    let (urls, call_timeout) = member_urls(url)?;
    // A member that cannot be reached counts as a failed vote until its
    // background connection succeeds: a majority grants meanwhile.
    let opened = futures::future::join_all(urls.iter().map(|u| connect(u.expose()))).await;
    let members = opened.into_iter().collect::<crate::vocabulary::error::Result<Vec<_>>>()?;
    let lock = super::RedLock::new(members)?;
    Ok(match call_timeout {
        Some(t) => lock.with_call_timeout(t),
        None => lock,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_share_credentials_database_and_options() {
        let (urls, t) = member_urls("redlock://u:p@w@a:1,b:2/3?timeout_ms=500&call_timeout_ms=40").expect("parses");
        let urls: Vec<&str> = urls.iter().map(crate::vocabulary::secret::Secret::expose).collect();
        assert_eq!(urls, ["redis://u:p@w@a:1/3?timeout_ms=500", "redis://u:p@w@b:2/3?timeout_ms=500"]);
        assert_eq!(t, Some(Duration::from_millis(40)));
    }

    #[test]
    fn bad_urls_are_typed_errors_without_the_password() {
        for bad in ["redlock://", "redlock://a:1,,b:2", "redis://a:1", "redlock://u:secret@a:1?call_timeout_ms=0"] {
            match member_urls(bad) {
                Err(crate::vocabulary::error::Error::InvalidInput { reason, .. }) => {
                    assert!(!reason.contains("secret"), "{reason}")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
