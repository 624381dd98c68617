//! The Lua scripts the store calls (in `scripts/`), each with the common
//! helpers prepended, and how they are called: as functions of one library
//! (`FCALL`, Redis 7+), or as scripts (`EVALSHA`) where the server or the
//! user's ACL has no functions.
//!
//! Functions are the faster way: an `EVALSHA` runs its whole script body at
//! each call, so the shared helpers were defined again every time (about
//! 0.55 µs of the server per call, measured), while a library defines them
//! once, when it is loaded. The library's name carries a hash of its source,
//! so clients of two holdfast versions on one server each call their own
//! code and never replace each other's.
//!
//! A call is built straight into one command ([`ScriptCall`]): the redis
//! crate's `ScriptInvocation` keeps every key and argument in a buffer of
//! its own and copies them all into a command at each call, which measured
//! as a tenth of the client's time per lock cycle.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

use super::link::Link;

const COMMON: &str = include_str!("scripts/common.lua");

/// Every script: its name and body.
const BODIES: [(&str, &str); 14] = [
    ("acquire", include_str!("scripts/acquire.lua")),
    ("fair_acquire", include_str!("scripts/fair_acquire.lua")),
    ("shared_acquire", include_str!("scripts/shared_acquire.lua")),
    ("shared_admin", include_str!("scripts/shared_admin.lua")),
    ("release", include_str!("scripts/release.lua")),
    ("force_release", include_str!("scripts/force_release.lua")),
    ("renew", include_str!("scripts/renew.lua")),
    ("status", include_str!("scripts/status.lua")),
    ("raise_fence", include_str!("scripts/raise_fence.lua")),
    ("read_record", include_str!("scripts/read_record.lua")),
    ("write_record", include_str!("scripts/write_record.lua")),
    ("shrink", include_str!("scripts/shrink.lua")),
    ("hand_over", include_str!("scripts/hand_over.lua")),
    ("share_hand_over", include_str!("scripts/share_hand_over.lua")),
];

fn source(body: &str) -> String {
    format!("{COMMON}\n{body}")
}

/// The function library: the common helpers once, then each script as a
/// function `{library}_{name}` taking the keys and arguments the script
/// reads as `KEYS` and `ARGV`. Returns the library's name and source.
fn library() -> (String, String) {
    let mut functions = String::new();
    for (name, body) in BODIES {
        functions.push_str(&format!("local function {name}(KEYS, ARGV)\n{body}\nend\n"));
    }
    // Named after the hash of everything it runs, so another version of
    // holdfast never finds its own name taken by different code.
    let hash = Script::new(&format!("{COMMON}\n{functions}")).get_hash().to_owned();
    let lib = format!("holdfast_{}", &hash[..16]);
    let mut text = format!("#!lua name={lib}\n{COMMON}\n{functions}");
    for (name, _) in BODIES {
        text.push_str(&format!("redis.register_function('{lib}_{name}', {name})\n"));
    }
    (lib, text)
}

/// Whether an error says the function called is not on the server (a new
/// server, a restart without persistence, `FUNCTION FLUSH`, a failover to a
/// node that lacks it).
fn is_missing_function(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains("Function not found"))
}

/// Loads the library; one that is there already counts as loaded (its name
/// says its source is the same).
///
/// # Cancel safety
///
/// As a redis command: a dropped call may or may not have loaded it.
async fn load_library(conn: &mut Link, text: &str) -> RedisResult<()> {
    let mut cmd = redis::cmd("FUNCTION");
    cmd.arg("LOAD").arg(text);
    match cmd.query_async::<redis::Value>(conn).await {
        Ok(_) => Ok(()),
        Err(e) if e.detail().is_some_and(|d| d.contains("already exists")) => Ok(()),
        Err(e) => Err(e),
    }
}

/// One script: its source and SHA1 (to call it by `EVALSHA`), its
/// function's name (to call it by `FCALL`), and which of the two the store
/// uses.
pub(super) struct LuaScript {
    script: Script,
    function: String,
    /// `FCALL` (the library loaded at connect) rather than `EVALSHA`.
    functions: bool,
    /// The function library's source, to load it again when it is missing.
    library: Arc<str>,
}

impl LuaScript {
    /// A call of this script with `keys` keys, given first with
    /// [`ScriptCall::key`], then its arguments with [`ScriptCall::arg`].
    pub(super) fn call(&self, keys: usize) -> ScriptCall<'_> {
        // Sized for the keys and up to 8 arguments, so that building the
        // command does not grow its buffers.
        let mut cmd = Cmd::with_capacity(11 + keys, 96 + 48 * keys);
        if self.functions {
            cmd.arg("FCALL").arg(&self.function);
        } else {
            cmd.arg("EVALSHA").arg(self.script.get_hash());
        }
        cmd.arg(keys);
        ScriptCall {
            script: self,
            cmd,
            keys_left: keys,
            track_client: false,
            client_id: AtomicI64::new(0),
            resent: AtomicBool::new(false),
        }
    }

    /// Whether an error says the server lacks this script or its library.
    fn is_missing(&self, e: &redis::RedisError) -> bool {
        if self.functions { is_missing_function(e) } else { e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) }
    }
}

/// The scripts, and how this store calls them on its server.
pub(super) struct Scripts {
    pub(super) acquire: LuaScript,
    pub(super) fair_acquire: LuaScript,
    pub(super) shared_acquire: LuaScript,
    pub(super) shared_admin: LuaScript,
    pub(super) release: LuaScript,
    pub(super) force_release: LuaScript,
    pub(super) renew: LuaScript,
    pub(super) status: LuaScript,
    pub(super) raise_fence: LuaScript,
    pub(super) read_record: LuaScript,
    pub(super) write_record: LuaScript,
    pub(super) shrink: LuaScript,
    pub(super) hand_over: LuaScript,
    pub(super) share_hand_over: LuaScript,
    /// The function library's source.
    library: Arc<str>,
    /// `FCALL` (the library loaded at connect) rather than `EVALSHA`.
    functions: bool,
}

impl Scripts {
    /// The scripts, called by `FCALL` if the library can be loaded on the
    /// server `conn` leads to, else by `EVALSHA`. Any error other than a
    /// connection error picks `EVALSHA`: a server before Redis 7 (unknown
    /// command), or a user whose ACL lacks `FUNCTION LOAD`.
    ///
    /// # Cancel safety
    ///
    /// As a redis command: a dropped call may have loaded the library.
    pub(super) async fn detect(conn: &mut Link, limit: std::time::Duration) -> Self {
        let (lib, library) = library();
        let functions = match tokio::time::timeout(limit, load_library(conn, &library)).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "no redis function library; calling scripts by EVALSHA");
                false
            }
            Err(_) => {
                tracing::debug!("no answer to FUNCTION LOAD in time; calling scripts by EVALSHA");
                false
            }
        };
        let library: Arc<str> = library.into();
        let script = |name: &str| {
            let body = BODIES.iter().find(|(n, _)| *n == name).map_or("", |(_, body)| body);
            LuaScript {
                script: Script::new(&source(body)),
                function: format!("{lib}_{name}"),
                functions,
                library: library.clone(),
            }
        };
        Scripts {
            acquire: script("acquire"),
            fair_acquire: script("fair_acquire"),
            shared_acquire: script("shared_acquire"),
            shared_admin: script("shared_admin"),
            release: script("release"),
            force_release: script("force_release"),
            renew: script("renew"),
            status: script("status"),
            raise_fence: script("raise_fence"),
            read_record: script("read_record"),
            write_record: script("write_record"),
            shrink: script("shrink"),
            hand_over: script("hand_over"),
            share_hand_over: script("share_hand_over"),
            library,
            functions,
        }
    }

    /// Loads what the store calls on every master of a cluster (a master
    /// just promoted may lack it even after the crate's own reload).
    ///
    /// # Cancel safety
    ///
    /// As a redis command: a dropped call may have loaded some of it.
    pub(super) async fn load_on_every_master(&self, conn: &mut Link) -> RedisResult<()> {
        if self.functions {
            // FUNCTION LOAD goes to every master by itself.
            return load_library(conn, &self.library).await;
        }
        let sources: Vec<String> = BODIES.iter().map(|(_, body)| source(body)).collect();
        conn.load_on_every_master(&sources).await
    }

    /// Whether calls go by `FCALL`.
    pub(super) fn uses_functions(&self) -> bool {
        self.functions
    }
}

/// One `FCALL` or `EVALSHA` being built: keys first, then arguments.
pub(super) struct ScriptCall<'a> {
    script: &'a LuaScript,
    cmd: Cmd,
    /// Keys still to add (the count was sent ahead of them).
    keys_left: usize,
    /// Whether the call is sent in one pipeline after `CLIENT ID`, so that
    /// `WAIT` can tell that it runs on the connection that wrote (replicas.rs).
    track_client: bool,
    /// The server's id of the connection the call last ran on (0: unknown).
    client_id: AtomicI64,
    /// Whether the call was sent again after its connection was lost (its
    /// first copy may have run).
    resent: AtomicBool,
}

impl ScriptCall<'_> {
    /// Adds the next key.
    pub(super) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        debug_assert!(self.keys_left > 0, "more keys than the call was made for");
        self.keys_left = self.keys_left.saturating_sub(1);
        self.cmd.arg(key);
        self
    }

    /// Adds the next argument, after every key.
    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        debug_assert_eq!(self.keys_left, 0, "an argument before the last key");
        self.cmd.arg(arg);
        self
    }

    /// Adds the next key, written from its parts into the command's buffer
    /// (no string of its own is made: this runs for every key of every call).
    pub(super) fn key_parts(&mut self, parts: &[&str]) -> &mut Self {
        debug_assert!(self.keys_left > 0, "more keys than the call was made for");
        self.keys_left = self.keys_left.saturating_sub(1);
        self.write_parts(parts)
    }

    /// Adds the next argument, written from its parts, like
    /// [`key_parts`](Self::key_parts).
    pub(super) fn arg_parts(&mut self, parts: &[&str]) -> &mut Self {
        debug_assert_eq!(self.keys_left, 0, "an argument before the last key");
        self.write_parts(parts)
    }

    fn write_parts(&mut self, parts: &[&str]) -> &mut Self {
        let mut w = redis::RedisWrite::writer_for_next_arg(&mut self.cmd);
        for p in parts {
            // Writing into the command's Vec cannot fail.
            let _ = w.write_all(p.as_bytes());
        }
        drop(w);
        self
    }

    /// Sends the call after `CLIENT ID`, in one pipeline (so on one
    /// connection), and keeps the id: see [`client_id`](Self::client_id).
    pub(super) fn track_client(&mut self) -> &mut Self {
        self.track_client = true;
        self
    }

    /// The server's id of the connection the call last ran on, if it was
    /// tracked ([`track_client`](Self::track_client)) and has run.
    pub(super) fn client_id(&self) -> Option<i64> {
        Some(self.client_id.load(Ordering::SeqCst)).filter(|&id| id > 0)
    }

    /// Notes that the call is sent again after its connection was lost.
    pub(super) fn mark_resent(&self) {
        self.resent.store(true, Ordering::SeqCst);
    }

    /// Whether the call was sent again after its connection was lost, so
    /// that its first copy may have run.
    pub(super) fn was_resent(&self) -> bool {
        self.resent.load(Ordering::SeqCst)
    }

    /// One send of the call (with `CLIENT ID` ahead of it if tracked).
    async fn send<T: FromRedisValue>(&self, conn: &mut Link) -> RedisResult<T> {
        if !self.track_client {
            return self.cmd.query_async(conn).await;
        }
        let mut pipe = redis::pipe();
        pipe.cmd("CLIENT").arg("ID").add_command(self.cmd.clone());
        let (id, reply): (i64, T) = pipe.query_async(conn).await?;
        self.client_id.store(id, Ordering::SeqCst);
        Ok(reply)
    }

    /// Whether an error says the server lacks this call's script or library.
    pub(super) fn is_missing(&self, e: &redis::RedisError) -> bool {
        self.script.is_missing(e)
    }

    /// Sends the call; a server that lacks the library or the script (a new
    /// server, a restart, `FUNCTION FLUSH`, `SCRIPT FLUSH`) is sent it, then
    /// the call again.
    ///
    /// # Cancel safety
    ///
    /// As a redis command: a dropped call may or may not have run.
    pub(super) async fn invoke<T: FromRedisValue>(&self, conn: &mut Link) -> RedisResult<T> {
        match self.send(conn).await {
            Err(e) if self.script.is_missing(&e) => {
                if self.script.functions {
                    load_library(conn, &self.script.library).await?;
                } else {
                    self.script.script.load_async(conn).await?;
                }
                self.send(conn).await
            }
            other => other,
        }
    }
}
