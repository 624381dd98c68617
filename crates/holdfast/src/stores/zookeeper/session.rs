//! The ZooKeeper session behind every grant of one client, and the task that
//! decides when it can no longer vouch for them.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use super::config::ZkAuth;
use super::{STORE, ZkConfig, map_err, nodes, timed};
use crate::vocabulary::error::{Error, Result};

/// One ZooKeeper session: the lease behind every grant this client holds.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) client: zk::Client,
    /// The session id, which ZooKeeper stamps on every ephemeral node it
    /// owns (`ephemeralOwner`).
    pub(super) id: i64,
    /// Cancelled once this session can no longer vouch for its grants:
    /// expired, closed, auth failed, or disconnected for longer than
    /// `session timeout / 4` (see `docs.md` for why that is before the
    /// ensemble can expire it). A lost session is abandoned: it is dropped
    /// from [`Sessions`], and closes (deleting its nodes) once nothing uses
    /// it, or expires if it cannot reach the ensemble any more.
    pub(super) lost: CancellationToken,
}

impl Session {
    /// True if a grant observed now can be believed: connected, not lost.
    pub(super) fn vouches(&self) -> bool {
        !self.lost.is_cancelled() && self.client.state() == zk::SessionState::SyncConnected
    }

    /// `Ok` if requests can be sent now; a retryable error otherwise. A
    /// request on a disconnected session would wait for the reconnection,
    /// while the client's waiting policy and release retries want to hear
    /// at once that the store is unreachable.
    pub(super) fn ready(&self) -> Result<()> {
        if self.lost.is_cancelled() {
            return Err(Error::backend(
                STORE,
                true,
                "the ZooKeeper session was lost (ended, or disconnected too long)",
            ));
        }
        match self.client.state() {
            zk::SessionState::SyncConnected => Ok(()),
            state => Err(Error::backend(STORE, true, format!("the ZooKeeper session is {state}; not sending"))),
        }
    }

    /// True once the session is over for the ensemble too (expired,
    /// closed, refused): its ephemeral nodes are gone or going.
    pub(super) fn ended(&self) -> bool {
        matches!(
            self.client.state(),
            zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
        )
    }

    /// How long after sending a request that the ensemble answered on this
    /// session the session is sure to live, even if the ensemble hears
    /// nothing more from the client: the negotiated timeout `T`, less the
    /// quarter that the disconnect grace also allows, kept in hand for the
    /// ensemble's tick-granular expiry and for clock rates.
    pub(super) fn lease_bound(&self) -> Duration {
        let timeout = self.client.session_timeout();
        timeout - timeout / 4
    }
}

/// The current session of one client, opened on demand.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    /// The current session; a std mutex held only to clone or swap the Arc.
    current: Mutex<Option<Arc<Session>>>,
    /// Held while a new session is opened, so only one is.
    connecting: tokio::sync::Mutex<()>,
    shutdown: CancellationToken,
}

impl Drop for Sessions {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Sessions {
    /// The current session, or a new one if there is none or it was lost.
    pub(super) async fn get(self: &Arc<Self>, config: &ZkConfig) -> Result<Arc<Session>> {
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let _one = self.connecting.lock().await;
        if let Some(s) = self.live() {
            return Ok(s);
        }
        let session = Arc::new(self.open(config).await?);
        // The lost session this replaces (if its watcher has not dropped it
        // yet) is dropped here, outside the lock, and closes once unused.
        let lost_one = self.current.lock().unwrap_or_else(|p| p.into_inner()).replace(session.clone());
        drop(lost_one);
        Ok(session)
    }

    /// The current session if it is not lost.
    pub(super) fn live(&self) -> Option<Arc<Session>> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().filter(|s| !s.lost.is_cancelled()).cloned()
    }

    /// Drops session `id` if it is the current one, so that it closes as
    /// soon as no request uses it.
    fn abandon(&self, id: i64) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let abandoned = current.take_if(|s| s.id == id);
        drop(current);
        drop(abandoned);
    }

    async fn open(self: &Arc<Self>, cfg: &ZkConfig) -> Result<Session> {
        let mut connector = zk::Client::connector().with_session_timeout(cfg.session_timeout).with_fail_eagerly();
        match (&cfg.credentials, cfg.auth) {
            (Some((user, pass)), ZkAuth::Digest) => {
                connector = connector.with_auth("digest", format!("{user}:{}", pass.expose()).as_bytes());
            }
            (Some((user, pass)), ZkAuth::Sasl) => {
                let options = zk::SaslOptions::digest_md5(user.clone(), pass.expose().to_owned());
                connector = connector.with_sasl(options);
            }
            (None, _) => {}
        }
        let hosts = cfg.connect_string();
        if cfg.tls.is_some() {
            // The client crate's `tls` feature brings rustls's aws-lc-rs
            // provider beside the ring one the other stores use; rustls then
            // cannot pick a process default and panics in their TLS (and in
            // the application's). Refused until the crate can take ring.
            return Err(Error::Unsupported {
                store: STORE,
                what: "TLS to ZooKeeper (zks://): the client crate's TLS needs a second rustls crypto provider",
            });
        }
        let client = timed(cfg.timeout, "connect", connector.connect(&hosts)).await?.map_err(map_err)?;
        let id = client.session_id().0;
        let lost = CancellationToken::new();
        watch(&client, id, lost.clone(), Arc::downgrade(self));
        let options = zk::CreateMode::Persistent.with_acls(nodes::acls(cfg.credentials.is_some()));
        // Look first: an identity with read-only rights (status, monitoring)
        // must not need the right to create the root.
        if timed(cfg.timeout, "stat root", client.check_stat(&cfg.root)).await?.map_err(map_err)?.is_none() {
            match timed(cfg.timeout, "create root", client.mkdir(&cfg.root, &options)).await? {
                Ok(()) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(map_err(e)),
            }
        }
        tracing::debug!(session = ?client.session_id(), timeout = ?client.session_timeout(), "zookeeper session");
        Ok(Session { client, id, lost })
    }
}

/// Follows the session's state: terminal states, or a disconnection longer
/// than a quarter of the negotiated session timeout, cancel `lost` and
/// abandon the session.
fn watch(client: &zk::Client, id: i64, lost: CancellationToken, sessions: Weak<Sessions>) {
    let mut watcher = client.state_watcher();
    let grace = client.session_timeout() / 4;
    let mut since = (client.state() != zk::SessionState::SyncConnected).then(Instant::now);
    let Some(shutdown) = sessions.upgrade().map(|s| s.shutdown.clone()) else { return lost.cancel() };
    tokio::spawn(async move {
        loop {
            let disconnected_too_long = async {
                match since {
                    Some(t) => tokio::time::sleep_until((t + grace).into()).await,
                    None => std::future::pending().await,
                }
            };
            let state = tokio::select! {
                s = watcher.changed() => s,
                _ = shutdown.cancelled() => break,
                _ = disconnected_too_long => {
                    tracing::warn!(?grace, "zookeeper session disconnected too long; its grants are lost");
                    break;
                }
            };
            match state {
                zk::SessionState::SyncConnected => since = None,
                zk::SessionState::Disconnected | zk::SessionState::ConnectedReadOnly => {
                    since.get_or_insert_with(Instant::now);
                }
                other => {
                    tracing::warn!(state = ?other, "zookeeper session ended; its grants are lost");
                    break;
                }
            }
        }
        lost.cancel();
        if let Some(sessions) = sessions.upgrade() {
            sessions.abandon(id);
        }
    });
}
