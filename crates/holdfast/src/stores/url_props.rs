//! Property tests of URL and option parsing (`url.rs`, `url_options.rs` and
//! each store's `config.rs`): arbitrary text never panics and is either
//! accepted or refused with a typed `InvalidInput`; options written from
//! valid parts read back; no password from a URL shows in a parsed
//! config's `Debug`, in an error, or in `redact_url`'s output.

use std::fmt::Debug;
use std::time::Duration;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use proptest::prelude::*;

use crate::vocabulary::prop_support::config;
use proptest::test_runner::TestCaseError;

use super::*;
use crate::vocabulary::url_options::{Opt, UrlOptions};

/// Carried by every word of a generated password; output that contains it
/// shows (part of) the password.
const MARK: &str = "PWMARK";

/// A password: marked words between characters a password may hold
/// unencoded (`/`, `@` and `:`, which `redact_url`'s docs name, and RFC
/// 3986's sub-delims), digits (so one can start like a port) and
/// %-escapes.
fn password() -> impl Strategy<Value = String> {
    let parts = || {
        prop::collection::vec(
            prop_oneof![
                3 => "[a-z0-9]{0,3}".prop_map(|s| format!("{MARK}{s}")),
                2 => "[/@:!$'()*+,;=~._-]{1,2}",
                1 => "[0-9]{1,5}",
                1 => "%[0-9A-F]{2}",
            ],
            0..3,
        )
    };
    // At least one marked word, anywhere.
    (parts(), "[a-z0-9]{0,3}", parts())
        .prop_map(|(before, word, after)| format!("{}{MARK}{word}{}", before.concat(), after.concat()))
}

/// What follows the credentials: hosts, maybe a path, maybe a query, each
/// well-formed or not.
fn after_credentials() -> impl Strategy<Value = String> {
    let hosts =
        prop_oneof!["[a-z]{1,6}(:[0-9]{1,5})?(,[a-z]{1,6}:[0-9]{1,4})?", "\\[::1\\]:[0-9]{1,4}", "[a-z:,.]{0,8}"];
    let path = prop_oneof![Just(String::new()), "/[a-z]{1,6}", "/[a-z/@.]{0,8}"];
    let query = prop_oneof![
        Just(String::new()),
        "\\?(timeout_ms=[0-9]{1,6}|namespace=[a-z]{1,4}|nope=1|sslmode=[a-z]{1,4})",
        "\\?[a-z_=&%]{0,12}",
    ];
    (hosts, path, query).prop_map(|(h, p, q)| format!("{h}{p}{q}"))
}

/// A URL of `scheme` with `user:password@` and arbitrary rest.
fn url_with_password(scheme: &'static str) -> impl Strategy<Value = (String, String)> {
    ("[a-z]{1,5}", password(), after_credentials())
        .prop_map(move |(user, pass, rest)| (format!("{scheme}://{user}:{pass}@{rest}"), pass))
}

/// Checks that a parse of a URL carrying a marked password shows none of
/// it, accepted or not, and that a refusal is a typed URL error.
// Used by the stores whose features are on; with the default features alone, by none.
#[cfg_attr(
    not(any(feature = "zookeeper", feature = "etcd", feature = "redis", feature = "mysql", feature = "postgres")),
    allow(dead_code)
)]
fn password_hidden<T: Debug>(url: &str, parsed: &Result<T>) -> Result<(), TestCaseError> {
    let shown = match parsed {
        Ok(config) => format!("{config:?}"),
        Err(err) => format!("{err} {err:?}"),
    };
    prop_assert!(!shown.contains(MARK), "{} shows its password: {}", url, shown);
    prop_assert!(!redact_url(url).contains(MARK), "redact_url({:?}) = {:?}", url, redact_url(url));
    if let Err(err) = parsed {
        prop_assert!(matches!(err, Error::InvalidInput { what: "url", .. }), "{}: {:?}", url, err);
    }
    Ok(())
}

/// Checks that arbitrary text is accepted or refused with a typed URL error.
fn typed<T: Debug>(url: &str, parsed: Result<T>) -> Result<(), TestCaseError> {
    if let Err(err) = parsed {
        prop_assert!(matches!(err, Error::InvalidInput { what: "url", .. }), "{:?}: {:?}", url, err);
    }
    Ok(())
}

/// Arbitrary text, and arbitrary text after each scheme.
fn any_url() -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(vec!["sqlite", "redis", "rediss", "etcd", "etcds", "zk", "postgres", "mysql"]);
    prop_oneof![
        text(0, 40),
        (scheme.clone(), text(0, 40)).prop_map(|(s, rest)| format!("{s}://{rest}")),
        (scheme, "[a-z0-9:@/?&=%,\\[\\]._-]{0,40}").prop_map(|(s, rest)| format!("{s}://{rest}")),
    ]
}

const KNOWN: &[Opt] = &[
    Opt::new("timeout_ms").or(&["op_timeout_ms"]),
    Opt::new("session_timeout_ms").or_seconds(&["session_ttl"]),
    Opt::new("namespace"),
    Opt::new("flag"),
    Opt::pass_through("application_name"),
];

/// Any text of up to `max` characters (cheaper to generate than a regex).
fn text(min: usize, max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), min..=max).prop_map(|chars| chars.into_iter().collect())
}

fn encode(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}

proptest! {
    #![proptest_config(config())]

    /// `redact_url` never panics, and hides a marked password in any URL
    /// of the `scheme://user:password@rest` shape.
    #[test]
    fn redact_url_hides_every_password(any_text in text(0, 40), (url, pass) in url_with_password("x")) {
        let _ = redact_url(&any_text);
        prop_assert!(!redact_url(&url).contains(MARK), "{:?} -> {:?}", url, redact_url(&url));
        // Without a scheme, `u://pw@h` is a scheme and a user: a password
        // starting with `//` cannot be told from one.
        let schemeless = url.trim_start_matches("x://");
        prop_assert!(pass.starts_with("//") || !redact_url(schemeless).contains(MARK), "{:?}", schemeless);
    }

    /// Arbitrary option strings never panic; a refusal is a typed URL
    /// error, and so is any getter's refusal of a value.
    #[test]
    fn options_parse_or_refuse_typed(query in prop_oneof![text(0, 30), "[a-z_%0-9=&]{0,30}"]) {
        match UrlOptions::parse("test", &query, KNOWN) {
            Ok(o) => {
                typed(&query, o.duration_ms("timeout_ms", 1..=1000))?;
                typed(&query, o.duration_ms("session_timeout_ms", 1..=u64::MAX))?;
                typed(&query, o.flag("flag"))?;
                typed(&query, o.path("namespace"))?;
                typed(&query, o.number("namespace", 0u8..=9))?;
            }
            Err(err) => typed(&query, Err::<(), _>(err))?,
        }
    }

    /// Options written from any values (%-encoded) read back as written,
    /// the last one of a repeated option counting; pass-through ones are
    /// kept as written.
    #[test]
    fn options_round_trip(
        values in prop::collection::vec((0usize..4, text(0, 12)), 0..6),
        app in text(0, 12),
    ) {
        let names = ["timeout_ms", "op_timeout_ms", "namespace", "flag"];
        let mut pieces: Vec<String> = values.iter().map(|(n, v)| format!("{}={}", names[*n], encode(v))).collect();
        pieces.push(format!("application_name={}", encode(&app)));
        let o = UrlOptions::parse("test", &pieces.join("&"), KNOWN).expect("valid options");
        let last = |common: &str| values.iter().rev().find(|(n, _)| names[*n].ends_with(common)).map(|(_, v)| v.as_str());
        prop_assert_eq!(o.str("timeout_ms"), last("timeout_ms"));
        prop_assert_eq!(o.str("namespace"), last("namespace"));
        prop_assert_eq!(o.str("flag"), last("flag"));
        prop_assert_eq!(o.pass_through(), vec![pieces.last().expect("pushed").as_str()]);
    }

    /// Whole milliseconds and seconds read back within range, and are
    /// refused (typed) outside it, without overflow at `u64::MAX`.
    #[test]
    fn durations_read_back(n in prop_oneof![any::<u64>(), 0u64..5000], seconds in any::<bool>()) {
        let name = if seconds { "session_ttl" } else { "session_timeout_ms" };
        let o = UrlOptions::parse("test", &format!("{name}={n}"), KNOWN).expect("valid options");
        let ms = if seconds { n.checked_mul(1000) } else { Some(n) };
        match (o.duration_ms("session_timeout_ms", 1..=86_400_000), ms.filter(|ms| (1..=86_400_000).contains(ms))) {
            (Ok(Some(d)), Some(ms)) => prop_assert_eq!(d, Duration::from_millis(ms)),
            (Err(Error::InvalidInput { what: "url", .. }), None) => {}
            (got, want) => prop_assert!(false, "{}={}: {:?}, want {:?}", name, n, got, want),
        }
    }
}

#[cfg(feature = "zookeeper")]
mod zookeeper {
    use super::*;
    use crate::stores::zookeeper::ZkConfig;

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn zk_urls_parse_or_refuse_typed(url in any_url()) {
            typed(&url, ZkConfig::from_url(&url))?;
        }

        #[test]
        fn zk_urls_hide_passwords((url, _) in url_with_password("zk")) {
            password_hidden(&url, &ZkConfig::from_url(&url))?;
        }

        /// A URL written from valid parts gives back its hosts, credentials,
        /// root and durations.
        #[test]
        fn zk_urls_round_trip(
            hosts in prop::collection::vec(("[a-z][a-z0-9.-]{0,8}", 1u16..), 1..4),
            user in text(1, 8),
            pass in text(0, 12),
            chroot in prop::option::of("(/[a-z0-9._-]{0,5}[a-z0-9]){1,3}"),
            namespace in prop::option::of("(/[a-z0-9]{1,5}){1,3}"),
            (timeout, session, poll) in (1u64..=3_600_000, 1u64..=3_600_000, 1u64..=3_600_000),
        ) {
            let hosts: Vec<String> = hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect();
            let chroot = chroot.unwrap_or_default();
            let mut url = format!("zk://{}:{}@{}{chroot}", encode(&user), encode(&pass), hosts.join(","));
            url.push_str(&format!("?timeout_ms={timeout}&session_timeout_ms={session}&poll_max_ms={poll}"));
            if let Some(ns) = &namespace {
                url.push_str(&format!("&namespace={}", encode(ns)));
            }
            let c = ZkConfig::from_url(&url).map_err(|e| TestCaseError::fail(format!("{url}: {e}")))?;
            prop_assert_eq!(&c.hosts, &hosts);
            prop_assert_eq!(c.credentials.as_ref().map(|(u, p)| (u.as_str(), p.expose())), Some((user.as_str(), pass.as_str())));
            prop_assert_eq!(c.root, format!("{chroot}{}", namespace.as_deref().unwrap_or("/holdfast/locks")));
            prop_assert_eq!(
                (c.timeout, c.session_timeout, c.poll),
                (Duration::from_millis(timeout), Duration::from_millis(session), Duration::from_millis(poll))
            );
        }
    }
}

#[cfg(feature = "etcd")]
mod etcd {
    use super::*;
    use crate::stores::etcd::EtcdConfig;

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn etcd_urls_parse_or_refuse_typed(url in any_url()) {
            typed(&url, EtcdConfig::from_url(&url))?;
        }

        #[test]
        fn etcd_urls_hide_passwords((url, _) in url_with_password("etcd")) {
            password_hidden(&url, &EtcdConfig::from_url(&url))?;
        }

        #[test]
        fn etcd_urls_round_trip(
            hosts in prop::collection::vec(("[a-z][a-z0-9.-]{0,8}", 1u16..), 1..4),
            user in text(1, 8),
            pass in text(0, 12),
            namespace in "[a-z/]{1,8}",
            (timeout, session_s) in (1u64..=86_400_000, 1u64..=86_400),
            tls in any::<bool>(),
        ) {
            let scheme = if tls { "etcds" } else { "etcd" };
            let hosts: Vec<String> = hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect();
            let url = format!(
                "{scheme}://{}:{}@{}/?namespace={}&timeout_ms={timeout}&session_ttl={session_s}",
                encode(&user), encode(&pass), hosts.join(","), encode(&namespace)
            );
            let c = EtcdConfig::from_url(&url).map_err(|e| TestCaseError::fail(format!("{url}: {e}")))?;
            let http = if tls { "https" } else { "http" };
            prop_assert_eq!(&c.endpoints, &hosts.iter().map(|h| format!("{http}://{h}")).collect::<Vec<_>>());
            prop_assert_eq!((c.user.as_deref(), c.password()), (Some(user.as_str()), Some(pass.as_str())));
            prop_assert_eq!((c.prefix, c.timeout, c.session_ttl_secs), (namespace, Duration::from_millis(timeout), session_s as i64));
        }
    }
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use crate::stores::redis::RedisConfig;

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn redis_urls_parse_or_refuse_typed(url in any_url()) {
            typed(&url, RedisConfig::from_url(&url))?;
        }

        #[test]
        fn redis_urls_hide_passwords((url, _) in url_with_password("redis")) {
            password_hidden(&url, &RedisConfig::from_url(&url))?;
        }

        #[test]
        fn redis_urls_round_trip(
            namespace in "[a-z0-9/_-]{1,64}",
            (timeout, fence_keep) in (1u64..=86_400_000, 1u64..=86_400_000),
            (poll_min, poll_extra) in (1u64..=1_000_000, 0u64..=1_000_000),
            renew_batch in 1usize..=100_000,
            db in prop::option::of(0u32..16),
        ) {
            let db = db.map(|d| format!("/{d}")).unwrap_or_default();
            let url = format!(
                "redis://h:6379{db}?namespace={}&timeout_ms={timeout}&fence_keep_ms={fence_keep}\
                 &poll_min_ms={poll_min}&poll_max_ms={}&renew_batch={renew_batch}",
                encode(&namespace), poll_min + poll_extra
            );
            let c = RedisConfig::from_url(&url).map_err(|e| TestCaseError::fail(format!("{url}: {e}")))?;
            prop_assert_eq!(c.prefix, namespace);
            prop_assert_eq!((c.timeout, c.connect_timeout), (Duration::from_millis(timeout), Duration::from_millis(timeout)));
            prop_assert_eq!(c.fence_keep, Duration::from_millis(fence_keep));
            prop_assert_eq!((c.poll.min, c.poll.max), (Duration::from_millis(poll_min), Duration::from_millis(poll_min + poll_extra)));
            prop_assert_eq!(c.renew_batch, renew_batch);
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use crate::stores::mysql::MysqlConfig;

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn mysql_urls_parse_or_refuse_typed(url in any_url()) {
            typed(&url, MysqlConfig::from_url(&url))?;
        }

        #[test]
        fn mysql_urls_hide_passwords((url, _) in url_with_password("mysql")) {
            password_hidden(&url, &MysqlConfig::from_url(&url))?;
        }

        #[test]
        fn mysql_urls_round_trip(
            host in "[a-z][a-z0-9.-]{0,8}",
            port in 1u16..,
            user in text(1, 8),
            pass in text(0, 12),
            database in "[^/]{1,10}",
            namespace in "[a-zA-Z_][a-zA-Z0-9_]{0,47}",
            pool in 1usize..=1024,
        ) {
            let url = format!(
                "mysql://{}:{}@{host}:{port}/{}?namespace={namespace}&pool_size={pool}",
                encode(&user), encode(&pass), encode(&database)
            );
            let c = MysqlConfig::from_url(&url).map_err(|e| TestCaseError::fail(format!("{url}: {e}")))?;
            prop_assert_eq!((c.host.as_str(), c.port, c.user.as_str()), (host.as_str(), port, user.as_str()));
            prop_assert_eq!(c.password(), Some(pass.as_str()));
            prop_assert_eq!((c.database, c.namespace, c.pool_max), (database, namespace, pool));
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use crate::stores::postgres::PostgresConfig;

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn postgres_urls_parse_or_refuse_typed(url in any_url()) {
            typed(&url, PostgresConfig::from_url(&url))?;
        }

        #[test]
        fn postgres_urls_hide_passwords((url, _) in url_with_password("postgres")) {
            password_hidden(&url, &PostgresConfig::from_url(&url))?;
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use crate::stores::sqlite::SqliteConfig;

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn sqlite_urls_parse_or_refuse_typed(url in any_url()) {
            typed(&url, SqliteConfig::from_url(&url))?;
        }
    }
}

/// Cases the properties found, each a password that was shown: in an
/// error, in a parsed config's `Debug`, or by `redact_url`.
mod found {
    use super::*;

    /// `redact_url` and `connect` took the text before the first `://`
    /// anywhere as the scheme, so a schemeless URL with a nested URL in its
    /// query (or its host) was echoed with its password.
    #[tokio::test]
    async fn text_before_a_nested_scheme_is_no_scheme() {
        for url in ["a:PWMARK@://", "app:PWMARK@h/x?u=redis://h"] {
            assert!(!redact_url(url).contains(MARK), "{url}: {}", redact_url(url));
            let err = connect(url).await.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("no scheme") && !err.contains(MARK), "{url}: {err}");
        }
        assert_eq!(redact_url("x+y.z-1://u:pw@h"), "x+y.z-1://u:***@h");
    }

    /// An unencoded `/` in a password ended the authority: the piece
    /// before it was quoted as a host or port, the rest taken as a chroot
    /// or database (and shown by `Debug`).
    #[test]
    fn a_slash_in_a_password_is_never_quoted() {
        #[allow(unused_mut)]
        let mut shown: Vec<(&str, String)> = Vec::new();
        #[cfg(feature = "zookeeper")]
        for url in ["zk://a:PWMARK/@a", "zk://u:123/PWMARK@h:1", "zk://u:p@h:1/PWMARK/x@h"] {
            shown.push((url, format!("{:?}", crate::stores::zookeeper::ZkConfig::from_url(url))));
        }
        #[cfg(feature = "mysql")]
        for url in ["mysql://a:PWMARK/@a", "mysql://u:123/PWMARK@h"] {
            shown.push((url, format!("{:?}", crate::stores::mysql::MysqlConfig::from_url(url))));
        }
        #[cfg(feature = "redis")]
        for url in ["redis://a:/PWMARK@a", "redis://u:p@h/PWMARK@x"] {
            shown.push((url, format!("{:?}", crate::stores::redis::RedisConfig::from_url(url))));
        }
        for (url, text) in shown {
            assert!(text.starts_with("Err(InvalidInput") && !text.contains(MARK), "{url}: {text}");
        }
    }

    /// tokio-postgres ends the credentials at the first `@`, so the rest of
    /// a password with an `@` became the host, shown by `Debug`.
    #[cfg(feature = "postgres")]
    #[test]
    fn an_at_sign_in_a_postgres_password_is_refused() {
        use crate::stores::postgres::PostgresConfig;
        let text = format!("{:?}", PostgresConfig::from_url("postgres://a:@PWMARK@h/db"));
        assert!(text.starts_with("Err(InvalidInput") && !text.contains(MARK), "{text}");
        let encoded = PostgresConfig::from_url("postgres://a:%40PWMARK@h/db%40x").expect("%40 is fine");
        assert_eq!(encoded.connection_config().get_password(), Some("@PWMARK".as_bytes()));
        assert_eq!(encoded.connection_config().get_dbname(), Some("db@x"));
    }
}
