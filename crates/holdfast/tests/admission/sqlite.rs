//! The admission table on SQLite: rows seeded into `holdfast_grants` as
//! `sql.rs` writes them (mode, weight and limit as `admission::encode`
//! stores them, expiry in ms of the host clock), the file's fence counter at
//! the table's highest order.

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use holdfast::backend::admission;
use holdfast::stores::sqlite::SqliteBackend;
use holdfast_testkit::admission_cases::{Case, MAX_ORDER, token};
use rusqlite::{Connection, params};

use super::{Leeway, Live, ends_in_ms, number, run_table};

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as i64
}

fn seed(conn: &Connection, key: &str, case: &Case) {
    conn.execute("UPDATE holdfast_fence SET value = ?1 WHERE id = 0 AND value < ?1", params![MAX_ORDER as i64])
        .expect("fence counter");
    conn.execute("DELETE FROM holdfast_grants WHERE key = ?1", params![key]).expect("clear");
    let now = now_ms();
    for s in &case.rows {
        let (mode, weight, limit) = admission::encode(s.mode);
        conn.execute(
            "INSERT INTO holdfast_grants
               (key, token, mode, weight, limit_n, held, fence, label, acquired_at_ms, until_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'seed', ?8, ?9)",
            params![key, token(s.token), mode, weight, limit, s.held, s.order as i64, now - 1, now + ends_in_ms(s)],
        )
        .expect("seed a row");
    }
}

fn live(conn: &Connection, key: &str) -> BTreeSet<Live> {
    let mut stmt = conn
        .prepare("SELECT token, held, fence FROM holdfast_grants WHERE key = ?1 AND until_ms > ?2")
        .expect("prepare");
    stmt.query_map(params![key, now_ms()], |r| {
        Ok((number(&r.get::<_, Vec<u8>>(0)?), r.get(1)?, r.get::<_, i64>(2)? as u64))
    })
    .expect("query")
    .map(|r| r.expect("row"))
    .collect()
}

/// Every case of the table through `SqliteBackend::try_acquire` on a file
/// seeded with the case's rows; the rows after match the rule too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_passes_the_admission_table() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("cases.db");
    let store = SqliteBackend::open_url(&format!("sqlite://{}", path.display())).await.expect("open");
    let conn = Connection::open(&path).expect("open the file beside the store");
    conn.busy_timeout(std::time::Duration::from_secs(5)).expect("busy timeout");
    run_table(&store, Leeway::default(), |key, case| seed(&conn, key, case), |key| live(&conn, key)).await;
}
