//! `fallback://` URLs: `fallback://[?options|]STORE_URL|STORE_URL|...`.

use crate::composites::url as composite_url;
use crate::vocabulary::error::Result;
use crate::vocabulary::url_options::Opt;

const OPTIONS: &[Opt] =
    &[Opt::new("mode_ttl_ms"), Opt::new("switch_after_ms"), Opt::new("fail_back_after_ms"), Opt::new("name")];

pub(super) async fn open_url(url: &str, connect: crate::backend::ConnectFn) -> Result<super::Fallback> {
    let parsed = composite_url::parse(url, "fallback", OPTIONS, 2..=super::MAX_STORES)?;
    let o = &parsed.options;
    let mode_ttl = o.duration_ms("mode_ttl_ms", 200..=crate::vocabulary::key::MAX_TTL.as_millis() as u64)?;
    let switch_after = o.duration_ms("switch_after_ms", 0..=3_600_000)?;
    let fail_back_after = o.duration_ms("fail_back_after_ms", 0..=86_400_000)?;
    let name = o.str("name").map(str::to_owned);
    let mut chain = super::Fallback::new(parsed.connect(connect).await?)?;
    if let Some(name) = name {
        chain = chain.with_name(&name)?;
    }
    if let Some(ttl) = mode_ttl {
        chain = chain.with_mode_ttl(ttl)?;
    }
    if let Some(after) = switch_after {
        chain = chain.with_switch_after(after);
    }
    if let Some(after) = fail_back_after {
        chain = chain.with_fail_back_after((!after.is_zero()).then_some(after));
    }
    Ok(chain)
}
