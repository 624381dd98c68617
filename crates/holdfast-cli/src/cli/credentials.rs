//! Credentials kept out of the store URL: `--password-file FILE` or the
//! `HOLDFAST_PASSWORD` environment variable, as `etcdctl --password`,
//! `consul lock -token-file` or libpq's `PGPASSWORD` keep them out of the
//! command line (where `ps` and shell history would show them).
//!
//! The password is put into the URL's user-info, percent-encoded, so every
//! store reads it as it reads one written there. It is refused where it
//! would be ambiguous or meaningless: a URL that has a password already, a
//! composite URL (each member takes its own credentials), an SQLite file.

use std::path::Path;

use crate::exit::Failure;

/// The environment variable holding the store password.
pub const ENV_PASSWORD: &str = "HOLDFAST_PASSWORD";
/// The environment variable naming a file whose first line is the store password.
pub const ENV_PASSWORD_FILE: &str = "HOLDFAST_PASSWORD_FILE";

/// The password in `path`: its first line, without the line end. An empty
/// or unreadable file is a usage error naming the file (never its content).
pub fn read_password_file(path: &Path) -> Result<String, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("cannot read --password-file {}: {}", path.display(), plain_io(&e))))?;
    let line = text.lines().next().unwrap_or_default();
    if line.is_empty() {
        return Err(Failure::usage(format!(
            "--password-file {} is empty: put the password on its first line",
            path.display()
        )));
    }
    Ok(line.to_owned())
}

/// `url` with `password` put into its user-info.
pub fn with_password(url: &str, password: &str) -> Result<String, Failure> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        Failure::usage("a password from a file or HOLDFAST_PASSWORD needs a store URL (SCHEME://...)")
    })?;
    match scheme {
        "sqlite" => {
            return Err(Failure::usage(
                "an sqlite:// store takes no password; drop --password-file / HOLDFAST_PASSWORD",
            ));
        }
        "redlock" | "layered" | "fallback" => {
            return Err(Failure::usage(format!(
                "a {scheme}:// URL has several stores: put each member's credentials in its own URL \
                 (a password from a file or HOLDFAST_PASSWORD is for a single store)"
            )));
        }
        _ => {}
    }
    // The authority ends where the path, query or fragment begins.
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((info, _)) if info.contains(':') => {
            return Err(Failure::usage(
                "the store URL has a password already; give it one way (the URL, --password-file or \
                 HOLDFAST_PASSWORD), not two",
            ));
        }
        Some((user, hosts)) => (user, hosts),
        None => ("", authority),
    };
    Ok(format!("{scheme}://{user}:{}@{hosts}{tail}", percent_encode(password)))
}

/// Every byte but the URL's unreserved characters (RFC 3986) as `%XX`, so
/// that `/`, `@`, `:` or `#` in a password never change where the URL's parts end.
const USERINFO: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, USERINFO).to_string()
}

fn plain_io(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_goes_into_the_user_info_encoded() {
        let cases = [
            ("redis://127.0.0.1:6379", "p/w@x:y", "redis://:p%2Fw%40x%3Ay@127.0.0.1:6379"),
            ("redis://127.0.0.1:6379/2?timeout_ms=5", "pw", "redis://:pw@127.0.0.1:6379/2?timeout_ms=5"),
            ("postgres://app@db:5432/locks", "s3cr#t", "postgres://app:s3cr%23t@db:5432/locks"),
            ("etcd://root@h1:2379,h2:2379?prefix=a/", "pw", "etcd://root:pw@h1:2379,h2:2379?prefix=a/"),
            ("mysql://app@[::1]:3306/db", "é", "mysql://app:%C3%A9@[::1]:3306/db"),
            ("zk://h:2181", "pw", "zk://:pw@h:2181"),
        ];
        for (url, password, expected) in cases {
            assert_eq!(with_password(url, password).unwrap(), expected, "{url}");
        }
    }

    #[test]
    fn ambiguous_or_meaningless_passwords_are_refused() {
        for url in ["redis://:old@h:1", "postgres://app:old@h/db", "sqlite:///tmp/x.db", "redlock://a:1,b:2,c:3", "h:1"]
        {
            let e = with_password(url, "pw").unwrap_err();
            assert_eq!(e.code, crate::exit::USAGE, "{url}");
            assert!(!e.message.contains("pw@"), "{url}: {}", e.message);
        }
    }
}
