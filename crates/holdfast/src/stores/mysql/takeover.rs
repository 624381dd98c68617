//! The takeover of a mutex lease row held under a session that lapsed
//! (see `session_rows`), after the grant statement found the row held.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, TxOpts};

use super::session::left;
use super::session_rows::{self, Lapse};
use super::sql::{Acquired, Statements, granted};
use crate::vocabulary::key::OwnerToken;

/// The grant of a row held under a session that lapsed (see
/// `session_rows`): a consistent read finds the lapse, then one transaction
/// locks the row (still the one read, else busy), counts the removal in
/// the session on its latest version (a renewal committed meanwhile: busy)
/// and grants, under the acquire's `session`. Any other held row: busy,
/// with the time left read.
pub(super) async fn take_lapsed(
    conn: &mut Conn,
    s: &Statements,
    key: &str,
    (token, session, label): (OwnerToken, &[u8], &str),
    floor: u64,
) -> mysql_async::Result<Acquired> {
    let (k, tok) = (key.as_bytes(), token.to_bytes());
    let t = &tok[..];
    let label: String = label.chars().take(255).collect();
    type Probe = (Vec<u8>, Option<Vec<u8>>, Option<u8>, Option<i64>);
    let probe: Option<Probe> = conn.exec_first(s.probe.as_str(), (k,)).await?;
    let (holder, held_under) = match probe {
        Some((holder, Some(held_under), Some(1), _)) => (holder, held_under),
        Some((_, _, _, us)) => return Ok(Acquired::Busy { expires_in: us.map(|us| left(Some(us))) }),
        // Gone since the grant's statement: the next attempt decides.
        None => return Ok(Acquired::Busy { expires_in: None }),
    };
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    let locked: Option<(Vec<u8>, Option<Vec<u8>>)> = tx.exec_first(s.lock_probed.as_str(), (k,)).await?;
    if locked != Some((holder, Some(held_under.clone()))) {
        tx.rollback().await?;
        return Ok(Acquired::Busy { expires_in: None });
    }
    if let Lapse::Held(us) = session_rows::count_lapsed(&mut tx, &s.sessions, &held_under).await? {
        tx.rollback().await?;
        return Ok(Acquired::Busy { expires_in: Some(left(Some(us))) });
    }
    tx.exec_drop(s.take_lapsed.as_str(), (floor, label.as_str(), t, session, k)).await?;
    let outcome = granted(tx.last_insert_id());
    match outcome {
        Ok(_) => tx.commit().await?,
        Err(_) => tx.rollback().await?,
    }
    outcome
}
