//! The admin calls: the held keys under a prefix (`SCAN` on the server, on
//! every master of a cluster; never `KEYS`, which blocks the server for the
//! whole keyspace) and the forced release (`scripts/force_release.lua`).

use std::collections::BTreeSet;

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::keys::lock_keys;
use super::link::Link;
use super::{RedisBackend, STORE, map_err, ms, timed_out};
use crate::backend::{Backend, ForceReleased, LockStatus};
use crate::vocabulary::error::{Error, Result};
use crate::vocabulary::key::LockKey;

/// One server to scan: the store's connection, or one master of a cluster.
enum Server {
    Link(Link),
    Node(redis::cluster_async::ClusterConnection, RoutingInfo),
}

impl Server {
    async fn send(&mut self, cmd: redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self {
            Server::Link(link) => cmd.query_async(link).await,
            Server::Node(c, route) => c.route_command(cmd, route.clone()).await,
        }
    }
}

/// Keys a `SCAN` call looks at per page: short server work per call.
const SCAN_COUNT: u32 = 1000;

/// `s` with the glob characters of a `SCAN MATCH` pattern escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The lock key a Redis key name belongs to, if it is a lock hash
/// (`{PREFIX:KEY}`) or a lock's shares (`{PREFIX:KEY}:s`): a semaphore's
/// key may have only its shares. Names end in `}` only for lock hashes,
/// whatever the key holds (see `keys::lock_keys`).
pub(super) fn lock_key_of<'a>(store_prefix: &str, name: &'a str) -> Option<&'a str> {
    let rest = name.strip_prefix('{')?.strip_prefix(store_prefix)?.strip_prefix(':')?;
    rest.strip_suffix('}').or_else(|| rest.strip_suffix("}:s"))
}

impl RedisBackend {
    /// Every lock key under `prefix` with an unexpired held lease.
    pub(super) async fn list_held(&self, prefix: &str) -> Result<Vec<LockStatus>> {
        let store_prefix = &self.inner.config.prefix;
        let pattern = format!("{{{}:{}*", glob_escape(store_prefix), glob_escape(prefix));
        let mut names = Vec::new();
        match &self.inner.conn {
            Link::Cluster(c, _) => {
                for (host, port) in self.masters(&mut c.clone()).await? {
                    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                    self.scan(&pattern, &mut names, &mut Server::Node(c.clone(), route)).await?;
                }
            }
            link => self.scan(&pattern, &mut names, &mut Server::Link(link.clone())).await?,
        }
        let keys: BTreeSet<&str> =
            names.iter().filter_map(|n| lock_key_of(store_prefix, n)).filter(|k| k.starts_with(prefix)).collect();
        let mut out = Vec::new();
        for key in keys {
            // A name the store wrote for a valid key; anything else is not ours.
            let Ok(key) = LockKey::new(key) else { continue };
            let status = self.status(&key).await?;
            if status.holder.is_some() || !status.shared.is_empty() {
                out.push(status);
            }
        }
        Ok(out)
    }

    /// Pages through `SCAN cursor MATCH pattern` on one server, adding the
    /// names to `names`.
    async fn scan(&self, pattern: &str, names: &mut Vec<String>, server: &mut Server) -> Result<()> {
        let limit = self.inner.config.timeout;
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(SCAN_COUNT);
            let value = match tokio::time::timeout(limit, server.send(cmd)).await {
                Ok(v) => v.map_err(map_err)?,
                Err(_) => return Err(timed_out("redis SCAN", limit)),
            };
            let (next, page): (u64, Vec<String>) =
                redis::from_redis_value(value).map_err(|e| Error::backend(STORE, false, e.to_string()))?;
            names.extend(page);
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// The addresses of a cluster's masters (`CLUSTER NODES`), failed ones left out.
    async fn masters(&self, c: &mut redis::cluster_async::ClusterConnection) -> Result<Vec<(String, u16)>> {
        let limit = self.inner.config.timeout;
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("NODES");
        let value = match tokio::time::timeout(
            limit,
            c.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random)),
        )
        .await
        {
            Ok(v) => v.map_err(map_err)?,
            Err(_) => return Err(timed_out("redis CLUSTER NODES", limit)),
        };
        let text: String = redis::from_redis_value(value).map_err(|e| Error::backend(STORE, false, e.to_string()))?;
        let masters = parse_masters(&text);
        if masters.is_empty() {
            return Err(Error::backend(STORE, true, "CLUSTER NODES named no live master"));
        }
        Ok(masters)
    }

    /// Removes every held lease of `key` in one script call.
    pub(super) async fn force(&self, key: &LockKey) -> Result<ForceReleased> {
        let config = &self.inner.config;
        let [h, q, e, s] = lock_keys(&config.prefix, key);
        let mut inv = self.inner.scripts.force_release.call(4);
        inv.key(h)
            .key(q)
            .key(e)
            .key(s)
            .arg(ms(config.fence_keep))
            .arg(self.inner.notifier.naming().lock_channel(key.as_str()))
            .arg(self.inner.notifier.naming().client_prefix(key.as_str()));
        let (had, fence, shares): (i64, i64, Vec<i64>) = self.invoke(&inv).await?;
        let mut out = ForceReleased::free();
        if had == 1 {
            out.add(fence.max(0) as u64, true);
        }
        for f in shares {
            out.add(f.max(0) as u64, false);
        }
        Ok(out)
    }
}

/// The `host:port` of each line of `CLUSTER NODES` whose flags say master
/// and not failed: `<id> <ip:port@cport[,hostname]> <flags> ...`.
fn parse_masters(text: &str) -> Vec<(String, u16)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else { continue };
        let flags: Vec<&str> = flags.split(',').collect();
        if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail") || *f == "noaddr") {
            continue;
        }
        let addr = addr.split(['@', ',']).next().unwrap_or("");
        let Some((host, port)) = addr.rsplit_once(':') else { continue };
        if let Ok(port) = port.parse() {
            out.push((host.to_owned(), port));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_are_found_from_their_names() {
        for key in ["a", "a}", "a}:s", "a}:q", "orders/42", "x*y?[z]"] {
            let k = LockKey::new(key).unwrap();
            let [h, q, e, s] = lock_keys("hf", &k);
            assert_eq!(lock_key_of("hf", &h), Some(key), "{h}");
            assert_eq!(lock_key_of("hf", &s), Some(key), "{s}");
            assert_eq!(lock_key_of("hf", &q), None, "{q}");
            assert_eq!(lock_key_of("hf", &e), None, "{e}");
            assert_eq!(lock_key_of("other", &h), None);
        }
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn masters_are_read_from_cluster_nodes() {
        let text = "07c3 127.0.0.1:30004@31004 slave e7d1 0 0 1 connected\n\
                    67ed 127.0.0.1:30002@31002 master - 0 0 2 connected 5461-10922\n\
                    292f 127.0.0.1:30003@31003,host master,fail - 0 0 3 connected\n\
                    e7d1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460\n";
        assert_eq!(parse_masters(text), vec![("127.0.0.1".to_owned(), 30002), ("127.0.0.1".to_owned(), 30001)]);
    }
}
