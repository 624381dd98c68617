//! The table of admission cases (`holdfast_testkit::admission_cases`) run
//! against every encoding of the rule: the Lua port on a real redis-server
//! (`redis`), and each store's acquire on rows seeded into its real tables
//! or keys (`sqlite`, `postgres`, `mysql`, `redis`). One test per store runs
//! the whole table; a failure names every case that failed.

use std::collections::BTreeSet;
use std::time::Duration;

use holdfast::backend::{AcquireRequest, Backend, Grant};
use holdfast::{Error, LockKey, OwnerToken};
use holdfast_testkit::admission_cases::{Case, Expect, MAX_ORDER, Seed, token};

#[cfg(any(feature = "redis", feature = "postgres"))]
mod cost;
mod floor;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;

/// How long a seeded live row has left, and how long ago a seeded expired
/// row ended: far from any boundary a slow machine could cross mid-case.
const LIVE_MS: i64 = 60_000;
/// See [`LIVE_MS`].
const EXPIRED_MS: i64 = 5_000;

/// The lease a request asks for.
const TTL: Duration = Duration::from_secs(30);

/// The key case `i` of the table uses, so one server runs the whole table.
fn key_of(i: usize) -> String {
    format!("admission/case-{i:02}")
}

/// The number a token was made from (see `token`), or 0 for any other token.
fn number(bytes: &[u8]) -> u8 {
    match bytes {
        [first, rest @ ..] if bytes.len() == 16 && rest.iter().all(|b| b == first) => *first,
        _ => 0,
    }
}

/// The owner token of token number `n`.
fn owner(n: u8) -> OwnerToken {
    OwnerToken::from_bytes(token(n))
}

/// One live row as a test reads it back: (token number, held, order).
type Live = (u8, bool, u64);

/// How a store may differ from the rule where the `Backend` contract lets
/// it (backend/mod.rs: a retry returns "the same fence, or a higher one
/// where the store issues a new one").
#[derive(Debug, Clone, Copy, Default)]
struct Leeway {
    /// A retry of a held exclusive lease may be granted a new fence.
    retry_takes_a_new_fence: bool,
}

/// The live rows the key must hold after the case's request, given the
/// fence it was answered with: the seeded live rows, with a grant replacing
/// the token's reservation by a held lease at the new fence.
fn expected_after(case: &Case, fence: Option<u64>, leeway: Leeway) -> BTreeSet<Live> {
    let mut rows: BTreeSet<Live> =
        case.rows.iter().filter(|s| !s.expired).map(|s: &Seed| (s.token, s.held, s.order)).collect();
    let refenced = leeway.retry_takes_a_new_fence && matches!(case.expect, Expect::AlreadyHeld(_));
    let replaced = match case.expect {
        Expect::Grant => fence,
        Expect::AlreadyHeld(_) if refenced => fence,
        _ => None,
    };
    if let Some(f) = replaced {
        rows.retain(|r| r.0 != case.token);
        rows.insert((case.token, true, f));
    }
    rows
}

/// Whether a store's answer to a non-waiting try is what the case expects:
/// `Err(why)` if not.
fn judge(case: &Case, got: &holdfast::Result<Option<Grant>>, leeway: Leeway) -> Result<Option<u64>, String> {
    let fence = match got {
        Ok(Some(g)) => Some(g.fence),
        _ => None,
    };
    let ok = match (case.expect, got) {
        (Expect::Grant, Ok(Some(g))) => g.fence > MAX_ORDER,
        (Expect::AlreadyHeld(f), Ok(Some(g))) => {
            g.fence == f || (leeway.retry_takes_a_new_fence && case.mode.is_exclusive() && g.fence > MAX_ORDER)
        }
        (Expect::Refuse { .. }, Ok(None)) => true,
        (Expect::Conflict, Err(Error::Conflict { .. })) => true,
        _ => false,
    };
    if ok { Ok(fence) } else { Err(format!("expected {:?}, the store answered {got:?}", case.expect)) }
}

/// Runs every case against `store` (allowed `leeway`): `seed` writes the case's rows under
/// the key (blocking is fine: the tests run on a multi-thread runtime),
/// the store's try decides, and `live` reads the key's live rows back.
/// Panics naming every case that failed.
async fn run_table<S, L>(store: &dyn Backend, leeway: Leeway, mut seed: S, mut live: L)
where
    S: FnMut(&str, &Case),
    L: FnMut(&str) -> BTreeSet<Live>,
{
    let cases = holdfast_testkit::admission_cases::cases();
    let mut failed = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let key = key_of(i);
        tokio::task::block_in_place(|| seed(&key, case));
        let req = AcquireRequest::new(LockKey::new(key.as_str()).expect("key"), owner(case.token), TTL)
            .with_mode(case.mode)
            .with_label("case");
        let got = store.try_acquire(&req).await;
        let verdict = judge(case, &got, leeway).and_then(|fence| {
            let after = tokio::task::block_in_place(|| live(&key));
            let want = expected_after(case, fence, leeway);
            if after == want { Ok(()) } else { Err(format!("rows after: {after:?}, expected {want:?}")) }
        });
        if let Err(why) = verdict {
            failed.push(format!("case {i} \"{}\": {why}", case.name));
        }
    }
    assert!(
        failed.is_empty(),
        "{} on {}: {} of {} cases failed:\n{}",
        store.name(),
        "the admission table",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

/// Milliseconds from now at which a seeded row ends.
fn ends_in_ms(seed: &Seed) -> i64 {
    if seed.expired { -EXPIRED_MS } else { LIVE_MS }
}
