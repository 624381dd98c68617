//! Store errors as a user reads them: one line naming the store and its
//! endpoint, the cause in plain words, and what to do, as in
//! `etcd at 127.0.0.1:2379: connection refused: is etcd running and
//! listening there? (check the URL's host and port)`.
//!
//! A store's error mapping builds an [`Error::Backend`](crate::Error::Backend) from its client
//! library's error; where the endpoint is known (the connection and every
//! call on it, see [`Located`]) [`Error::at`](crate::Error::at) wraps that error's source,
//! once, in an [`AtEndpoint`] that says where and why. The library's error
//! stays the wrapper's `source()`. The `retryable` flag is never changed.

use std::error::Error as StdError;
use std::fmt;
use std::io::ErrorKind;

/// A boxed error from a store's client library. Defined here, at the
/// bottom, so that this file needs nothing of `error.rs` (which builds on
/// it); re-exported as [`crate::BoxError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The source of an [`Error::Backend`](crate::Error::Backend) whose endpoint is known: its text is
/// the whole message; the client library's error is its `source()`.
pub(crate) struct AtEndpoint {
    store: &'static str,
    endpoint: String,
    text: String,
    source: BoxError,
}

impl AtEndpoint {
    /// `source` located at `endpoint` of `store`, its cause explained.
    pub(crate) fn new(store: &'static str, endpoint: &str, source: BoxError) -> Self {
        let text = explain(store, &*source);
        AtEndpoint { store, endpoint: endpoint.to_owned(), text, source }
    }
}

impl fmt::Display for AtEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}: {}", self.store, self.endpoint, self.text)
    }
}

impl fmt::Debug for AtEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AtEndpoint")
            .field("store", &self.store)
            .field("endpoint", &self.endpoint)
            .field("source", &self.source)
            .finish()
    }
}

impl StdError for AtEndpoint {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// A message that says the store, where and why already (the error of a
/// store not connected yet, which repeats its last connection error).
#[derive(Debug)]
pub(crate) struct Said(pub(crate) String);

impl fmt::Display for Said {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Said {}

/// A cause in holdfast's own words that says what to do already (it may
/// quote the server: "permission denied for function ..."), kept as it is
/// where a client library's error is explained: the shared advice for its
/// words would replace the specific one.
#[derive(Debug)]
pub(crate) struct Advised(pub(crate) String);

impl fmt::Display for Advised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Advised {}

/// Whether `source` says the store and endpoint itself already.
pub(crate) fn is_located(source: &BoxError) -> bool {
    source.is::<AtEndpoint>() || source.is::<Said>()
}

/// The message of an [`Error::Backend`](crate::Error::Backend): the located text, or else the
/// store's name and the explained cause.
pub(crate) fn backend_message(store: &str, source: &BoxError) -> String {
    if is_located(source) { source.to_string() } else { format!("{store}: {}", explain(store, &**source)) }
}

/// The client library's error under an [`AtEndpoint`], or `source` itself.
#[allow(dead_code)] // not every build has a store that needs it
pub(crate) fn original(source: &BoxError) -> &(dyn StdError + Send + Sync + 'static) {
    match source.downcast_ref::<AtEndpoint>() {
        Some(at) => &*at.source,
        None => &**source,
    }
}

/// Hosts written as `host:port`, joined with `,`.
#[allow(dead_code)] // not every build has a store that needs it
pub(crate) fn host_list<S: AsRef<str>>(hosts: impl IntoIterator<Item = S>) -> String {
    hosts.into_iter().map(|h| h.as_ref().to_owned()).collect::<Vec<_>>().join(",")
}

/// The hosts of a `scheme://user:password@host:port,host2/...` URL as
/// `host:port,...` (`default_port` where none is written); never the
/// user info.
#[allow(dead_code)] // not every build has a store that needs it
pub(crate) fn url_hosts(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let main = rest.split(['?', '#']).next().unwrap_or(rest);
    let after_at = main.rsplit_once('@').map_or(main, |(_, hosts)| hosts);
    let hosts = after_at.split('/').next().unwrap_or(after_at);
    if hosts.is_empty() {
        // A Unix socket: its path.
        return after_at.to_owned();
    }
    let with_port = |h: &str| {
        let has_port = match h.rfind(']') {
            Some(close) => h[close..].contains(':'),
            None => h.contains(':'),
        };
        if has_port || h.is_empty() { h.to_owned() } else { format!("{h}:{default_port}") }
    };
    host_list(hosts.split(',').map(with_port))
}

/// How users know the store, in prose.
fn proper_name(store: &str) -> &str {
    match store {
        "redis" => "Redis",
        "postgres" => "PostgreSQL",
        "mysql" => "MySQL",
        "zookeeper" => "ZooKeeper",
        "sqlite" => "SQLite",
        other => other,
    }
}

/// Where a password goes in the store's URL.
fn credentials_example(store: &str) -> &'static str {
    match store {
        "redis" => "redis://:PASSWORD@host, or redis://USER:PASSWORD@host for an ACL user",
        "postgres" => "postgres://USER:PASSWORD@host/db",
        "mysql" => "mysql://USER:PASSWORD@host/db",
        "etcd" => "etcd://USER:PASSWORD@host",
        "zookeeper" => "zk://USER:PASSWORD@host",
        _ => "scheme://USER:PASSWORD@host",
    }
}

/// Where a debug dump starts inside a library's message: it is cut there.
const DUMP_MARKS: &[&str] = &[", source: ", "Os {", "tonic::", "Error(", " { "];

/// One level's text without a debug dump.
fn clean(text: &str) -> String {
    let cut = DUMP_MARKS.iter().filter_map(|m| text.find(m)).min().unwrap_or(text.len());
    let text = text[..cut].trim_end_matches([',', ':', ' ', '(']);
    // mysql_async quotes the server's words as `...'.
    let unquoted;
    let text = match text.split_once('`') {
        Some((head, quoted)) if quoted.ends_with('\'') => {
            unquoted = format!("{head}{}", &quoted[..quoted.len() - 1]);
            &unquoted[..]
        }
        _ => text,
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The error's chain in one line: each level's cleaned text, `": "`
/// between, each piece said once (client libraries repeat their wrappers'
/// words: "Input/output error: Input/output error: ...").
fn plain(err: &(dyn StdError + 'static)) -> String {
    let mut pieces: Vec<String> = Vec::new();
    let mut cur = Some(err);
    while let Some(e) = cur {
        for piece in clean(&e.to_string()).split(": ") {
            let piece = piece.trim();
            if !piece.is_empty() && !pieces.iter().any(|p| p.contains(piece)) {
                pieces.push(piece.to_owned());
            }
        }
        cur = e.source();
    }
    pieces.join(": ")
}

/// The first I/O error kind in the chain.
fn io_kind(err: &(dyn StdError + 'static)) -> Option<ErrorKind> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cur = e.source();
    }
    None
}

/// The server's words in `text` from `needle` (ASCII, lower case) to the
/// next `": "` outside parentheses, without a trailing `(SQLSTATE ...)`.
fn piece_with<'a>(text: &'a str, needle: &str) -> Option<&'a str> {
    let start = text.to_ascii_lowercase().find(needle)?;
    let rest = &text[start..];
    let mut depth = 0i32;
    let mut end = rest.len();
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ':' if depth <= 0 && rest[i..].starts_with(": ") => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let piece = &rest[..end];
    let piece = piece.split(" (SQLSTATE").next().unwrap_or(piece).trim();
    // A quote the library opened before the needle.
    Some(if piece.matches('"').count() % 2 == 1 { piece.trim_end_matches('"') } else { piece })
}

/// Every level's text as the library wrote it, debug dumps included (they
/// may hold the only mention of the cause), in lower case.
fn raw_lower(err: &(dyn StdError + 'static)) -> String {
    let mut out = String::new();
    let mut cur = Some(err);
    while let Some(e) = cur {
        out.push_str(&e.to_string().to_lowercase());
        out.push(' ');
        cur = e.source();
    }
    out
}

/// The cause of a store failure in plain words, and what to do about it.
pub(crate) fn explain(store: &str, err: &(dyn StdError + 'static)) -> String {
    if let Some(advised) = err.downcast_ref::<Advised>() {
        return advised.0.clone();
    }
    let text = plain(err);
    let lower = raw_lower(err);
    let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    let kind = io_kind(err);
    let name = proper_name(store);
    if kind == Some(ErrorKind::ConnectionRefused) || has(&["connection refused", "connectionrefused"]) {
        return format!("connection refused: is {store} running and listening there? (check the URL's host and port)");
    }
    if has(&[
        "failed to lookup address",
        "name or service not known",
        "temporary failure in name resolution",
        "no address associated",
        "nodename nor servname",
        "dns error",
        "no such host",
    ]) {
        return "host name not found (DNS lookup failed): check the host name in the URL".to_owned();
    }
    if has(&["noauth", "authentication required", "auth required", "no password was supplied", "password missing"]) {
        return format!("authentication required: put the password in the URL ({})", credentials_example(store));
    }
    let auth_failed = has(&[
        "wrongpass",
        "invalid username-password",
        "password authentication failed",
        "authentication failed",
        "auth failed",
        "authfailed",
        "no pg_hba.conf entry",
    ]) || (has(&["access denied for user"]) && has(&["using password"]));
    if auth_failed {
        let said = ["password authentication failed for user", "access denied for user", "no pg_hba.conf entry"]
            .iter()
            .find_map(|n| piece_with(&text, n))
            .unwrap_or("authentication failed");
        return format!(
            "{said}: check the user and password in the URL ({}; percent-encode '/', '@', ':' as %2F, %40, %3A)",
            credentials_example(store)
        );
    }
    if has(&["certificate", "tls handshake", "tls connection", "rustls", "ssl", "handshake"]) {
        return format!(
            "TLS failed ({text}): check the CA file (ca_file=) and the server's certificate and name, and that \
             the server speaks TLS on this port"
        );
    }
    if has(&["unknown database", "database"]) && has(&["does not exist", "unknown database"]) {
        let said = piece_with(&text, "unknown database").or_else(|| piece_with(&text, "database")).unwrap_or(&text);
        return format!("{said}: create it, or fix the database name in the URL");
    }
    if has(&[
        "permission denied",
        "access denied",
        "command denied",
        "insufficient privilege",
        "not authorized",
        "noperm",
    ]) {
        let said = ["permission denied", "access denied", "command denied", "not authorized", "noperm"]
            .iter()
            .find_map(|n| piece_with(&text, n))
            .unwrap_or(&text);
        return format!("{said}: grant the user the rights docs/stores.md lists for {name}");
    }
    if has(&["does not exist"]) {
        let said = piece_with(&text, "does not exist").unwrap_or(&text);
        return format!("{said}: create it, or fix the name in the URL");
    }
    if has(&[
        "parse error",
        "incompatible type",
        "invalid response",
        "protocol error",
        "unexpected message",
        "h2 protocol",
    ]) || has(&[
        "http2",
        "frame with invalid size",
        "invalid packet",
        "packets out of order",
        "unexpected response",
        "grpc-status header missing",
    ]) {
        return format!("the server does not speak the {name} protocol (is this the right port?)");
    }
    if has(&["no available hosts"]) {
        return format!(
            "no server answered: is {store} running on these hosts and are they reachable? (check the URL's hosts and ports)"
        );
    }
    if store == "sqlite" && has(&["unable to open database file"]) {
        return "cannot open the database file: does its directory exist, and may this user write there?".to_owned();
    }
    if store == "sqlite" && has(&["readonly database", "read-only"]) {
        return "the database file is read-only: give this user write permission on the file and its directory"
            .to_owned();
    }
    if has(&["timed out after"]) {
        return text;
    }
    if kind == Some(ErrorKind::TimedOut)
        || lower.trim() == "timeout"
        || has(&["timed out", "deadline has elapsed", "connect timeout"])
    {
        return format!(
            "no answer (timed out): is the host reachable and {store} listening there? (a firewall may drop the packets)"
        );
    }
    if text.is_empty() { "failed".to_owned() } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::error::Error;

    #[test]
    fn located_errors_say_where_once() {
        let io = std::io::Error::new(ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
        let e = Error::backend("redis", true, io).at("127.0.0.1:1").at("elsewhere:2");
        assert!(e.is_retryable());
        assert_eq!(
            e.to_string(),
            "redis at 127.0.0.1:1: connection refused: is redis running and listening there? (check the URL's host and port)"
        );
        let Error::Backend { source, .. } = &e else { unreachable!() };
        assert!(original(source).is::<std::io::Error>());
    }

    #[test]
    fn advice_in_holdfasts_words_is_kept_as_written() {
        let text = "the server refused to end the backend (pid 7) (permission denied for function f); grant the role \
                    pg_signal_backend";
        let e = Error::advised("postgres", false, text.to_owned()).at("h:1");
        assert_eq!(e.to_string(), format!("postgres at h:1: {text}"));
        assert!(!e.is_retryable());
        // The same words from a client library get the shared advice.
        let plain = Error::backend("postgres", false, text.to_owned()).at("h:1").to_string();
        assert!(plain.contains("grant the user the rights docs/stores.md lists"), "{plain}");
    }

    #[test]
    fn causes_in_plain_words() {
        let said = |store: &'static str, text: &str| Error::backend(store, true, text.to_owned()).at("h:1").to_string();
        let cases = [
            ("redis", "failed to lookup address information: Name or service not known", "host name not found"),
            ("etcd", "transport error: invalid peer certificate: UnknownIssuer", "TLS failed"),
            ("redis", "NOAUTH: Authentication required.", "authentication required"),
            ("redis", "WRONGPASS: invalid username-password pair", "authentication failed"),
            ("zookeeper", "timeout", "no answer (timed out)"),
            (
                "etcd",
                "grpc request error: status: PermissionDenied, message: \"etcdserver: permission denied\"",
                "permission denied",
            ),
            (
                "redis",
                "Incompatible type - Parse error at 1 Unexpected '33'",
                "the server does not speak the Redis protocol",
            ),
            ("zookeeper", "no available hosts", "no server answered"),
            (
                "etcd",
                "grpc request error: message: \"grpc-status header missing, mapped from HTTP status code 404\"",
                "the server does not speak the etcd protocol",
            ),
            ("sqlite", "attempt to write a readonly database", "the database file is read-only"),
            ("redis", "redis script timed out after 5s", "redis script timed out after 5s"),
        ];
        for (store, text, want) in cases {
            let shown = said(store, text);
            assert!(shown.starts_with(&format!("{store} at h:1: {want}")), "{text:?} -> {shown}");
            assert!(!shown.contains("\": "), "{shown}");
        }
    }

    #[test]
    fn hosts_of_urls_never_show_the_password() {
        assert_eq!(url_hosts("redis://u:p/w@h:1/0?x=1", 6379), "h:1");
        assert_eq!(url_hosts("redis://h", 6379), "h:6379");
        assert_eq!(url_hosts("etcd://[::1],h2:3", 2379), "[::1]:2379,h2:3");
        assert_eq!(url_hosts("unix:///tmp/r.sock", 6379), "/tmp/r.sock");
    }

    #[test]
    fn repeated_wrappers_and_dumps_are_cut() {
        assert_eq!(
            clean("grpc request error: code: 'x', message: \"m\", source: tonic::T(...)"),
            "grpc request error: code: 'x', message: \"m\""
        );
        assert_eq!(
            clean("Server error: `ERROR 42000 (1049): Unknown database 'x''"),
            "Server error: ERROR 42000 (1049): Unknown database 'x'"
        );
        let e = Error::backend("mysql", false, "Input/output error: Input/output error: something odd");
        assert_eq!(e.to_string(), "mysql: Input/output error: something odd");
    }
}
