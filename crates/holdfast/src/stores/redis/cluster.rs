//! Redis Cluster: `redis+cluster://` URLs, the cluster connections, and
//! renewal grouped by hash slot.
//!
//! Every key of one lock carries the hash tag `{prefix:key}`, so every
//! script call touches one slot, and the `redis` crate's cluster connection
//! sends it to the master that owns the slot, following `MOVED` and `ASK`
//! (a slot that moves) and loading a script on a node that answers
//! `NOSCRIPT` (`SCRIPT LOAD` goes to every node). A renewal batch names
//! leases of many locks, so [`group_by_slot`] splits it into one script
//! call per slot.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_routing::Slot;
use redis::{ConnectionAddr, IntoConnectionInfo, ProtocolVersion};

use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::secret::Secret;
use crate::vocabulary::url_text::redact_url;

use super::map_err;

/// The scheme of Cluster URLs.
pub(super) const SCHEME: &str = "redis+cluster";

/// The TLS scheme, refused with a typed error (not supported yet).
pub(super) const TLS_SCHEME: &str = "rediss+cluster";

/// The port of a node written without one.
const DEFAULT_PORT: u16 = 6379;

/// The seed nodes of a cluster and how to log in to its nodes
/// (`redis+cluster://[user:password@]host[:port],host[:port]`).
#[derive(Clone, PartialEq, Eq)]
pub(super) struct ClusterSettings {
    /// The nodes written in the URL, in order: any one that answers tells
    /// the client the whole cluster (`CLUSTER SLOTS`).
    pub(super) nodes: Vec<(String, u16)>,
    /// The ACL user of every node.
    pub(super) username: Option<String>,
    /// The password of every node.
    pub(super) password: Option<Secret>,
}

impl fmt::Debug for ClusterSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterSettings")
            .field("nodes", &self.nodes)
            .field("username", &self.username)
            .field("password", &self.password)
            .finish()
    }
}

/// The scheme (`redis+cluster` or `rediss+cluster`, any case) and the rest,
/// if `url` is a Cluster URL.
pub(super) fn strip_scheme(url: &str) -> Option<(&'static str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    [SCHEME, TLS_SCHEME].into_iter().find(|s| scheme.eq_ignore_ascii_case(s)).map(|s| (s, rest))
}

/// Parses a Cluster URL without its query (`main`, as written).
pub(super) fn parse(main: &str) -> Result<ClusterSettings> {
    let bad = |why: &str| Error::invalid("url", format!("{}: {why}", redact_url(main)));
    let rest = match strip_scheme(main) {
        Some((SCHEME, rest)) => rest,
        Some(_) => {
            return Err(bad(
                "TLS to a Redis Cluster (rediss+cluster://) is not supported yet; use redis+cluster:// on a trusted network",
            ));
        }
        None => return Err(bad("expected redis+cluster://HOST:PORT[,HOST:PORT...]")),
    };
    let (username, password, rest) = super::sentinel::split_credentials(rest, "redis+cluster")?;
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    match path {
        "" | "0" => {}
        _ => {
            return Err(bad(
                "a Redis Cluster has only database 0: a redis+cluster:// URL has no path other than /0 (write '/' in a password as %2F)",
            ));
        }
    }
    let mut nodes = Vec::new();
    for host in hosts.split(',') {
        nodes.push(super::sentinel::parse_host(host, DEFAULT_PORT).ok_or_else(|| {
            bad("the nodes are a comma-separated list of HOST[:PORT] (IPv6 as [ADDR]:PORT), none empty")
        })?);
    }
    Ok(ClusterSettings { nodes, username, password })
}

/// A client of the cluster `settings` names, speaking `protocol`, with
/// `config`'s timeouts (`connect` for a connection, `response` for a
/// reply); pushes (pub/sub messages, disconnections) go to
/// `push` when given (RESP3 only).
pub(super) fn client(
    settings: &ClusterSettings,
    (connect, response): (Duration, Duration),
    protocol: ProtocolVersion,
    push: Option<impl redis::aio::AsyncPushSender>,
) -> Result<ClusterClient> {
    let mut nodes = Vec::new();
    for (host, port) in &settings.nodes {
        let info = ConnectionAddr::Tcp(host.clone(), *port)
            .into_connection_info()
            .map_err(|e| Error::invalid("url", format!("cluster node {host}:{port}: {e}")))?;
        nodes.push(info);
    }
    let mut builder = ClusterClientBuilder::new(nodes)
        .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
        .connection_timeout(connect)
        .response_timeout(response)
        .use_protocol(protocol);
    if let Some(user) = &settings.username {
        builder = builder.username(user);
    }
    if let Some(password) = &settings.password {
        builder = builder.password(password.expose());
    }
    if let Some(push) = push {
        builder = builder.push_sender(push);
    }
    builder.build().map_err(map_err)
}

/// The indices of `keys` grouped by the hash slot of each key, groups in
/// the order their first key comes, indices in order within a group.
pub(super) fn group_by_slot<'a>(keys: impl IntoIterator<Item = &'a str>) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut by_slot: HashMap<Slot, usize> = HashMap::new();
    for (i, key) in keys.into_iter().enumerate() {
        let group = *by_slot.entry(Slot::for_key(key)).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[group].push(i);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_urls() {
        let s = parse("redis+cluster://u:p%40ss/w@a:7000,b,[::1]:7002").unwrap();
        assert_eq!(s.nodes, vec![("a".into(), 7000), ("b".into(), 6379), ("::1".into(), 7002)]);
        assert_eq!(s.username.as_deref(), Some("u"));
        assert_eq!(s.password.as_ref().map(Secret::expose), Some("p@ss/w"));
        let dbg = format!("{s:?}");
        assert!(!dbg.contains("p@ss") && dbg.contains("***"), "{dbg}");
        let s = parse("REDIS+CLUSTER://h:7000/0").unwrap();
        assert_eq!((s.nodes.len(), s.username, s.password), (1, None, None));
        for bad in [
            "redis+cluster://",
            "redis+cluster://h:1,",
            "redis+cluster://h:0",
            "redis+cluster://h:x",
            "redis+cluster://h:1/1",
            "redis+cluster://h:1/m",
            "redis+cluster://[::1:1",
            "rediss+cluster://h:1",
            "redis://h:1",
        ] {
            assert!(matches!(parse(bad), Err(Error::InvalidInput { .. })), "{bad}");
        }
        let err = parse("rediss+cluster://u:topsecret@h:1").unwrap_err().to_string();
        assert!(!err.contains("topsecret") && err.contains("not supported"), "{err}");
        let err = parse("redis+cluster://u:topsecret@h:1/2").unwrap_err().to_string();
        assert!(!err.contains("topsecret") && err.contains("database 0"), "{err}");
    }

    #[test]
    fn groups_keys_by_slot_in_order() {
        // {a}x and {a}y share the slot of "a"; "b" has another.
        let groups = group_by_slot(["{a}x", "b", "{a}y", "a", "b"]);
        assert_eq!(groups, vec![vec![0, 2, 3], vec![1, 4]]);
        assert!(group_by_slot([]).is_empty());
    }
}
