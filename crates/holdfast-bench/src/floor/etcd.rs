//! etcd floor: one transaction `if create_revision(key) == 0 then put(key,
//! token, lease)` to acquire, one transaction `if value(key) == token then
//! delete(key)` to release, with the plain `etcd-client`. The expiry is an
//! etcd lease per TTL (in whole seconds, as etcd counts), granted once and
//! kept alive in the background, as a hand-written etcd lock would: a lease
//! grant per cycle would be a third request.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use holdfast::{Error, OwnerToken, Result};

use super::{Floor, OP_TIMEOUT};

const STORE: &str = "etcd";

async fn timed<T>(f: impl Future<Output = Result<T, etcd_client::Error>>) -> Result<T> {
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(r) => r.map_err(|e| {
            let retryable = matches!(e, etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_));
            Error::backend(STORE, retryable, e)
        }),
        Err(_) => Err(Error::backend(STORE, true, format!("no reply within {OP_TIMEOUT:?}"))),
    }
}

/// The etcd floor.
pub struct EtcdFloor {
    client: etcd_client::Client,
    /// Lease ids by TTL seconds.
    leases: tokio::sync::Mutex<HashMap<i64, i64>>,
}

impl EtcdFloor {
    /// Connects to the endpoints of a holdfast `etcd://host:port[,...]` URL
    /// (plain text, no auth; holdfast's `?options` are dropped).
    pub async fn connect(url: &str) -> Result<Self> {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let hosts = rest.split_once('?').map_or(rest, |(h, _)| h).trim_end_matches('/');
        if hosts.contains('@') || url.starts_with("etcds") {
            return Err(Error::Unsupported {
                store: STORE,
                what: "a raw floor with TLS or auth (run with --no-floor)",
            });
        }
        let endpoints: Vec<String> = hosts.split(',').map(|h| format!("http://{h}")).collect();
        let opts = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(1));
        let client = timed(etcd_client::Client::connect(endpoints, Some(opts))).await?;
        Ok(EtcdFloor { client, leases: tokio::sync::Mutex::default() })
    }

    /// The lease for `ttl` (rounded up to whole seconds), granted and kept
    /// alive (every third of its TTL) on first use.
    async fn lease(&self, ttl: Duration) -> Result<i64> {
        let secs = ttl.as_millis().div_ceil(1000).max(1) as i64;
        let mut leases = self.leases.lock().await;
        if let Some(id) = leases.get(&secs) {
            return Ok(*id);
        }
        let mut client = self.client.clone();
        let granted = timed(client.lease_grant(secs, None)).await?;
        let (id, every) = (granted.id(), Duration::from_secs(granted.ttl().max(1) as u64) / 3);
        let (mut keeper, mut stream) = timed(client.lease_keep_alive(id)).await?;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if keeper.keep_alive().await.is_err() || !matches!(stream.message().await, Ok(Some(_))) {
                    return;
                }
            }
        });
        leases.insert(secs, id);
        Ok(id)
    }
}

#[async_trait]
impl Floor for EtcdFloor {
    fn describe(&self) -> &'static str {
        "etcd-client: txn(create_revision == 0 -> put with lease) + txn(value == token -> delete)"
    }

    async fn acquire(&self, key: &str, token: OwnerToken, ttl: Duration) -> Result<bool> {
        let lease = self.lease(ttl).await?;
        let txn = Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([TxnOp::put(
            key,
            token.to_hex(),
            Some(PutOptions::new().with_lease(lease)),
        )]);
        let mut client = self.client.clone();
        Ok(timed(client.txn(txn)).await?.succeeded())
    }

    async fn release(&self, key: &str, token: OwnerToken) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::value(key, CompareOp::Equal, token.to_hex())])
            .and_then([TxnOp::delete(key, None)]);
        let mut client = self.client.clone();
        Ok(timed(client.txn(txn)).await?.succeeded())
    }
}
