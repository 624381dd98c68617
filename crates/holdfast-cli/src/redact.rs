//! Store URLs as shown to humans: passwords replaced by `****`.

/// `scheme://user:secret@host/..` -> `scheme://user:****@host/..`; other URLs unchanged.
pub fn url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let (userinfo, host) = authority.split_at(at);
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:****{host}{tail}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hides_passwords_only() {
        assert_eq!(super::url("redis://:s3cret@127.0.0.1:6379/0"), "redis://:****@127.0.0.1:6379/0");
        assert_eq!(super::url("postgres://u:p@h/db?x=1"), "postgres://u:****@h/db?x=1");
        assert_eq!(super::url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(super::url("sqlite:///tmp/a@b.db"), "sqlite:///tmp/a@b.db");
        assert_eq!(super::url("nonsense"), "nonsense");
    }
}
