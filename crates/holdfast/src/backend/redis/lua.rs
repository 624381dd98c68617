//! The Lua scripts the store calls run (in `scripts/`), each with the
//! common helpers prepended, loaded once per server.

use redis::Script;

const COMMON: &str = include_str!("scripts/common.lua");

fn source(body: &str) -> String {
    format!("{COMMON}\n{body}")
}

fn script(body: &str) -> Script {
    Script::new(&source(body))
}

/// Every script's source, for loading them all at once.
pub(super) fn sources() -> Vec<String> {
    [
        include_str!("scripts/acquire.lua"),
        include_str!("scripts/fair_acquire.lua"),
        include_str!("scripts/shared_acquire.lua"),
        include_str!("scripts/shared_admin.lua"),
        include_str!("scripts/release.lua"),
        include_str!("scripts/renew.lua"),
        include_str!("scripts/status.lua"),
        include_str!("scripts/raise_fence.lua"),
    ]
    .into_iter()
    .map(source)
    .collect()
}

/// The scripts, each loaded once per server (EVALSHA, EVAL on NOSCRIPT).
pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) fair_acquire: Script,
    pub(super) shared_acquire: Script,
    pub(super) shared_admin: Script,
    pub(super) release: Script,
    pub(super) renew: Script,
    pub(super) status: Script,
    pub(super) raise_fence: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Scripts {
            acquire: script(include_str!("scripts/acquire.lua")),
            fair_acquire: script(include_str!("scripts/fair_acquire.lua")),
            shared_acquire: script(include_str!("scripts/shared_acquire.lua")),
            shared_admin: script(include_str!("scripts/shared_admin.lua")),
            release: script(include_str!("scripts/release.lua")),
            renew: script(include_str!("scripts/renew.lua")),
            status: script(include_str!("scripts/status.lua")),
            raise_fence: script(include_str!("scripts/raise_fence.lua")),
        }
    }
}
