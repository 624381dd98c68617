//! `holdfast release --force KEY...`: frees keys whatever their holders
//! (for a holder that is gone, without waiting out its lease). Refused
//! without `--force`, since it breaks the exclusion a live holder believes
//! it has (its `lost()` fires at its next renewal; its fence still guards a
//! fenced resource).

use crate::cli::ReleaseArgs;
use crate::exit::{Failure, OK};

/// The usage error of a `release` without `--force`.
pub const NEED_FORCE: &str = "release frees a lock whatever its holder, who may still be working under it; \
     pass --force to do that (holdfast release --force KEY...)";

/// Frees every key, in the order given, and prints what each held.
pub async fn release(args: ReleaseArgs) -> Result<u8, Failure> {
    if !args.force {
        return Err(Failure::usage(NEED_FORCE));
    }
    for key in &args.keys {
        holdfast::LockKey::new(key.as_str())?;
    }
    let client = super::connect_read_only(&args.backend).await?;
    for key in &args.keys {
        let removed = client.force_release(key).await?;
        crate::say!("{}", describe(key, &removed));
    }
    Ok(OK)
}

/// One line: what was removed from `key`.
fn describe(key: &str, removed: &holdfast::ForceReleased) -> String {
    let list = |fences: &[u64]| fences.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    match (removed.exclusive, removed.shared.as_slice()) {
        (None, []) => format!("{key}: was free"),
        (Some(f), []) => format!("{key}: released fence {f}"),
        (None, shared) => format!("{key}: released {} shared lease(s), fences {}", shared.len(), list(shared)),
        (Some(f), shared) => {
            format!("{key}: released fence {f} and {} shared lease(s), fences {}", shared.len(), list(shared))
        }
    }
}
