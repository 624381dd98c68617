//! The admission table on PostgreSQL: held exclusive and writer leases in
//! the lease table, shares and reservations in `<table>_shares`, and the
//! key's lease row as the shares' gate (the all-zero token, expiring with
//! the latest held share; an expired gate where only reservations wait, as
//! the shared acquire's first statement leaves it), expiry on the server's
//! clock, the fence counter at the table's highest order.

use std::collections::BTreeSet;

use holdfast::backend::admission;
use holdfast::backend::{AcquireRequest, Backend};
use holdfast::stores::postgres::PostgresBackend;
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::admission_cases::{Case, MAX_ORDER};
use holdfast_testkit::servers::postgres::PostgresServer;

use super::{Leeway, Live, TTL, ends_in_ms, number, run_table};

const LEASES: &str = "public.holdfast_leases";
const SHARES: &str = "public.holdfast_leases_shares";
const GATE: &str = "'\\x00000000000000000000000000000000'::bytea";

fn bytea(n: u8) -> String {
    format!("'\\x{}'::bytea", format!("{n:02x}").repeat(16))
}

fn at(ms: i64) -> String {
    format!("clock_timestamp() + {ms} * interval '1 millisecond'")
}

/// The statements that seed a case's rows under `key`.
fn seed_sql(key: &str, case: &Case) -> String {
    let mut sql = format!(
        "UPDATE public.holdfast_leases_fence SET value = greatest(value, {MAX_ORDER}) WHERE id = 1;
         DELETE FROM {LEASES} WHERE key = '{key}'; DELETE FROM {SHARES} WHERE key = '{key}';"
    );
    let waiting = case.rows.iter().any(|r| !r.held);
    let lease = |token: String, fence: u64, until: String| {
        format!(
            "INSERT INTO {LEASES} (key, token, fence, label, acquired_at, expires_at, wanted)
             VALUES ('{key}', {token}, {fence}, 'seed', clock_timestamp(), {until}, {waiting});"
        )
    };
    let shares: Vec<_> = case.rows.iter().filter(|r| r.held && !r.mode.is_exclusive()).collect();
    // The key's fence lives in its lease row: a live holder's own, else
    // the table's highest order (as the namespace counter held it before
    // fences were kept per key).
    if let Some(x) = case.rows.iter().find(|r| r.held && r.mode.is_exclusive()) {
        let fence = if x.expired { MAX_ORDER } else { x.order };
        sql += &lease(bytea(x.token), fence, at(ends_in_ms(x)));
    } else if let Some(latest) = shares.iter().max_by_key(|r| ends_in_ms(r)) {
        sql += &lease(GATE.to_owned(), MAX_ORDER, at(ends_in_ms(latest)));
    } else if waiting {
        sql += &lease(GATE.to_owned(), MAX_ORDER, "timestamptz 'epoch'".to_owned());
    }
    for r in case.rows.iter().filter(|r| !(r.held && r.mode.is_exclusive())) {
        let (m, w, l) = admission::encode(r.mode);
        sql += &format!(
            "INSERT INTO {SHARES} (key, token, mode, weight, limit_n, held, fence, label, acquired_at, expires_at)
             VALUES ('{key}', {}, {m}, {w}, {l}, {}, {}, 'seed', clock_timestamp(), {});",
            bytea(r.token),
            r.held,
            r.order,
            at(ends_in_ms(r))
        );
    }
    sql
}

/// The key's live rows: the lease row unless it is the gate, and the shares.
fn live(server: &PostgresServer, key: &str) -> BTreeSet<Live> {
    let out = server.psql(&format!(
        "SELECT encode(token, 'hex'), true, fence FROM {LEASES}
          WHERE key = '{key}' AND expires_at > clock_timestamp() AND token <> {GATE}
         UNION ALL
         SELECT encode(token, 'hex'), held, fence FROM {SHARES}
          WHERE key = '{key}' AND expires_at > clock_timestamp()"
    ));
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            let t = OwnerToken::from_hex(f[0]).map_or(0, |t| number(&t.to_bytes()));
            (t, f[1] == "t", f[2].parse().expect("fence"))
        })
        .collect()
}

/// Every case of the table through `PostgresBackend::try_acquire` (the
/// mutex's statement for an exclusive request, the shared acquire function
/// otherwise: the rule's SQL encoding) on the case's rows seeded into the
/// real tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_passes_the_admission_table() {
    let server = PostgresServer::start();
    let store = PostgresBackend::open_url(&server.url()).await.expect("open");
    warm_up(&store).await;
    run_table(&store, Leeway::default(), |key, case| drop(server.psql(&seed_sql(key, case))), |key| live(&server, key))
        .await;
}

/// The same on a namespace without the functions (made by an earlier
/// version, opened with `create=false`): the shared transaction, whose
/// decision is the Rust rule's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_without_its_functions_passes_the_admission_table() {
    let server = PostgresServer::start();
    warm_up(&PostgresBackend::open_url(&server.url()).await.expect("open")).await;
    server.psql("DROP FUNCTION holdfast_leases_gate; DROP FUNCTION holdfast_leases_share");
    let store = PostgresBackend::open_url(&format!("{}&create=false", server.url())).await.expect("open");
    run_table(&store, Leeway::default(), |key, case| drop(server.psql(&seed_sql(key, case))), |key| live(&server, key))
        .await;
    assert_eq!(server.psql("SELECT count(*) FROM pg_proc WHERE proname = 'holdfast_leases_share'"), "0");
}

/// The first use creates the tables.
async fn warm_up(store: &PostgresBackend) {
    let warm = AcquireRequest::new(LockKey::new("admission/warm-up").expect("key"), OwnerToken::random(), TTL);
    store.try_acquire(&warm).await.expect("first acquire").expect("granted");
    store.release(&warm.key, warm.token).await.expect("release");
}
