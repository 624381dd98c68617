//! `holdfast list [PREFIX]`: every held key (under PREFIX), as `status`
//! shows them. An admin call: it reads every held key under the prefix.

use crate::cli::ListArgs;
use crate::exit::{Failure, OK};

use super::status::{Row, print};

/// Prints every held key under the prefix, sorted by key.
pub async fn list(args: ListArgs) -> Result<u8, Failure> {
    if let Some(prefix) = &args.prefix {
        holdfast::LockKey::check_prefix(prefix)?;
    }
    let client = super::connect_read_only(&args.backend).await?;
    let rows: Vec<Row> = client.list(args.prefix.as_deref()).await?.into_iter().map(Row::of).collect();
    if rows.is_empty() && !args.json {
        let under = args.prefix.as_deref().map(|p| format!(" under {p:?}")).unwrap_or_default();
        crate::say!("no held keys{under}");
        return Ok(OK);
    }
    print(&rows, args.json)?;
    Ok(OK)
}
