//! The one place where a URL scheme picks a store.

use std::sync::Arc;

use crate::backend::Backend;
use crate::error::{Error, Result};

/// The stores holdfast knows, by URL scheme, with the cargo feature each needs.
pub const SCHEMES: &[(&str, &str)] = &[
    ("sqlite", "sqlite"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("etcd", "etcd"),
    ("etcds", "etcd"),
    ("zk", "zookeeper"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
];

/// Connects to the store `url` names.
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(Error::invalid(
            "url",
            format!("{url:?} has no scheme; expected for example sqlite:///path/to/locks.db"),
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    match scheme.as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(crate::backend::sqlite::SqliteBackend::open_url(url).await?)),
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Ok(Arc::new(crate::backend::etcd::EtcdBackend::open_url(url).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(crate::backend::postgres::PostgresBackend::open_url(url).await?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(Arc::new(crate::backend::redis::RedisBackend::open_url(url).await?)),
        #[cfg(feature = "mysql")]
        "mysql" => Ok(Arc::new(crate::backend::mysql::MysqlBackend::open_url(url).await?)),
        #[cfg(feature = "zookeeper")]
        "zk" => Ok(Arc::new(crate::backend::zookeeper::ZkBackend::connect_url(url).await?)),
        other => match SCHEMES.iter().find(|(s, _)| *s == other) {
            Some((_, feature)) => Err(Error::FeatureDisabled { scheme: other.to_owned(), feature }),
            None => Err(Error::invalid(
                "url",
                format!(
                    "unknown scheme {other:?}; known: {}",
                    SCHEMES.iter().map(|(s, _)| *s).collect::<Vec<_>>().join(", ")
                ),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_urls_are_typed_errors() {
        assert!(matches!(connect("no-scheme").await, Err(Error::InvalidInput { what: "url", .. })));
        assert!(matches!(connect("gopher://x").await, Err(Error::InvalidInput { what: "url", .. })));
        #[cfg(not(feature = "redis"))]
        assert!(matches!(connect("redis://127.0.0.1:1").await, Err(Error::FeatureDisabled { feature: "redis", .. })));
    }
}
