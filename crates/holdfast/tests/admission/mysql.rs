//! The admission table on MySQL/MariaDB: held exclusive and writer leases in
//! `<namespace>_leases`, shares and reservations in `<namespace>_shares`,
//! and the key's lease row as the gate of held shares (the all-zero token,
//! expiring with the latest held share), expiry on the server's clock
//! (`UTC_TIMESTAMP(6)`), the fence counter at the table's highest order.

use std::collections::BTreeSet;

use holdfast::backend::admission;
use holdfast::backend::{AcquireRequest, Backend};
use holdfast::stores::mysql::MysqlBackend;
use holdfast::{LockKey, OwnerToken};
use holdfast_testkit::admission_cases::{Case, MAX_ORDER};
use holdfast_testkit::servers::mysql::{DATABASE, MysqlServer};

use super::{Leeway, Live, TTL, ends_in_ms, number, run_table};

const GATE: &str = "X'00000000000000000000000000000000'";

fn binary(n: u8) -> String {
    format!("X'{}'", format!("{n:02x}").repeat(16))
}

fn at(ms: i64) -> String {
    format!("UTC_TIMESTAMP(6) + INTERVAL {} MICROSECOND", ms * 1000)
}

/// The statements that seed a case's rows under `key`; with `marker`, a
/// key without a live lease row or gate gets a released one, at the
/// table's highest order (so that the shared grant's procedure, which
/// leaves a key without a row to the transaction, decides every case with
/// no live row left).
fn seed_sql(key: &str, case: &Case, marker: bool) -> String {
    let (l, s) = (format!("{DATABASE}.holdfast_leases"), format!("{DATABASE}.holdfast_shares"));
    let mut sql = format!(
        "UPDATE {DATABASE}.holdfast_fence SET value = GREATEST(value, {MAX_ORDER}) WHERE id = 0;
         DELETE FROM {l} WHERE lock_key = '{key}'; DELETE FROM {s} WHERE lock_key = '{key}';"
    );
    let lease = |token: String, fence: u64, until: String| {
        format!(
            "INSERT INTO {l} (lock_key, token, fence, label, live_until) VALUES ('{key}', {token}, {fence}, 'seed', {until});"
        )
    };
    let shares: Vec<_> = case.rows.iter().filter(|r| r.held && !r.mode.is_exclusive()).collect();
    // The key's fence lives in its lease row: a live holder's own, else the
    // table's highest order (as the namespace counter held it before fences
    // were kept per key).
    if let Some(x) = case.rows.iter().find(|r| r.held && r.mode.is_exclusive()) {
        let fence = if x.expired { MAX_ORDER } else { x.order };
        sql += &lease(binary(x.token), fence, at(ends_in_ms(x)));
    } else if let Some(latest) = shares.iter().max_by_key(|r| ends_in_ms(r)) {
        // The gate keeps the key's fence: the highest it was granted, which
        // a share's grant takes + 1 (and the table's orders stand for the
        // key's history, as for an expired holder above).
        sql += &lease(GATE.to_owned(), MAX_ORDER, at(ends_in_ms(latest)));
    } else if marker {
        sql += &lease(format!("X'{}'", "FF".repeat(16)), MAX_ORDER, "UTC_TIMESTAMP(6)".to_owned());
    }
    for r in case.rows.iter().filter(|r| !(r.held && r.mode.is_exclusive())) {
        let (m, w, lim) = admission::encode(r.mode);
        sql += &format!(
            "INSERT INTO {s} (lock_key, token, mode, weight, limit_n, held, fence, label, live_until)
             VALUES ('{key}', {}, {m}, {w}, {lim}, {}, {}, 'seed', {});",
            binary(r.token),
            u8::from(r.held),
            r.order,
            at(ends_in_ms(r))
        );
    }
    sql
}

/// The key's live rows: the lease row unless it is the gate, and the shares.
fn live(server: &MysqlServer, key: &str) -> BTreeSet<Live> {
    let out = server.sql(&format!(
        "SELECT HEX(token), 1, fence FROM {DATABASE}.holdfast_leases
          WHERE lock_key = '{key}' AND live_until > UTC_TIMESTAMP(6) AND token <> {GATE}
         UNION ALL
         SELECT HEX(token), held, fence FROM {DATABASE}.holdfast_shares
          WHERE lock_key = '{key}' AND live_until > UTC_TIMESTAMP(6)"
    ));
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let t = OwnerToken::from_hex(&f[0].to_lowercase()).map_or(0, |t| number(&t.to_bytes()));
            (t, f[1] == "1", f[2].parse().expect("fence"))
        })
        .collect()
}

/// Every case of the table through `MysqlBackend::try_acquire` (the
/// mutex's statements for an exclusive request, shared ones otherwise) on
/// the case's rows seeded into the real tables, twice: as a user with the
/// namespace's procedures (the shared grant's procedure decides the cases
/// without a live row, every key having one), and as a user without
/// `CREATE ROUTINE` (the shared transaction decides every case, keys
/// seeded as they come).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_store_passes_the_admission_table() {
    let server = MysqlServer::start();
    server.sql(&format!(
        "CREATE USER 'plain'@'127.0.0.1' IDENTIFIED BY 'plain-pw'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON {DATABASE}.* TO 'plain'@'127.0.0.1';"
    ));
    let plain_url = format!("mysql://plain:plain-pw@127.0.0.1:{}/{DATABASE}", server.port());
    for (url, procedures) in [(server.url(), true), (plain_url, false)] {
        let store = MysqlBackend::open_url(&url).await.expect("open");
        // The first use creates the tables.
        let warm = AcquireRequest::new(LockKey::new("admission/warm-up").expect("key"), OwnerToken::random(), TTL);
        store.try_acquire(&warm).await.expect("first acquire").expect("granted");
        store.release(&warm.key, warm.token).await.expect("release");
        let count = format!("SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = '{DATABASE}'");
        assert_eq!(server.sql(&count).trim(), "2", "the namespace's procedures");
        // A retry of the token's own live row (after a lost reply) keeps its fence.
        let leeway = Leeway { retry_takes_a_new_fence: false };
        let seed = |key: &str, case: &Case| drop(server.sql(&seed_sql(key, case, procedures)));
        run_table(&store, leeway, seed, |key| live(&server, key)).await;
    }
}
