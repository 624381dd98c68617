//! The Lua scripts the store calls run (in `scripts/`), each with the
//! common helpers prepended, loaded once per server.
//!
//! A call is built straight into one `EVALSHA` command ([`ScriptCall`]):
//! the redis crate's `ScriptInvocation` keeps every key and argument in a
//! buffer of its own and copies them all into a command at each call, which
//! measured as a tenth of the client's time per lock cycle.

use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

use super::link::Link;

const COMMON: &str = include_str!("scripts/common.lua");

fn source(body: &str) -> String {
    format!("{COMMON}\n{body}")
}

/// Every script's source, for loading them all at once.
pub(super) fn sources() -> Vec<String> {
    [
        include_str!("scripts/acquire.lua"),
        include_str!("scripts/fair_acquire.lua"),
        include_str!("scripts/shared_acquire.lua"),
        include_str!("scripts/shared_admin.lua"),
        include_str!("scripts/release.lua"),
        include_str!("scripts/force_release.lua"),
        include_str!("scripts/renew.lua"),
        include_str!("scripts/status.lua"),
        include_str!("scripts/raise_fence.lua"),
    ]
    .into_iter()
    .map(source)
    .collect()
}

/// One script: its source (to load it) and its SHA1 (to call it).
pub(super) struct LuaScript(Script);

impl LuaScript {
    fn new(body: &str) -> Self {
        LuaScript(Script::new(&source(body)))
    }

    /// A call of this script with `keys` keys, given first with
    /// [`ScriptCall::key`], then its arguments with [`ScriptCall::arg`].
    pub(super) fn call(&self, keys: usize) -> ScriptCall<'_> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.0.get_hash()).arg(keys);
        ScriptCall { script: &self.0, cmd, keys_left: keys }
    }
}

/// One `EVALSHA` being built: keys first, then arguments.
pub(super) struct ScriptCall<'a> {
    script: &'a Script,
    cmd: Cmd,
    /// Keys still to add (the count was sent ahead of them).
    keys_left: usize,
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

    /// Sends the call; a server that does not know the script yet (a new
    /// server, a restart, `SCRIPT FLUSH`) is sent its source, then the call again.
    ///
    /// # Cancel safety
    ///
    /// As a redis command: a dropped call may or may not have run.
    pub(super) async fn invoke<T: FromRedisValue>(&self, conn: &mut Link) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            other => other,
        }
    }
}

/// The scripts, each loaded once per server (`SCRIPT LOAD` on `NOSCRIPT`).
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
}

impl Scripts {
    pub(super) fn new() -> Self {
        Scripts {
            acquire: LuaScript::new(include_str!("scripts/acquire.lua")),
            fair_acquire: LuaScript::new(include_str!("scripts/fair_acquire.lua")),
            shared_acquire: LuaScript::new(include_str!("scripts/shared_acquire.lua")),
            shared_admin: LuaScript::new(include_str!("scripts/shared_admin.lua")),
            release: LuaScript::new(include_str!("scripts/release.lua")),
            force_release: LuaScript::new(include_str!("scripts/force_release.lua")),
            renew: LuaScript::new(include_str!("scripts/renew.lua")),
            status: LuaScript::new(include_str!("scripts/status.lua")),
            raise_fence: LuaScript::new(include_str!("scripts/raise_fence.lua")),
        }
    }
}
