//! ZooKeeper floor: `create` of a plain EPHEMERAL node `/holdfast-bench/floor/{key}`
//! to acquire (`NodeExists` = busy), `delete` to release, on one session of the
//! plain `zookeeper-client` with the same hosts, credentials and session
//! timeout as holdfast's URL.
//!
//! No queue, no fence, no watch: a floor waiter polls. The lease is the
//! session, as for every ZooKeeper lock, so the floor ignores the TTL (a key
//! is freed by release or by the end of the session). Release is owner-checked
//! locally: only a node this floor created for `token` (its session owns it)
//! is deleted, with no extra round trip.
//!
//! Its read-write lock has no queue either: a share is an EPHEMERAL child
//! of the key's persistent node `/holdfast-bench/floor-rw/{key}` (`w` for
//! the writer, `r-{token}` for a reader), created and then checked in one
//! round trip (the session's requests run in order, so the check sees the
//! create): a reader is refused if `w` exists, a writer if the node has
//! another child; refused, it deletes its child. Two attempts that clash
//! may both be refused, never both granted: each checks after its own
//! create, so the later check sees the earlier create.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use holdfast::stores::zookeeper::ZkConfig;
use holdfast::{Error, OwnerToken, Result};
use zookeeper_client as zk;

use super::{Floor, OP_TIMEOUT};

const STORE: &str = "zookeeper";
const ROOT: &str = "/holdfast-bench/floor";
const RW_ROOT: &str = "/holdfast-bench/floor-rw";

fn map_err(e: zk::Error) -> Error {
    let retryable =
        matches!(e, zk::Error::ConnectionLoss | zk::Error::Timeout | zk::Error::SessionExpired | zk::Error::NoHosts);
    Error::backend(STORE, retryable, e)
}

async fn timed<T>(f: impl Future<Output = std::result::Result<T, zk::Error>>) -> Result<T> {
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(r) => r.map_err(map_err),
        Err(_) => Err(Error::backend(STORE, true, format!("no reply within {OP_TIMEOUT:?}"))),
    }
}

/// One path segment for a key: letters, digits, `-`, `_` kept, other bytes `%XX`.
fn segment(key: &str) -> String {
    key.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The ZooKeeper floor.
pub struct ZkFloor {
    client: zk::Client,
    acls: zk::Acls<'static>,
    /// Nodes this floor's session created, by key.
    held: Mutex<HashMap<String, OwnerToken>>,
    /// The read-write floor's nodes this session created, by key and token.
    shares: Mutex<HashMap<(String, OwnerToken), String>>,
}

impl ZkFloor {
    /// Opens one session to the ensemble of a `zk://` URL and creates the floor's root.
    pub async fn connect(url: &str) -> Result<Self> {
        let cfg = ZkConfig::from_url(url)?;
        let mut connector = zk::Client::connector().with_session_timeout(cfg.session_timeout).with_fail_eagerly();
        if let Some((user, pass)) = &cfg.credentials {
            connector = connector.with_auth("digest", format!("{user}:{}", pass.expose()).as_bytes());
        }
        let client = timed(connector.connect(&cfg.connect_string())).await?;
        let acls = if cfg.credentials.is_some() { zk::Acls::creator_all() } else { zk::Acls::anyone_all() };
        match timed(client.mkdir(ROOT, &zk::CreateMode::Persistent.with_acls(acls))).await {
            Ok(()) => {}
            Err(e) => return Err(e),
        }
        Ok(ZkFloor { client, acls, held: Mutex::default(), shares: Mutex::default() })
    }

    /// Deletes a node this session created; `false` if it was gone.
    async fn delete(&self, path: &str) -> Result<bool> {
        match tokio::time::timeout(OP_TIMEOUT, self.client.delete(path, None)).await {
            Ok(Ok(())) => Ok(true),
            Ok(Err(zk::Error::NoNode)) => Ok(false),
            Ok(Err(e)) => Err(map_err(e)),
            Err(_) => Err(Error::backend(STORE, true, format!("no reply within {OP_TIMEOUT:?}"))),
        }
    }

    /// One attempt at `path` (a child of `dir`), checked in the same round
    /// trip by `clashes` on the stat of `check`: `Some(granted)`, or `None`
    /// if `dir` does not exist yet.
    async fn create_checked(
        &self,
        dir: &str,
        path: &str,
        check: &str,
        clashes: fn(&zk::Stat) -> bool,
    ) -> Result<Option<bool>> {
        let options = zk::CreateMode::Ephemeral.with_acls(self.acls);
        // Both sent before either is awaited: one round trip, in order.
        let created = self.client.create(path, &[], &options);
        let checked = self.client.check_stat(check);
        let (created, checked) = timed_pair(created, checked).await?;
        match created {
            Ok(_) => {}
            Err(zk::Error::NodeExists) => return Ok(Some(false)),
            Err(zk::Error::NoNode) => {
                timed(self.client.mkdir(dir, &zk::CreateMode::Persistent.with_acls(self.acls))).await?;
                return Ok(None);
            }
            Err(e) => return Err(map_err(e)),
        }
        if checked.map_err(map_err)?.is_some_and(|stat| clashes(&stat)) {
            self.delete(path).await?;
            return Ok(Some(false));
        }
        Ok(Some(true))
    }
}

/// Two replies awaited together within [`OP_TIMEOUT`].
async fn timed_pair<A, B>(a: impl Future<Output = A>, b: impl Future<Output = B>) -> Result<(A, B)> {
    tokio::time::timeout(OP_TIMEOUT, async { tokio::join!(a, b) })
        .await
        .map_err(|_| Error::backend(STORE, true, format!("no reply within {OP_TIMEOUT:?}")))
}

#[async_trait]
impl Floor for ZkFloor {
    fn describe(&self) -> &'static str {
        "zookeeper-client session: create EPHEMERAL + delete; read-write: create EPHEMERAL child and, in the \
         same round trip, stat the writer (or the node's children), delete it if refused + delete"
    }

    async fn acquire(&self, key: &str, token: OwnerToken, _ttl: Duration) -> Result<bool> {
        let path = format!("{ROOT}/{}", segment(key));
        let options = zk::CreateMode::Ephemeral.with_acls(self.acls);
        match tokio::time::timeout(OP_TIMEOUT, self.client.create(&path, &token.to_bytes(), &options)).await {
            Ok(Ok(_)) => {
                self.held.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_owned(), token);
                Ok(true)
            }
            Ok(Err(zk::Error::NodeExists)) => Ok(false),
            Ok(Err(e)) => Err(map_err(e)),
            Err(_) => Err(Error::backend(STORE, true, format!("no reply within {OP_TIMEOUT:?}"))),
        }
    }

    async fn release(&self, key: &str, token: OwnerToken) -> Result<bool> {
        {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            if held.get(key) != Some(&token) {
                return Ok(false);
            }
            held.remove(key);
        }
        let path = format!("{ROOT}/{}", segment(key));
        self.delete(&path).await
    }

    async fn acquire_rw(&self, key: &str, token: OwnerToken, _ttl: Duration, write: bool) -> Result<bool> {
        let dir = format!("{RW_ROOT}/{}", segment(key));
        let writer = format!("{dir}/w");
        let (path, check, clashes): (String, &str, fn(&zk::Stat) -> bool) = if write {
            // The writer's own node is one of the children it counts.
            (writer.clone(), &dir, |stat| stat.num_children > 1)
        } else {
            (format!("{dir}/r-{}", token.to_hex()), &writer, |_| true)
        };
        let granted = match self.create_checked(&dir, &path, check, clashes).await? {
            Some(granted) => granted,
            None => self.create_checked(&dir, &path, check, clashes).await?.unwrap_or(false),
        };
        if granted {
            self.shares.lock().unwrap_or_else(|p| p.into_inner()).insert((key.to_owned(), token), path);
        }
        Ok(granted)
    }

    async fn release_rw(&self, key: &str, token: OwnerToken) -> Result<bool> {
        let path = self.shares.lock().unwrap_or_else(|p| p.into_inner()).remove(&(key.to_owned(), token));
        let Some(path) = path else { return Ok(false) };
        self.delete(&path).await
    }
}
