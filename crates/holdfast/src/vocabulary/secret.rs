//! A credential that never prints.

use std::fmt;

/// A password or other credential taken from a store URL.
///
/// `Debug` prints `***`, so a config, an error or a log line that formats
/// one cannot leak it. There is no `Display`: `format!("{user}:{secret}")`
/// does not compile, rather than silently building a wrong credential. The
/// value is reachable only through [`expose`](Secret::expose), which is the
/// one place to look for when auditing where credentials go.
///
/// ```
/// let password = holdfast::Secret::new("hunter2");
/// assert_eq!(format!("{password:?}"), "***");
/// assert_eq!(password.expose(), "hunter2");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The credential itself, for handing to the store's client library.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWORD: &str = "hunter2-do-not-print";

    #[test]
    fn secret_prints_stars_only() {
        let s = Secret::new(PASSWORD);
        for shown in [format!("{s:?}"), format!("{s:#?}"), format!("{:?}", Some(s.clone()))] {
            assert!(!shown.contains(PASSWORD) && shown.contains("***"), "{shown}");
        }
        assert_eq!(s.expose(), PASSWORD);
    }

    /// Every store's config, built from a URL with a password, formatted with
    /// `{:?}` and `{:#?}`: the password must not appear.
    #[test]
    fn configs_never_print_passwords() {
        #[allow(unused_mut)]
        let mut shown: Vec<(&str, String)> = Vec::new();
        #[cfg(feature = "redis")]
        {
            let c = crate::stores::redis::RedisConfig::from_url(&format!("redis://u:{PASSWORD}@h:1/0")).unwrap();
            shown.push(("redis", format!("{c:?} {c:#?}")));
        }
        #[cfg(feature = "etcd")]
        {
            let c = crate::stores::etcd::EtcdConfig::from_url(&format!("etcd://u:{PASSWORD}@h:1")).unwrap();
            assert_eq!(c.password(), Some(PASSWORD));
            shown.push(("etcd", format!("{c:?} {c:#?}")));
        }
        #[cfg(feature = "zookeeper")]
        {
            let c = crate::stores::zookeeper::ZkConfig::from_url(&format!("zk://u:{PASSWORD}@h:1")).unwrap();
            shown.push(("zookeeper", format!("{c:?} {c:#?}")));
        }
        #[cfg(feature = "postgres")]
        {
            let listen = format!("postgres%3A%2F%2Fu%3A{PASSWORD}%40direct%2Fdb");
            let c = crate::stores::postgres::PostgresConfig::from_url(&format!(
                "postgres://u:{PASSWORD}@h/db?listen_url={listen}"
            ))
            .unwrap();
            shown.push(("postgres", format!("{c:?} {c:#?}")));
        }
        #[cfg(feature = "mysql")]
        {
            let c = crate::stores::mysql::MysqlConfig::from_url(&format!("mysql://u:{PASSWORD}@h/db")).unwrap();
            assert_eq!(c.password(), Some(PASSWORD));
            shown.push(("mysql", format!("{c:?} {c:#?}")));
        }
        for (store, text) in shown {
            assert!(!text.contains(PASSWORD), "{store} config prints its password: {text}");
            assert!(!text.contains("hunter2"), "{store} config prints part of its password: {text}");
        }
    }
}
