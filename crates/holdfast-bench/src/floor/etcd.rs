//! etcd floor: one transaction `if create_revision(key) == 0 then put(key,
//! token, lease)` to acquire, one transaction `if value(key) == token then
//! delete(key)` to release, with the plain `etcd-client`. The expiry is an
//! etcd lease per TTL (in whole seconds, as etcd counts), granted once and
//! kept alive in the background, as a hand-written etcd lock would: a lease
//! grant per cycle would be a third request.
//!
//! Its read-write lock is one transaction a call too, barging as the mutex
//! does: a reader puts `<key>\0r\0<token>` if `<key>\0w` does not exist; a
//! writer puts `<key>\0w` if it does not exist and no key has the readers'
//! prefix (a compare over a range holds for every key in it, and for none);
//! the release deletes the writer key if it holds the token, else the
//! token's reader key. etcd's lease expiry frees either, as for the mutex.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
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

    /// The read-write floor's writer key of `key`, and the prefix of its
    /// reader keys (`\0` cannot end a bench key, so no key's keys fall under
    /// another's prefix).
    fn rw_keys(key: &str) -> (String, String) {
        (format!("{key}\0w"), format!("{key}\0r\0"))
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
        "etcd-client: txn(create_revision == 0 -> put with lease) + txn(value == token -> delete); \
         read-write: txn(no writer [and no reader] -> put with lease) + txn(writer == token -> delete, else delete reader)"
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

    async fn acquire_rw(&self, key: &str, token: OwnerToken, ttl: Duration, write: bool) -> Result<bool> {
        let lease = Some(PutOptions::new().with_lease(self.lease(ttl).await?));
        let (writer, readers) = Self::rw_keys(key);
        let no_writer = Compare::create_revision(writer.as_str(), CompareOp::Equal, 0);
        let txn = if write {
            let no_reader = Compare::create_revision(readers, CompareOp::Equal, 0).with_prefix();
            Txn::new().when([no_writer, no_reader]).and_then([TxnOp::put(writer, token.to_hex(), lease)])
        } else {
            Txn::new().when([no_writer]).and_then([TxnOp::put(format!("{readers}{}", token.to_hex()), "", lease)])
        };
        let mut client = self.client.clone();
        Ok(timed(client.txn(txn)).await?.succeeded())
    }

    async fn release_rw(&self, key: &str, token: OwnerToken) -> Result<bool> {
        let (writer, readers) = Self::rw_keys(key);
        let txn = Txn::new()
            .when([Compare::value(writer.as_str(), CompareOp::Equal, token.to_hex())])
            .and_then([TxnOp::delete(writer.as_str(), None)])
            .or_else([TxnOp::delete(format!("{readers}{}", token.to_hex()), None)]);
        let mut client = self.client.clone();
        let reply = timed(client.txn(txn)).await?;
        let deleted = match reply.op_responses().first() {
            Some(TxnOpResponse::Delete(d)) => d.deleted() > 0,
            _ => false,
        };
        Ok(reply.succeeded() || deleted)
    }
}
