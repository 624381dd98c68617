//! One vocabulary of URL options for every store.
//!
//! Each store lists its options once, as a table of [`Opt`]s, and reads them
//! with [`UrlOptions`]: the query string is split and percent-decoded here,
//! once (`+` stays a plus, as in libpq and RFC 3986), unknown names are
//! rejected with the list of known ones, and values are read with typed
//! getters whose errors name the option as the user wrote it.
//!
//! The same idea has the same name in every store that has it:
//!
//! | idea | name |
//! |---|---|
//! | time limit of one store operation | `timeout_ms` |
//! | time limit of connecting | `connect_timeout_ms` |
//! | where the store's keys, nodes or tables live | `namespace` |
//! | CA certificates to trust, client certificate and key | `ca_file`, `cert_file`, `key_file` |
//! | TLS mode of the SQL stores | `sslmode` |
//! | fallback poll of waiters | `poll_min_ms`, `poll_max_ms` |
//! | connections a client opens | `pool_size` |
//! | how long a dead client's session lives | `session_timeout_ms` |
//!
//! Each store's older or native names stay accepted as aliases.

// Which getters a build uses depends on the stores compiled in; with all of
// them, everything here is used.
#![cfg_attr(
    not(all(
        feature = "sqlite",
        feature = "redis",
        feature = "etcd",
        feature = "zookeeper",
        feature = "postgres",
        feature = "mysql"
    )),
    allow(dead_code)
)]

use std::borrow::Cow;
use std::fmt::Display;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::vocabulary::error::{Error, Result};

/// One option a store accepts.
#[derive(Debug)]
pub(crate) struct Opt {
    /// The common name.
    pub(crate) name: &'static str,
    /// Other names for the same option, in the same unit.
    pub(crate) aliases: &'static [&'static str],
    /// Names for the same duration given in whole seconds (store-native
    /// spellings such as etcd's `session_ttl`); `name` is in milliseconds.
    pub(crate) seconds_aliases: &'static [&'static str],
    /// Not read by holdfast: handed on as written to the store's client
    /// library (PostgreSQL's libpq options).
    pub(crate) pass_through: bool,
}

impl Opt {
    /// An option without aliases.
    pub(crate) const fn new(name: &'static str) -> Self {
        Opt { name, aliases: &[], seconds_aliases: &[], pass_through: false }
    }

    /// The same option, also accepted under `aliases`.
    pub(crate) const fn or(self, aliases: &'static [&'static str]) -> Self {
        Opt { aliases, ..self }
    }

    /// The same option, also accepted in whole seconds under `aliases`.
    pub(crate) const fn or_seconds(self, aliases: &'static [&'static str]) -> Self {
        Opt { seconds_aliases: aliases, ..self }
    }

    /// An option the store's client library reads, passed on untouched.
    pub(crate) const fn pass_through(name: &'static str) -> Self {
        Opt { pass_through: true, ..Opt::new(name) }
    }
}

/// One option as found in the URL.
struct Given {
    opt: &'static Opt,
    /// The name as written (decoded).
    key: String,
    /// The value, percent-decoded.
    value: String,
    /// `key=value` exactly as written, for pass-through options.
    raw: String,
    /// Given under one of `opt.seconds_aliases`.
    in_seconds: bool,
}

/// The options of one store URL, checked against the store's table.
pub(crate) struct UrlOptions {
    store: &'static str,
    known: &'static [Opt],
    given: Vec<Given>,
}

/// Decodes `%XX` escapes, refusing a `%` without two hex digits after it
/// and a result that is not UTF-8. `what` names the part of the URL for the
/// error ("the password of a mysql:// URL"); the text itself is never quoted,
/// since it may be a credential.
pub(crate) fn percent_decode(s: &str, what: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let escapes_ok = bytes
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'%')
        .all(|(i, _)| bytes.get(i + 1..i + 3).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)));
    if !escapes_ok {
        return Err(Error::invalid("url", format!("bad %-escape in {what} (write % as %25)")));
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(Cow::into_owned)
        .map_err(|_| Error::invalid("url", format!("{what} is not UTF-8 after %-decoding")))
}

impl UrlOptions {
    /// Splits and decodes `query` (the part after `?`, without it) and checks
    /// every name against `known`. When an option is given twice, under one
    /// name or two, the last one counts, as in libpq.
    pub(crate) fn parse(store: &'static str, query: &str, known: &'static [Opt]) -> Result<Self> {
        let mut given = Vec::new();
        for raw in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = raw.split_once('=').unwrap_or((raw, ""));
            let key = percent_decode(k, &format!("a {store} option name"))?;
            let lookup = |names: &[&str]| names.contains(&key.as_str());
            let found = known.iter().find_map(|opt| {
                if opt.name == key || lookup(opt.aliases) {
                    Some((opt, false))
                } else if lookup(opt.seconds_aliases) {
                    Some((opt, true))
                } else {
                    None
                }
            });
            let Some((opt, in_seconds)) = found else {
                return Err(Error::invalid("url", format!("unknown {store} option {key:?}; known: {}", list(known))));
            };
            let value = percent_decode(v, &format!("the value of {store} option {key}"))?;
            given.push(Given { opt, key, value, raw: raw.to_owned(), in_seconds });
        }
        Ok(UrlOptions { store, known, given })
    }

    fn last(&self, name: &str) -> Option<&Given> {
        debug_assert!(self.known.iter().any(|o| o.name == name), "{name:?} is not the common name of an option");
        self.given.iter().rev().find(|g| g.opt.name == name)
    }

    fn bad(&self, g: &Given, needs: impl Display) -> Error {
        Error::invalid("url", format!("{} option {} needs {needs}, got {:?}", self.store, g.key, g.value))
    }

    /// The decoded text of option `name`, if given.
    pub(crate) fn str(&self, name: &str) -> Option<&str> {
        self.last(name).map(|g| g.value.as_str())
    }

    /// The name option `name` was given under (for a store's own error messages).
    pub(crate) fn given_as(&self, name: &str) -> Option<&str> {
        self.last(name).map(|g| g.key.as_str())
    }

    /// A file path; an empty one is an error.
    pub(crate) fn path(&self, name: &str) -> Result<Option<PathBuf>> {
        match self.last(name) {
            None => Ok(None),
            Some(g) if g.value.is_empty() => Err(self.bad(g, "a file path")),
            Some(g) => Ok(Some(PathBuf::from(&g.value))),
        }
    }

    /// A whole number within `range`.
    pub(crate) fn number<T>(&self, name: &str, range: RangeInclusive<T>) -> Result<Option<T>>
    where
        T: FromStr + PartialOrd + Display,
    {
        let Some(g) = self.last(name) else { return Ok(None) };
        match g.value.parse::<T>() {
            Ok(n) if range.contains(&n) => Ok(Some(n)),
            _ => Err(self.bad(g, format_args!("a number in {}..={}", range.start(), range.end()))),
        }
    }

    /// A duration in milliseconds within `ms` (or in seconds, when given
    /// under one of the option's seconds aliases).
    pub(crate) fn duration_ms(&self, name: &str, ms: RangeInclusive<u64>) -> Result<Option<Duration>> {
        let Some(g) = self.last(name) else { return Ok(None) };
        let scale = if g.in_seconds { 1000 } else { 1 };
        let parsed = g.value.parse::<u64>().ok().and_then(|n| n.checked_mul(scale)).filter(|n| ms.contains(n));
        match parsed {
            Some(n) => Ok(Some(Duration::from_millis(n))),
            None if g.in_seconds => {
                Err(self.bad(g, format_args!("whole seconds in {}..={}", ms.start().div_ceil(1000), ms.end() / 1000)))
            }
            None => Err(self.bad(g, format_args!("milliseconds in {}..={}", ms.start(), ms.end()))),
        }
    }

    /// `true`/`on`/`yes`/`1` or `false`/`off`/`no`/`0`.
    pub(crate) fn flag(&self, name: &str) -> Result<Option<bool>> {
        let Some(g) = self.last(name) else { return Ok(None) };
        match g.value.to_ascii_lowercase().as_str() {
            "true" | "on" | "yes" | "1" => Ok(Some(true)),
            "false" | "off" | "no" | "0" => Ok(Some(false)),
            _ => Err(self.bad(g, "true or false")),
        }
    }

    /// One of `choices` (compared ignoring ASCII case).
    pub(crate) fn choice<T: Copy>(&self, name: &str, choices: &[(&str, T)]) -> Result<Option<T>> {
        let Some(g) = self.last(name) else { return Ok(None) };
        match choices.iter().find(|(text, _)| text.eq_ignore_ascii_case(&g.value)) {
            Some((_, value)) => Ok(Some(*value)),
            None => {
                let names: Vec<&str> = choices.iter().map(|(text, _)| *text).collect();
                Err(self.bad(g, format_args!("one of {}", names.join(", "))))
            }
        }
    }

    /// The pass-through options, `key=value` exactly as written, in URL order.
    pub(crate) fn pass_through(&self) -> Vec<&str> {
        self.given.iter().filter(|g| g.opt.pass_through).map(|g| g.raw.as_str()).collect()
    }
}

/// `a, b (or c), d` for an unknown-option error.
fn list(known: &[Opt]) -> String {
    let mut out = Vec::new();
    for opt in known.iter().filter(|o| !o.pass_through) {
        let others: Vec<&str> = opt.aliases.iter().chain(opt.seconds_aliases).copied().collect();
        out.push(if others.is_empty() {
            opt.name.to_owned()
        } else {
            format!("{} (or {})", opt.name, others.join(", "))
        });
    }
    let passed: Vec<&str> = known.iter().filter(|o| o.pass_through).map(|o| o.name).collect();
    if !passed.is_empty() {
        out.push(format!("and the client library's {}", passed.join(", ")));
    }
    out.join(", ")
}

/// Checks a store's docs.md against its option table: the docs have one
/// "URL options" table with the columns option, meaning, default, aliases;
/// every option holdfast reads has a row, every row is an option, and each
/// row's aliases cell names every alias.
#[cfg(test)]
pub(crate) fn check_docs_table(docs: &str, known: &[Opt]) {
    let mut lines = docs.lines().skip_while(|l| !(l.starts_with('#') && l.ends_with("URL options")));
    assert!(lines.next().is_some(), "no \"URL options\" heading");
    let mut rows = lines.skip_while(|l| !l.starts_with('|') && !l.starts_with('#')).take_while(|l| l.starts_with('|'));
    assert_eq!(rows.next(), Some("| option | meaning | default | aliases |"), "table header");
    assert!(rows.next().is_some_and(|l| l.starts_with("|---")), "table header rule");
    let ticked = |cell: &str| -> Vec<String> { cell.split('`').skip(1).step_by(2).map(str::to_owned).collect() };
    let mut documented = Vec::new();
    for row in rows {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").collect();
        assert_eq!(cells.len(), 4, "row {row:?} needs 4 cells");
        let names = ticked(cells[0]);
        assert_eq!(names.len(), 1, "row {row:?}: one option per row");
        let opt = known.iter().find(|o| o.name == names[0]).unwrap_or_else(|| panic!("{row:?} is not an option"));
        let aliases = ticked(cells[3]);
        for alias in opt.aliases.iter().chain(opt.seconds_aliases) {
            assert!(aliases.iter().any(|a| a == alias), "row {row:?} does not name alias {alias:?}");
        }
        documented.push(opt.name);
    }
    for opt in known.iter().filter(|o| !o.pass_through) {
        assert!(documented.contains(&opt.name), "option {:?} has no row", opt.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[Opt] = &[
        Opt::new("timeout_ms").or(&["op_timeout_ms"]),
        Opt::new("session_timeout_ms").or_seconds(&["session_ttl"]),
        Opt::new("ca_file"),
        Opt::new("tls").or(&["sslmode"]),
        Opt::new("create"),
        Opt::new("pool_size"),
        Opt::pass_through("application_name"),
    ];

    #[test]
    fn decodes_once_and_reads_typed_values() {
        let o = UrlOptions::parse(
            "test",
            "op_timeout_ms=250&session_ttl=3&ca_file=%2Fetc%2Fa+b%25.pem&sslmode=REQUIRE&create=off&pool_size=8\
             &application_name=a%20b",
            KNOWN,
        )
        .unwrap();
        assert_eq!(o.duration_ms("timeout_ms", 1..=1000).unwrap(), Some(Duration::from_millis(250)));
        assert_eq!(o.given_as("timeout_ms"), Some("op_timeout_ms"));
        assert_eq!(o.duration_ms("session_timeout_ms", 1..=10_000).unwrap(), Some(Duration::from_secs(3)));
        // `+` is a plus and `%25` a percent sign: decoded once, not twice.
        assert_eq!(o.path("ca_file").unwrap(), Some(PathBuf::from("/etc/a+b%.pem")));
        assert_eq!(o.choice("tls", &[("require", 1), ("disable", 0)]).unwrap(), Some(1));
        assert_eq!(o.flag("create").unwrap(), Some(false));
        assert_eq!(o.number("pool_size", 1usize..=64).unwrap(), Some(8));
        assert_eq!(o.pass_through(), vec!["application_name=a%20b"]);
        assert_eq!(UrlOptions::parse("test", "", KNOWN).unwrap().str("ca_file"), None);
    }

    #[test]
    fn the_last_of_repeated_options_counts() {
        let o = UrlOptions::parse("test", "timeout_ms=1&op_timeout_ms=2", KNOWN).unwrap();
        assert_eq!(o.duration_ms("timeout_ms", 1..=10).unwrap(), Some(Duration::from_millis(2)));
    }

    #[test]
    fn errors_name_the_option_and_list_the_known_ones() {
        let err = UrlOptions::parse("test", "timeout_ms=1&nope=2", KNOWN).err().unwrap().to_string();
        assert!(err.contains("\"nope\""), "{err}");
        for name in ["timeout_ms (or op_timeout_ms)", "session_timeout_ms (or session_ttl)", "pool_size"] {
            assert!(err.contains(name), "{err} lacks {name}");
        }
        assert!(err.contains("application_name"), "{err}");
        let o = UrlOptions::parse("test", "op_timeout_ms=0&session_ttl=99&tls=maybe&create=2", KNOWN).unwrap();
        let err = o.duration_ms("timeout_ms", 1..=1000).unwrap_err().to_string();
        assert!(err.contains("op_timeout_ms") && err.contains("1..=1000"), "{err}");
        let err = o.duration_ms("session_timeout_ms", 1000..=60_000).unwrap_err().to_string();
        assert!(err.contains("session_ttl") && err.contains("seconds in 1..=60"), "{err}");
        assert!(o.choice("tls", &[("require", ())]).unwrap_err().to_string().contains("one of require"));
        assert!(o.flag("create").is_err());
        assert!(UrlOptions::parse("test", "ca_file=", KNOWN).unwrap().path("ca_file").is_err());
    }

    const DOCS: &str = "## URL options\n\nText.\n\n| option | meaning | default | aliases |\n|---|---|---|---|\n\
        | `timeout_ms` | limit | 5000 | `op_timeout_ms` |\n| `session_timeout_ms` | s | 1 | `session_ttl` (s) |\n";
    const DOCUMENTED: &[Opt] = &[
        Opt::new("timeout_ms").or(&["op_timeout_ms"]),
        Opt::new("session_timeout_ms").or_seconds(&["session_ttl"]),
        Opt::pass_through("application_name"),
    ];

    #[test]
    fn docs_check_accepts_a_matching_table() {
        check_docs_table(DOCS, DOCUMENTED);
    }

    #[test]
    #[should_panic(expected = "has no row")]
    fn docs_check_catches_a_missing_row() {
        check_docs_table(DOCS, KNOWN);
    }

    #[test]
    #[should_panic(expected = "does not name alias")]
    fn docs_check_catches_a_missing_alias() {
        check_docs_table(&DOCS.replace("`op_timeout_ms`", "-"), DOCUMENTED);
    }

    #[test]
    fn bad_escapes_are_errors_that_do_not_quote_the_text() {
        for bad in ["pw%zzw", "pw%2", "pw%", "pw%C3%28"] {
            let err = percent_decode(bad, "the password").unwrap_err().to_string();
            assert!(err.contains("the password") && !err.contains("pw"), "{err}");
        }
        assert_eq!(percent_decode("p%40ss%3Aw%2F", "x").unwrap(), "p@ss:w/");
        assert!(UrlOptions::parse("test", "ca_file=%zz", KNOWN).is_err());
    }
}
