//! holdfast's PostgreSQL store against its raw floor: the same statements
//! issued by a plain tokio-postgres client.
//!
//! ```text
//! cargo run --release -p holdfast-bench --features postgres --example pg_floor -- [URL] [SECONDS]
//! ```
//!
//! Without a URL it starts its own server (holdfast-testkit, fsync=off).
//! Prints uncontended cycles/s (acquire + release, one task) and the
//! contended hand-off latency (release start -> next holder's grant) with 4
//! workers on one key, each in its own client, for holdfast and the raw floor.
//! Both floors use prepared statements, as holdfast does by default: the
//! same-statements floor sends holdfast's own SQL; the minimal floor is a
//! hand-written lease row (upsert if expired, delete by token) without fences
//! or wake-ups.

use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use holdfast::Client;
use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, NoTls};

const ACQUIRE: &str = r#"WITH cur AS (
     SELECT token, fence, expires_at, wanted FROM "public"."holdfast_leases"
     WHERE key = $1 AND expires_at > clock_timestamp()
 ), f AS (
     UPDATE "public"."holdfast_leases_fence" SET value = value + 1
     WHERE id = 0 AND NOT EXISTS (SELECT 1 FROM cur)
     RETURNING value
 ), ins AS (
     INSERT INTO "public"."holdfast_leases" AS l (key, token, fence, label, acquired_at, expires_at, wanted)
     SELECT $1, $2, f.value, $4, clock_timestamp(), clock_timestamp() + $3::int8 * interval '1 millisecond', $6
     FROM f
     ON CONFLICT (key) DO UPDATE
         SET token = excluded.token, fence = excluded.fence, label = excluded.label,
             acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, wanted = excluded.wanted
         WHERE l.expires_at <= clock_timestamp()
     RETURNING l.fence
 ), w AS (
     UPDATE "public"."holdfast_leases" SET wanted = true
     WHERE key = $1 AND $5 AND token <> $2 AND expires_at > clock_timestamp()
       AND EXISTS (SELECT 1 FROM cur WHERE token <> $2)
     RETURNING 1
 )
 SELECT (SELECT fence FROM ins),
        (SELECT fence FROM cur WHERE token = $2),
        (SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::int8 FROM cur),
        EXISTS (SELECT 1 FROM w)"#;
const RELEASE: &str = r#"WITH d AS (
     DELETE FROM "public"."holdfast_leases" WHERE key = $1 AND token = $2
     RETURNING expires_at > clock_timestamp() AS live, wanted
 )
 SELECT d.live, CASE WHEN d.wanted THEN pg_notify($3, $1)::text END FROM d"#;

/// The minimal floor: a hand-written lease row without fences or wake-ups.
const MIN_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS holdfast_floor_min (
    key text PRIMARY KEY, token bytea NOT NULL, expires_at timestamptz NOT NULL)";
const MIN_ACQUIRE: &str = "INSERT INTO holdfast_floor_min AS l (key, token, expires_at)
    VALUES ($1, $2, clock_timestamp() + $3::int8 * interval '1 millisecond')
    ON CONFLICT (key) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at
    WHERE l.expires_at <= clock_timestamp()";
const MIN_RELEASE: &str = "DELETE FROM holdfast_floor_min WHERE key = $1 AND token = $2";

const WORKERS: usize = 4;
/// Short alternating rounds; the best of each is kept, so that bursts of load
/// from elsewhere on a shared machine hit every contender alike.
const ROUNDS: usize = 10;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or_default()
}

async fn raw_client(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, NoTls).await.expect("raw connect");
    tokio::spawn(conn);
    c
}

/// A plain client with holdfast's two statements prepared, as holdfast does by default.
struct Raw {
    c: tokio_postgres::Client,
    acquire: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
}

async fn raw(url: &str) -> Raw {
    let c = raw_client(url).await;
    let acquire = c
        .prepare_typed(ACQUIRE, &[Type::TEXT, Type::BYTEA, Type::INT8, Type::TEXT, Type::BOOL, Type::BOOL])
        .await
        .expect("prepare");
    let release = c.prepare_typed(RELEASE, &[Type::TEXT, Type::BYTEA, Type::TEXT]).await.expect("prepare");
    Raw { c, acquire, release }
}

/// One raw attempt (registering as a waiter if `wait`): Some(fence) if granted.
async fn raw_acquire(r: &Raw, key: &str, token: &[u8], wait: bool) -> Option<i64> {
    let (ttl, label, others) = (30_000i64, "raw", false);
    let rows = r.c.query(&r.acquire, &[&key, &token, &ttl, &label, &wait, &others]).await.expect("raw acquire");
    rows[0].get::<_, Option<i64>>(0)
}

async fn raw_release(r: &Raw, key: &str, token: &[u8], channel: &str) {
    r.c.query(&r.release, &[&key, &token, &channel]).await.expect("raw release");
}

async fn min_uncontended(pg_url: &str, secs: f64) -> f64 {
    let c = raw_client(pg_url).await;
    c.batch_execute(MIN_SCHEMA).await.expect("floor table");
    let acq = c.prepare_typed(MIN_ACQUIRE, &[Type::TEXT, Type::BYTEA, Type::INT8]).await.expect("prepare");
    let rel = c.prepare_typed(MIN_RELEASE, &[Type::TEXT, Type::BYTEA]).await.expect("prepare");
    let (start, mut n) = (Instant::now(), 0u64);
    let (key, ttl) = ("floor/uncontended-min", 30_000i64);
    while start.elapsed().as_secs_f64() < secs {
        let token = rand::random::<u128>().to_be_bytes().to_vec();
        let got = c.execute(&acq, &[&key, &token, &ttl]).await.expect("min acquire");
        assert_eq!(got, 1);
        c.execute(&rel, &[&key, &token]).await.expect("min release");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn holdfast_uncontended(url: &str, secs: f64) -> f64 {
    let c = Client::connect(url).await.expect("connect");
    let m = c.mutex("floor/uncontended-hf").ttl(Duration::from_secs(30));
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed().as_secs_f64() < secs {
        m.acquire().await.expect("acquire").release().await.expect("release");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn raw_uncontended(pg_url: &str, secs: f64, channel: &str) -> f64 {
    let c = raw(pg_url).await;
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed().as_secs_f64() < secs {
        let token = rand::random::<u128>().to_be_bytes();
        raw_acquire(&c, "floor/uncontended-raw", &token, true).await.expect("free key");
        raw_release(&c, "floor/uncontended-raw", &token, channel).await;
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// Workers loop acquire -> release on one key; each grant records the time
/// since the previous release started.
async fn holdfast_handoff(url: &str, secs: f64) -> (Vec<Duration>, u64) {
    let released: Arc<StdMutex<Option<Instant>>> = Arc::default();
    let samples: Arc<StdMutex<Vec<Duration>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..WORKERS {
        let c = Client::connect(url).await.expect("connect");
        let (released, samples) = (released.clone(), samples.clone());
        tasks.push(tokio::spawn(async move {
            let m = c.mutex("floor/contended-hf").ttl(Duration::from_secs(30));
            let mut n = 0u64;
            while Instant::now() < deadline {
                let g = m.acquire().await.expect("acquire");
                if let Some(r) = released.lock().unwrap().take() {
                    samples.lock().unwrap().push(r.elapsed());
                }
                n += 1;
                *released.lock().unwrap() = Some(Instant::now());
                g.release().await.expect("release");
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task");
    }
    let v = std::mem::take(&mut *samples.lock().unwrap());
    (v, total)
}

/// The raw floor of the hand-off: each worker has a statement connection and
/// a LISTEN connection; a busy attempt waits for a notification (or 100 ms).
async fn raw_handoff(pg_url: &str, secs: f64, channel: &str) -> (Vec<Duration>, u64) {
    let released: Arc<StdMutex<Option<Instant>>> = Arc::default();
    let samples: Arc<StdMutex<Vec<Duration>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..WORKERS {
        let c = raw(pg_url).await;
        let (lc, mut lconn) = tokio_postgres::connect(pg_url, NoTls).await.expect("listen connect");
        let notify = Arc::new(tokio::sync::Notify::new());
        let n2 = notify.clone();
        tokio::spawn(async move {
            let mut msgs = futures::stream::poll_fn(move |cx| lconn.poll_message(cx));
            while let Some(Ok(m)) = futures::StreamExt::next(&mut msgs).await {
                if let AsyncMessage::Notification(_) = m {
                    n2.notify_one();
                }
            }
        });
        lc.batch_execute(&format!("LISTEN \"{channel}\"")).await.expect("listen");
        let (released, samples, channel) = (released.clone(), samples.clone(), channel.to_owned());
        tasks.push(tokio::spawn(async move {
            let _keep = lc;
            let mut n = 0u64;
            while Instant::now() < deadline {
                let token = rand::random::<u128>().to_be_bytes();
                loop {
                    let notified = notify.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    if raw_acquire(&c, "floor/contended-raw", &token, true).await.is_some() {
                        break;
                    }
                    let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
                }
                if let Some(r) = released.lock().unwrap().take() {
                    samples.lock().unwrap().push(r.elapsed());
                }
                n += 1;
                *released.lock().unwrap() = Some(Instant::now());
                raw_release(&c, "floor/contended-raw", &token, &channel).await;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task");
    }
    let v = std::mem::take(&mut *samples.lock().unwrap());
    (v, total)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let given = args.next().filter(|a| a.starts_with("postgres"));
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let server = given.is_none().then(holdfast_testkit::servers::postgres::PostgresServer::start);
    let url = given.unwrap_or_else(|| server.as_ref().map(|s| s.url()).unwrap_or_default());
    // tokio-postgres does not know holdfast's options; the server's URL has only sslmode.
    let pg_url = url.split('?').next().unwrap_or(&url).to_owned() + "?sslmode=disable";
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    rt.block_on(async {
        // The channel holdfast uses for public.holdfast_leases (created by this first connect).
        let c = Client::connect(&url).await.expect("connect");
        drop(c);
        let channel = {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in "public.holdfast_leases".bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
            format!("holdfast_{h:016x}")
        };
        let warm = secs / 5.0;
        raw_uncontended(&pg_url, warm, &channel).await;
        holdfast_uncontended(&url, warm).await;
        // Alternating rounds, best of each, so that load from elsewhere hits both alike.
        let (mut raw, mut hf, mut min) = (0f64, 0f64, 0f64);
        for _ in 0..ROUNDS {
            raw = raw.max(raw_uncontended(&pg_url, secs / ROUNDS as f64, &channel).await);
            hf = hf.max(holdfast_uncontended(&url, secs / ROUNDS as f64).await);
            min = min.max(min_uncontended(&pg_url, secs / ROUNDS as f64).await);
        }
        println!(
            "uncontended cycles/s (best of {ROUNDS} alternating rounds): holdfast {hf:.0}  same-statements floor {raw:.0} \
             (ratio {:.2})  minimal upsert/delete floor {min:.0} (ratio {:.2})",
            hf / raw,
            hf / min
        );
        let (mut hv, hn) = holdfast_handoff(&url, secs).await;
        let (mut rv, rn) = raw_handoff(&pg_url, secs, &channel).await;
        let (hp50, hp99) = (pct(&mut hv, 0.5), pct(&mut hv, 0.99));
        let (rp50, rp99) = (pct(&mut rv, 0.5), pct(&mut rv, 0.99));
        println!(
            "contended hand-off ({WORKERS} workers, one key): holdfast p50 {hp50:?} p99 {hp99:?} ({:.0} grants/s)  \
             raw p50 {rp50:?} p99 {rp99:?} ({:.0} grants/s)  p50 ratio {:.2}",
            hn as f64 / secs,
            rn as f64 / secs,
            hp50.as_secs_f64() / rp50.as_secs_f64().max(1e-9)
        );
    });
    drop(server);
}
